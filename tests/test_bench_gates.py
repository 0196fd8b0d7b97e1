"""Benchmark gates without timing assertions: the gate logic on synthetic
figures, the gates file, the report helpers, and one tiny real measurement
through `mtpcheck bench` (figures present and well-formed; speed figures and
their floors live in benchmarks/)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from mtpcheck.measurement import bench


def _row(depth, speedup, predicted, acc, c=0.5, v=1.0):
    return {"depth": depth, "tokens_per_s": 100.0 * speedup, "off_tokens_per_s": 100.0, "speedup": speedup,
            "predicted_speedup": predicted, "efficiency": speedup / predicted if predicted else float("nan"),
            "tokens_per_round": 1 + sum(acc), "mean_accepted": sum(acc), "acceptance_by_position": acc,
            "draft_cost_c": c, "verify_cost_v": v}


ROWS = [_row(1, 1.05, 1.10, [0.7]), _row(2, 1.30, 1.40, [0.9, 0.6]), _row(3, 1.20, 1.60, [0.8, 0.6, 0.3])]
GATES = {"compare_fail": "median:25%",
         "mlx": {"speedup_floor": {"structured": 1.2, "prose": 0.9}, "efficiency_floor": 0.85,
                 "acceptance_floor": {"structured": 0.75}, "speedup_drop": 0.25}}


def test_figures_take_the_best_depth_and_the_first_proposal():
    f = bench.figures(ROWS)
    assert f["best_depth"] == 2 and f["speedup"] == 1.30
    assert f["efficiency"] == pytest.approx(1.30 / 1.40)
    assert f["median_efficiency"] == pytest.approx(sorted(r["efficiency"] for r in ROWS)[1])
    assert (f["acceptance"], f["acceptance_depth"]) == (0.7, 1)


def test_gates_pass_and_fail_naming_figure_floor_and_run():
    results = bench.check_gates("mlx", "structured", ROWS, GATES, run="run-42")
    by = {g.figure: g for g in results}
    assert by["speedup"].passed and by["efficiency"].passed
    assert by["acceptance"].passed is False
    line = by["acceptance"].line()
    assert "acceptance" in line and "floor 0.75" in line and "run-42" in line and "FAILED" in line
    assert "mlx/structured depth 1" in line
    # prose: its own speedup floor, no acceptance floor (absent from the table)
    prose = {g.figure: g for g in bench.check_gates("mlx", "prose", ROWS, GATES, run="r")}
    assert prose["speedup"].floor == 0.9 and "acceptance" not in prose
    # a backend without a section is not gated; top-level keys are not backends
    assert bench.check_gates("other", "structured", ROWS, GATES, run="r") == []
    assert bench.check_gates("compare_fail", "structured", ROWS, GATES, run="r") == []


def test_a_figure_the_backend_cannot_give_is_not_gated():
    rows = [_row(1, 1.1, float("nan"), [0.5]), _row(2, 1.2, float("nan"), [0.6, 0.4])]
    eff = next(g for g in bench.check_gates("mlx", "structured", rows, GATES, run="r") if g.figure == "efficiency")
    assert eff.passed is None and eff.value is None
    assert "not applied" in eff.line()
    info = bench.extra_info(rows)
    json.dumps(info, allow_nan=False)  # JSON-safe: the missing prediction is null
    assert info["figures"]["predicted_speedup"] is None
    assert any("n/a" in line for line in bench.format_table(rows))


def test_regression_against_the_baseline_figures(tmp_path):
    ok = bench.check_regression("mlx", "structured", ROWS, {"speedup": 1.5}, GATES, run="r")
    assert ok[0].passed  # 1.30 >= 1.5 * 0.75
    bad = bench.check_regression("mlx", "structured", ROWS, {"speedup": 2.0}, GATES, run="r")
    assert bad[0].passed is False and "baseline 2.000" in bad[0].line() and "floor 1.5" in bad[0].line()
    assert bench.check_regression("mlx", "structured", ROWS, None, GATES, run="r") == []
    saved = tmp_path / "Linux-CPython-3.11-64bit" / "0001_baseline.json"
    saved.parent.mkdir()
    saved.write_text(json.dumps({"benchmarks": [{"name": "test_speculation[mlx-structured]",
                                                 "extra_info": {"figures": {"speedup": 1.3}}}]}))
    assert bench.baseline_figures(tmp_path) == {"test_speculation[mlx-structured]": {"speedup": 1.3}}
    assert bench.baseline_figures(tmp_path / "none") == {}


def test_the_gates_file():
    gates = bench.load_gates()
    from pytest_benchmark.utils import parse_compare_fail

    parse_compare_fail(gates["compare_fail"])
    mlx = gates["mlx"]
    assert mlx["efficiency_floor"] >= 0.85  # overhead at most 15% at the best depth
    assert set(mlx["acceptance_floor"]) == {"structured", "prose"}
    assert "structured" in mlx["speedup_floor"]
    for name in ("mlx-lm", "mlx-vlm"):
        assert name in gates


def test_parse_depths():
    assert bench.parse_depths("1-5") == (1, 2, 3, 4, 5)
    assert bench.parse_depths("1,3,5") == (1, 3, 5)
    assert bench.parse_depths("2-3,1") == (1, 2, 3)
    for bad in ("0-2", "3-1", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_depths(bad)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    paths = bench.plot("fake", {"structured": ROWS, "prose": ROWS[:2]}, tmp_path)
    assert set(paths) == {"acceptance", "speedup", "predicted_vs_realised"}
    for p in paths.values():
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_tiny_real_measurement_through_the_cli(tmp_path, capsys):
    """`mtpcheck bench` on the reference: tables, JSON report, gates applied.
    The only floors here are on acceptance (not a timing): a floor of 0
    passes, a floor above 1 fails naming the figure, the floor and the run."""
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    gates = tmp_path / "gates.toml"
    gates.write_text("[mlx]\nacceptance_floor = { structured = 0.0 }\n")
    args = parser.parse_args(["bench", "--depths", "1-2", "--reps", "1", "--max-tokens", "8", "--kinds",
                              "structured", "--out", str(tmp_path / "out"), "--gates", str(gates)])
    assert bench.run_bench(args) == 0
    out = capsys.readouterr().out
    assert "mlx / structured" in out and "acceptance by position" in out
    report = json.loads((tmp_path / "out" / "bench-mlx.json").read_text())
    rows = report["kinds"]["structured"]["rows"]
    assert [r["depth"] for r in rows] == [1, 2]
    for r in rows:
        assert len(r["acceptance_by_position"]) == r["depth"]
        assert all(0.0 <= a <= 1.0 for a in r["acceptance_by_position"])
        assert r["tokens_per_round"] >= 1.0
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("speedup", "predicted_speedup", "draft_cost_c", "verify_cost_v"))
    assert report["kinds"]["structured"]["gates"][0]["figure"] == "acceptance"
    assert report["kinds"]["structured"]["arms"]["0"]["tokens"] == [8]

    gates.write_text("[mlx]\nacceptance_floor = 1.01\n")
    assert bench.run_bench(args) == 1
    out = capsys.readouterr().out
    assert "gate FAILED: acceptance" in out and "floor 1.01" in out and "run mtpcheck bench mlx" in out


def test_sweep_interleaves_and_records_only_after_warmup():
    calls = []

    class Fake:
        def generate(self, req):
            from mtpcheck.contracts import GenerationResult, SpeculationReport

            d = req.speculation.num_draft_tokens if req.speculation.mode == "native_mtp" else 0
            calls.append(d)
            spec = SpeculationReport(requested=d > 0, used=d > 0, mode="native_mtp" if d else "off", runtime="fake",
                                     num_draft_tokens=d, rounds=2 if d else 0, accept_lens=[d, 0] if d else [],
                                     draft_lens=[d, d] if d else [], draft_time_s=0.001 * d, verify_time_s=0.002)
            return GenerationResult(tokens=[1] * 4, text="", finish_reason="length", speculation=spec)

    arms = bench.measure(Fake(), [1, 2], depths=(1, 2), reps=2, max_tokens=4, warmup=1)
    assert calls == [0, 1, 2] * 3
    assert [len(arms[d].seconds) for d in (0, 1, 2)] == [2, 2, 2]
    assert arms[2].acceptance_by_position() == [0.5, 0.5]
    assert arms[2].per_round() == 2.0


def test_summarise_pairs_repetitions_and_efficiency_is_the_modelled_share():
    """Off and on of one repetition ran back to back: a slow repetition (drift)
    moves neither the paired speedup nor the efficiency. Components that
    account for 90% of the speculative time give efficiency 0.9."""
    off, on = bench.Arm(0), bench.Arm(1)
    for s_off, s_on in ((1.0, 0.5), (3.0, 1.5), (1.0, 2.0)):  # the third repetition: a spike on the on arm
        off.seconds.append(s_off)
        off.tokens.append(10)
        off.rounds.append(0)
        off.draft_s.append(0.0)
        off.verify_s.append(0.0)
        on.seconds.append(s_on)
        on.tokens.append(10)
        on.rounds.append(5)
        on.accept_lens += [1] * 5
        on.draft_lens += [1] * 5
        on.draft_s.append(0.3 * s_on)
        on.verify_s.append(0.6 * s_on)
    (row,) = bench.summarise({0: off, 1: on})
    assert row["speedup"] == pytest.approx(2.0)  # paired: 2, 2, 0.5 (unpaired medians would give 0.67)
    assert row["tokens_per_round"] == 2.0
    assert row["efficiency"] == pytest.approx(0.9)
    assert row["acceptance_by_position"] == [1.0]


def test_a_backend_without_component_timings_has_no_prediction():
    off, on = bench.Arm(0), bench.Arm(2)
    for arm, rounds in ((off, 0), (on, 4)):
        arm.seconds.append(1.0)
        arm.tokens.append(8)
        arm.rounds.append(rounds)
        arm.draft_s.append(0.0)
        arm.verify_s.append(0.0)
    on.accept_lens += [1, 1, 1, 1]
    on.draft_lens += [2, 2, 2, 2]
    (row,) = bench.summarise({0: off, 2: on})
    assert row["speedup"] == 1.0 and row["acceptance_by_position"] == [1.0, 0.0]
    assert all(math.isnan(row[k]) for k in ("draft_cost_c", "verify_cost_v", "predicted_speedup", "efficiency"))
    assert "n/a" in bench.format_table([row])[-1]
