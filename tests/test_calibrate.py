"""The calibration's per-test false-alarm rates: p-values are read from the
evidence the suite records, and a rate that does not fit its level fails."""

import numpy as np

from research import calibrate
from research.calibrate import coincidence_ratios, rate_row, render, suite_pvalues


def _run(rng, seed, g_p=None):
    dist = [{"config": c, "gtest": {"p_value": 0.0, "alpha": 3e-8, "n": 1000}, "pit_ks": {"p_value": 0.0},
             "stage1": {"gtest_p": float(rng.uniform()) if g_p is None else g_p, "pit_ks_p": float(rng.uniform())}}
            for c in ("temperature", "top_k")]
    ctx = [{"config": "top_k", "stages": [
        {"stage": "pilot", "p_value": 1.0, "df": 0},  # no informative context: not a test
        {"stage": "targeted", "p_value": float(rng.uniform()), "df": 6}]}]
    ind = [{"test": {"p_value": 1.0, "details": {"s,s+1 lag 0: tokens agree": {"hits": 3, "expected": 2.5},
                                                 "s,s+1 lag 1: tokens agree": {"hits": 2, "expected": 2.5}}}}]
    return {"config": "rejection / mtp", "seed": seed, "returncode": 0, "seconds": 1.0, "error": "",
            "clauses": {"DIST-EQUIV": {"outcome": "passed", "notes": []}},
            "evidence": {"DIST-EQUIV": dist, "DIST-CONTEXT": ctx, "SEED-INDEPENDENT": ind}}


def test_pvalues_come_from_first_stages_and_skip_untested_stages():
    rng = np.random.default_rng(1)
    runs = [_run(rng, s) for s in range(5)]
    pv = suite_pvalues(runs)
    assert len(pv["DIST-EQUIV rank G-test"]["p"]) == 10
    assert pv["DIST-EQUIV rank G-test"]["p"][0] == runs[0]["evidence"]["DIST-EQUIV"][0]["stage1"]["gtest_p"]
    assert "DIST-CONTEXT pilot G-test" not in pv and len(pv["DIST-CONTEXT targeted G-test"]["p"]) == 5
    assert pv["SEED-INDEPENDENT Bonferroni"]["conservative"] is True
    assert coincidence_ratios(runs) == {"tokens agree": (25, 25.0)}


def test_a_test_that_alarms_too_often_does_not_fit():
    rng = np.random.default_rng(2)
    good = rate_row("t", list(rng.uniform(size=400)))
    bad = rate_row("t", list(rng.uniform(size=400) ** 3))  # p-values pushed towards 0: too many alarms
    assert good["within"] and good["not_above"] and not bad["within"] and not bad["not_above"]
    # a test that never alarms does not exceed its level, and is not at it
    never = rate_row("t", [1.0] * 400)  # an e-value test that never alarms passes the gate
    assert never["not_above"] and not never["within"]


def test_the_report_says_so():
    rng = np.random.default_rng(3)
    runs = [_run(rng, s, g_p=0.001) for s in range(40)]
    text = render(runs, [], {"cpus": 2, "wall_s": 60, "generations": 20, "seed_free_once": True, "clauses": None,
                             "backend": "mlx"})
    assert "| DIST-EQUIV rank G-test | DIST-EQUIV | 80 | 80 | 1.000 |" in text and "**no**" in text
    assert "shipped fixture" in text


def test_a_rerun_after_a_fix_replaces_its_run_and_the_page_says_so(tmp_path):
    import json

    from research.calibrate import main

    rng = np.random.default_rng(4)
    runs = [_run(rng, s) for s in range(3)]
    runs[1]["clauses"]["DIST-EQUIV"] = {"outcome": "failed", "notes": ["AssertionError: zero"]}
    again = _run(rng, 1)
    meta = {"wall_s": 10.0, "generations": 20}
    (tmp_path / "all.json").write_text(json.dumps({"meta": meta, "suite": runs, "null": []}))
    (tmp_path / "again.json").write_text(json.dumps({"meta": meta, "suite": [again], "null": []}))
    out = tmp_path / "cal.md"
    code = main(["--skip-suite", "--skip-null", "--reuse", str(tmp_path / "all.json"), "--replace",
                 str(tmp_path / "again.json"), "--replaced-why", "The fix.", "--out", str(out)])
    text = out.read_text()
    assert code == 0 and "**0 clause failures" in text
    assert "1 runs were rerun after a fix" in text and "seed 1 (had failed DIST-EQUIV)" in text and "The fix." in text


def test_a_p_value_repeated_under_the_same_seed_is_one_sample():
    """The plain path is the same engine in every configuration: its p-value
    under one seed repeats exactly in each, and counts once; two subtests of
    one run with equal p-values are two samples."""
    rng = np.random.default_rng(5)
    runs = [_run(rng, 1, g_p=0.2), _run(rng, 1, g_p=0.2), _run(rng, 2, g_p=0.2)]
    runs[1]["config"] = "exact_match / mtp"
    assert len(suite_pvalues(runs)["DIST-EQUIV rank G-test"]["p"]) == 4  # seeds 1 and 2, two subtests each


def test_the_call_timeout_reaches_each_suite_run(monkeypatch, tmp_path):
    """Runs that share their CPUs starve a call past the suite's 120 s: --call-timeout
    raises what each backend call may take, and the whole run's limit with it."""
    import subprocess

    from mtpcheck.mutants import run as mutants_run

    seen = []

    def fake(cmd, **kw):
        seen.append((cmd, kw["timeout"]))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(mutants_run.subprocess, "run", fake)
    calibrate.suite_calibration([1], 1, configs={"c": {}}, clauses=["REQ-BLOCK"], backend="toy",
                                progress=lambda _: None, call_timeout=600)
    (cmd, whole), = seen
    assert "--mtp-timeout=600" in cmd and whole == 6000
    seen.clear()
    calibrate.suite_calibration([1], 1, configs={"c": {}}, clauses=["REQ-BLOCK"], backend="toy",
                                progress=lambda _: None)
    assert "--mtp-timeout=120" in seen[0][0] and seen[0][1] == 1800
