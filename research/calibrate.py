"""Calibration: correct backends pass, and the statistical tests' false-alarm
rates are what they claim. Writes docs/calibration.md.

1. Null suite runs: the reference engine (`--backend mlx`, the main job's
   fixture, or `toy`) with each acceptance rule (rejection, exact_match) and
   each draft kind (mtp, assistant; on toy also the twin assistant, the
   target drafting for itself: long accepted blocks, lookahead branches
   promoted and reused), against the whole suite under the `ci` profile over
   base seeds (`--mtp-seed`). Zero failures are expected. Lookahead on and off is exercised inside every run: the
   scheduler clauses run each request with lookahead on and off
   (LOOKAHEAD-EQUIV compares them, SCHED-INTERLEAVE draws it per example).
   Clauses that use no seed (greedy, stops, request and report clauses, all
   at temperature 0) give the same result under every seed; with
   `--seed-free-once` (the default) they run under the first seed only.
   Every statistical test records its p-value in the run's evidence; over
   the runs, each test's rate of p < 0.05 must not exceed 0.05 (per-test
   false-alarm rates, `suite_pvalues`; whether a test is at its level or
   below it is reported): the suite's own tests, on its own samples, at the
   `ci` sample sizes.
2. Null false-alarm rates of the DIST-EQUIV tests (rank G-test, PIT-KS) at a
   relaxed alpha (0.05), over >= 200 independent null runs whose observations
   come from real generate() + target_distributions() calls on the correct
   toy backend (every backend configuration x every sampling configuration
   of the suite). Each rate must lie within the binomial (Clopper-Pearson)
   interval: 0.05 inside the 95 % interval of the observed rate.

`python -m research.calibrate [--backend mlx] [--seeds 50] [--null-runs 240]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from mtpcheck.mutants.run import SEED_FREE, backend_args, catalogue_ids, suite_run
from research import ROOT

CONFIGS: dict[str, dict[str, str]] = {
    "rejection / mtp": {"acceptance": "rejection", "drafter": "mtp"},
    "rejection / assistant": {"acceptance": "rejection", "drafter": "assistant"},
    "exact_match / mtp": {"acceptance": "exact_match", "drafter": "mtp"},
    "exact_match / assistant": {"acceptance": "exact_match", "drafter": "assistant"},
    "rejection / assistant (twin)": {"acceptance": "rejection", "drafter": "assistant", "twin": "1"},
}
# The half-precision stand-in: the reference's target logits rounded through float16 / bfloat16
# on every path and moved by up to one ulp by their row in the forward chunk (jitter=1), so
# verify, plain and teacher-forced passes disagree as batched kernels do; declared as such.
HALF = {f"{dtype} / {k}": {**v, "logits": dtype, "jitter": "1"}
        for dtype in ("float16", "bfloat16") for k, v in CONFIGS.items() if "twin" not in v}
# the twin assistant is a toy-model option; the reference fixture has no twin
BACKEND_CONFIGS = {"toy": CONFIGS, "mlx": {k: v for k, v in CONFIGS.items() if "twin" not in v}, "mlx-half": HALF}
BACKEND_LABEL = {"toy": "the reference engine on toy models (`--mtp-backend=toy`)",
                 "mlx": "the reference engine on its shipped fixture (`--mtp-backend=mlx`, the main job's backend)",
                 "mlx-half": "the reference engine on its shipped fixture with its target logits rounded through "
                             "float16 or bfloat16 on every path and moved by up to one ulp by their row in the forward "
                             "chunk (`--mtp-backend=mlx --mtp-backend-option logits=float16 --mtp-backend-option "
                             "jitter=1`): a correct half-precision runtime whose passes disagree, declared as such"}
REGISTRY_NAME = {"mlx-half": "mlx"}
NULL_ALPHA = 0.05


# -- 1. the suite against correct backends ---------------------------------------------------


def suite_calibration(seeds: list[int], jobs: int, seed_free_once: bool = True, configs: dict | None = None,
                      clauses: list[str] | None = None, progress=print, backend: str = "toy",
                      sink=None, call_timeout: float = 120.0) -> list[dict]:
    """One suite run per (config, seed); returns one record per run, and hands
    each to `sink` as it finishes (a long calibration keeps what it ran)."""
    configs = configs or BACKEND_CONFIGS[backend]
    every = clauses or catalogue_ids()
    seeded = [c for c in every if c not in SEED_FREE] if seed_free_once else every
    # seed-major order: a calibration stopped early has covered every configuration
    tasks = [(name, seed, every if (i == 0 or not seed_free_once) else seeded)
             for i, seed in enumerate(seeds) for name in configs]
    with tempfile.TemporaryDirectory(prefix="mtpcheck-calibrate-") as tmp:
        def one(task):
            name, seed, cl = task
            path = Path(tmp) / f"{name.replace(' ', '').replace('/', '_')}-{seed}.json"
            code, data, tail, secs = suite_run(backend_args(configs[name], REGISTRY_NAME.get(backend, backend)), cl,
                                               path, "ci", seed, timeout=max(1800.0, 10 * call_timeout),
                                               call_timeout=call_timeout)
            rec = {"config": name, "seed": seed, "returncode": code, "seconds": secs, "clauses": {}, "evidence": {},
                   "error": "" if data is not None and code in (0, 1) else tail}
            for cid, row in (data or {}).get("clauses", {}).items():
                rec["clauses"][cid] = {"outcome": row["outcome"], "notes": row["notes"][:1]}
                if row["evidence"]:
                    rec["evidence"][cid] = row["evidence"]
            bad = [c for c, r in rec["clauses"].items() if r["outcome"] in ("failed", "error")]
            progress(f"{name:30} seed {seed:5}  {secs:6.1f} s  {'FAILED ' + ','.join(bad) if bad else 'ok'}"
                     + (f"  runner error: {rec['error'][-200:]}" if rec["error"] else ""))
            if sink:
                sink(rec)
            return rec

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, tasks))


ABSORBED = {  # evidence key -> what it counts
    ("GREEDY-EQUIV", "excused_near_ties"): "GREEDY-EQUIV near ties excused",
    ("DIST-ZERO", "boundary_tokens"): "DIST-ZERO boundary tokens counted",
    ("STOP-IN-BLOCK", "near_tie_not_judged"): "STOP-IN-BLOCK outputs left at a near tie",
    ("SEED-SPEC-EQUALS-PLAIN", "excused_float_flips"): "SEED-SPEC-EQUALS-PLAIN seeded flips excused",
    ("DIST-CONTEXT", "boundary_flips_excused"): "DIST-CONTEXT boundary tokens left out",
}


def precision_absorbed(suite_runs: list[dict]) -> dict[str, tuple[int, int]]:
    """What the precision rule excused or counted, over the runs: label -> (count, runs with any)."""
    out = {}
    for (cid, key), label in ABSORBED.items():
        per_run = []
        for r in suite_runs:
            n = 0
            for e in r["evidence"].get(cid, []):
                v = e.get(key)
                n += v if isinstance(v, int) and not isinstance(v, bool) else len(v) if isinstance(v, list) else int(bool(v))
            per_run.append(n)
        if sum(per_run):
            out[label] = (sum(per_run), sum(n > 0 for n in per_run))
    return out


# -- 2. null false-alarm rates ------------------------------------------------------------------

_WORKER: dict = {}


def _null_worker_init():
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")


def null_run(index: int, backend_name: str, config: str, generations: int, max_tokens: int = 48) -> dict:
    """One independent null run: `generations` seeded generations under one
    sampling configuration -> (G-test, PIT-KS) p-values at alpha 0.05."""
    from mtpcheck.backends.toy import load_toy
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.laws.stats import pit_ks, rank_gtest
    from mtpcheck.machinery.checks import observations
    from mtpcheck.machinery.configs import DIST_CONFIGS, request, seeded

    if backend_name not in _WORKER:
        b = load_toy(**CONFIGS[backend_name])
        _WORKER[backend_name] = (b, list(fixture_prompts(b).values()))
    backend, prompts = _WORKER[backend_name]
    obs, accepted = [], 0
    for r in range(generations):
        sp = seeded(DIST_CONFIGS[config], 10_000_000 + index * 1000 + r)  # disjoint seeds: independent runs
        prompt = prompts[r % len(prompts)]
        res = backend.generate(request(prompt, max_tokens, sp, {"mode": "native_mtp", "num_draft_tokens": 3}))
        accepted += res.speculation.accepted
        obs += observations(backend, prompt, [res], DIST_CONFIGS[config])
    g = rank_gtest(obs, alpha=NULL_ALPHA)
    ks = pit_ks(obs, rng_seed=index, alpha=NULL_ALPHA)
    return {"index": index, "backend": backend_name, "config": config, "n": g.n, "accepted": accepted,
            "g_p": g.p_value, "g_df": g.df, "ks_p": ks.p_value}


def null_calibration(n_runs: int, generations: int, jobs: int, progress=print) -> list[dict]:
    from mtpcheck.machinery.configs import DIST_CONFIGS

    backends = [b for b in CONFIGS if "twin" not in b]
    cells = [(b, c) for b in backends for c in DIST_CONFIGS]
    tasks = [(i, *cells[i % len(cells)], generations) for i in range(n_runs)]
    out = []
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=get_context("spawn"),
                             initializer=_null_worker_init) as pool:
        futures = [pool.submit(null_run, *t) for t in tasks]
        for i, f in enumerate(futures):
            out.append(f.result())
            if progress and (i + 1) % 20 == 0:
                progress(f"null runs: {i + 1}/{n_runs}")
    return out


def rate_row(name: str, pvalues: list[float], alpha: float = NULL_ALPHA) -> dict:
    """False alarms at `alpha` with a 95 % Clopper-Pearson interval. `within`:
    alpha inside the interval (the test is at its level); `not_above`: alpha
    at or above the interval's low end (the rate does not exceed alpha: what
    the false-failure budget needs)."""
    from scipy import stats

    k, n = sum(p < alpha for p in pvalues), len(pvalues)
    test = stats.binomtest(k, n, alpha)
    ci = test.proportion_ci(confidence_level=0.95, method="exact")
    return {"test": name, "alarms": k, "runs": n, "rate": k / n, "ci_low": ci.low, "ci_high": ci.high,
            "binom_p": test.pvalue, "within": bool(ci.low <= alpha <= ci.high), "not_above": bool(ci.low <= alpha),
            "pvalue_uniformity_ks": float(stats.kstest(pvalues, "uniform").pvalue)}


def suite_pvalues(suite_runs: list[dict]) -> dict[str, dict]:
    """Every statistical test's p-values over the suite runs, from the evidence
    the suite records (first stages only: an escalation is a fresh sample at
    its own share of alpha). A test that did not test (DIST-CONTEXT's pilot
    with no informative context: df 0, p = 1) is left out. A p-value that
    repeats exactly under the same seed in another configuration is the same
    sample (the plain path is the same engine whatever the speculative
    configuration, and exact_match speculation reproduces it): counted once,
    or the rate's interval would treat four copies as four runs."""
    out: dict[str, dict] = {}
    seen: set[tuple[str, int, int, float]] = set()  # (test, seed, its k-th p-value in the run, p)
    seed, kth = 0, {}

    def add(test: str, clause: str, p: float, conservative: bool = False):
        kth[test] = kth.get(test, 0) + 1
        if (test, seed, kth[test], float(p)) in seen:
            return
        seen.add((test, seed, kth[test], float(p)))
        out.setdefault(test, {"clause": clause, "conservative": conservative, "p": []})["p"].append(float(p))

    for r in suite_runs:
        ev, seed, kth = r["evidence"], r["seed"], {}
        for e in ev.get("DIST-EQUIV", []):
            first = e.get("stage1") or {"gtest_p": e["gtest"]["p_value"], "pit_ks_p": e["pit_ks"]["p_value"]}
            # over heterogeneous laws its chi-square reference is conservative (docs/statistics.md)
            add("DIST-EQUIV rank G-test", "DIST-EQUIV", first["gtest_p"], conservative=True)
            add("DIST-EQUIV PIT-KS", "DIST-EQUIV", first["pit_ks_p"])
        for e in ev.get("DIST-CONTEXT", []):
            for st in e.get("stages", []):
                if st.get("df", 0) > 0 and st["stage"] in ("pilot", "targeted"):
                    add(f"DIST-CONTEXT {st['stage']} G-test", "DIST-CONTEXT", st["p_value"])
        # SEED-INDEPENDENT: Bonferroni over its series' p-values (issue 24); both conservative
        for cid, kind in (("SEED-INDEPENDENT", "Bonferroni"), ("SEED-STREAMS-INDEPENDENT", "e-value"),
                          ("SEED-SAMPLES-INDEPENDENT", "Bonferroni")):
            for e in ev.get(cid, []):
                if "test" in e:
                    add(f"{cid} {kind}", cid, e["test"]["p_value"], conservative=True)
        # CONSTRAINT-LANGUAGE (issue 23): one multinomial G-test per path over identical laws, near its level
        for e in ev.get("CONSTRAINT-LANGUAGE", []):
            if "test" in e:
                add(f"CONSTRAINT-LANGUAGE G-test ({e['path']})", "CONSTRAINT-LANGUAGE", e["test"]["p_value"])
        # SEED-STREAMS-INDEPENDENT's role form (issue 24, item 2): its four tests, e-value conservative
        for e in ev.get("SEED-STREAMS-INDEPENDENT", []):
            for name, t in (e.get("tests") or {}).items():
                add(f"SEED-STREAMS-INDEPENDENT {name}", "SEED-STREAMS-INDEPENDENT", t["p_value"],
                    conservative=name.startswith("acceptances") or name.startswith("rank G"))
    return out


def coincidence_ratios(suite_runs: list[dict]) -> dict[str, tuple[int, float]]:
    """SEED-INDEPENDENT's coincidences pooled over the runs, by kind: (hits,
    expected under independence). The e-value p-values sit near 1 under the
    null; these totals check the null model itself (observed / expected ~ 1)."""
    tot: dict[str, list] = {}
    for r in suite_runs:
        for e in r["evidence"].get("SEED-INDEPENDENT", []):
            for key, d in e["test"].get("details", {}).items():
                if not isinstance(d, dict) or "hits" not in d:
                    continue
                kind = key.split(": ", 1)[-1]
                t = tot.setdefault(kind, [0, 0.0])
                t[0] += d["hits"]
                t[1] += d["expected"]
    return {k: (int(h), float(x)) for k, (h, x) in tot.items()}


# -- the report ----------------------------------------------------------------------------------


def _ranges(seeds: list[int]) -> str:
    """1..15, 40..44: sorted seeds as runs of consecutive numbers."""
    runs = []
    for s in seeds:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in runs)


def render(suite_runs: list[dict], null_runs: list[dict], meta: dict) -> str:
    title = "# Calibration: half precision" if meta.get("backend") == "mlx-half" else "# Calibration"
    lines = [title, "",
             "<!-- Generated by `python -m research.calibrate` (research/calibrate.py); do not edit. -->",
             "",
             "Generated by `python -m research.calibrate`; do not edit by hand. "
             + (meta.get("machines") or f"Machine: {meta['cpus']} CPUs, shared")
             + f"; wall time {meta['wall_s'] / 60:.0f} min.", ""]
    if suite_runs:
        seeds = sorted({r["seed"] for r in suite_runs})
        failures = [(r["config"], r["seed"], c) for r in suite_runs for c, x in r["clauses"].items()
                    if x["outcome"] in ("failed", "error")]
        errors = [r for r in suite_runs if r["error"]]
        lines += ["## Correct backends pass", "",
                  (f"A reduced run: clauses {', '.join(meta['clauses'])} only" if meta.get("clauses") else "The whole suite")
                  + f", profile `ci`, against {BACKEND_LABEL[meta.get('backend', 'toy')]}, {len(seeds)} base seeds "
                  f"(`--mtp-seed` {_ranges(seeds)}), {len(suite_runs)} suite runs: "
                  f"**{len(failures)} clause failures, {len(errors)} runner errors**."
                  + (f" {meta['note']}" if meta.get("note") else ""), "",
                  "Lookahead on and off runs inside every run (the scheduler clauses drive each request with lookahead "
                  "on and off and compare them). "
                  + (f"Clauses that use no seed ({', '.join(SEED_FREE)}: temperature 0 throughout) give the same result "
                     "under every seed and ran under the first seed of each configuration only."
                     if meta.get("seed_free_once") else "Every clause ran under every seed."), "",
                  "| backend (acceptance / drafter) | runs | clause results passed | failed | skipped (reason) | mean s/run |",
                  "|---|---|---|---|---|---|"]
        for name in dict.fromkeys(r["config"] for r in suite_runs):
            rs = [r for r in suite_runs if r["config"] == name]
            outs = [x for r in rs for x in r["clauses"].values()]
            skipped = sorted({f"{c}: {x['notes'][0] if x['notes'] else ''}" for r in rs for c, x in r["clauses"].items()
                              if x["outcome"] == "skipped"})
            lines.append(f"| {name} | {len(rs)} | {sum(x['outcome'] == 'passed' for x in outs)} | "
                         f"{sum(x['outcome'] in ('failed', 'error') for x in outs)} | {'; '.join(skipped) or '-'} | "
                         f"{sum(r['seconds'] for r in rs) / len(rs):.0f} |")
        if failures:
            lines += ["", "Failures: " + "; ".join(f"{c} seed {s}: {cl}" for c, s, cl in failures[:30])]
        if meta.get("replaced"):
            lines += ["", f"**{len(meta['replaced'])} runs were rerun after a fix and stand here as rerun**: "
                      + "; ".join(f"{r['config']} seed {r['seed']} (had failed {', '.join(r['failed']) or 'nothing'})"
                                  for r in meta["replaced"]) + ". " + meta.get("replaced_why", "")]
        # evidence: how far from their thresholds the correct backends stayed
        dist = [e for r in suite_runs for e in r["evidence"].get("DIST-EQUIV", [])]
        if dist:
            gp = sorted(e["gtest"]["p_value"] for e in dist)
            kp = sorted(e["pit_ks"]["p_value"] for e in dist)
            lines += ["", f"DIST-EQUIV at the suite's alpha ({dist[0]['gtest']['alpha']:.3g} per test): over {len(dist)} "
                      f"tests the smallest rank G-test p-value was {gp[0]:.3g} and the smallest PIT-KS p-value {kp[0]:.3g}; "
                      f"median n = {sorted(e['gtest']['n'] for e in dist)[len(dist) // 2]} observations."]
        fresh = [e.get("max_law_difference", 0.0) for r in suite_runs for e in r["evidence"].get("DRAFT-FRESH", [])]
        if fresh:
            lines += ["", f"DRAFT-FRESH: the largest difference between a round's first draft law and a fresh "
                      f"prefill's was {max(fresh):.3g} (tolerance 1e-3) over {len(fresh)} tests."]
        absorbed = precision_absorbed(suite_runs)
        if absorbed:
            lines += ["", "Float flips the precision rule absorbed in these runs (laws.precision; each would have failed "
                      "an exact check): " + "; ".join(f"{k}: {n} in {runs} runs" for k, (n, runs) in absorbed.items())
                      + "."]
        pvals = suite_pvalues(suite_runs)
        if pvals:
            lines += ["", "## Per-test false-alarm rates in these runs", "",
                      f"Each statistical test's p-values over the {len(suite_runs)} runs above, from the evidence the "
                      f"suite recorded (its own tests on its own `ci` samples; first stages only), read at a relaxed "
                      f"alpha = {NULL_ALPHA}, with the 95 % Clopper-Pearson interval of each rate. `not above`: "
                      f"{NULL_ALPHA} at or above the interval's low end, so the test does not alarm more often than "
                      f"it claims - what the run's false-failure budget needs, and what this calibration requires of "
                      f"every test. `at level`: {NULL_ALPHA} inside the interval; a test below its level is safe "
                      "and spends power: the rank G-test, whose chi-square reference is conservative when the pooled "
                      "laws differ between contexts (docs/statistics.md), and the e-value tests (p = min(1, 1/E), "
                      "near 1 under the null), are so by construction. Each run's DIST-EQUIV and DIST-CONTEXT "
                      "subtests draw fresh samples per configuration, so a run gives one p-value per configuration.",
                      "", "| test | clause | p-values | p < 0.05 | rate | 95 % interval | not above | at level | "
                      "smallest p | median p | KS of the p-values vs U(0,1), p |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for name, t in pvals.items():
                x = rate_row(name, t["p"])
                ps = sorted(t["p"])
                level = "yes" if x["within"] else ("below (by construction)" if t["conservative"] else "below")
                lines.append(f"| {name} | {t['clause']} | {x['runs']} | {x['alarms']} | {x['rate']:.3f} | "
                             f"[{x['ci_low']:.3f}, {x['ci_high']:.3f}] | {'yes' if x['not_above'] else '**no**'} | "
                             f"{level} | {ps[0]:.3g} | {ps[len(ps) // 2]:.3g} | "
                             + (f"{x['pvalue_uniformity_ks']:.3g}" if "e-value" not in name else "-") + " |")
            ratios = coincidence_ratios(suite_runs)
            if ratios:
                lines += ["", "SEED-INDEPENDENT's null model, pooled over the runs (coincidences observed / expected "
                          "under independence from the target laws): "
                          + "; ".join(f"{k}: {h} / {x:.1f} = {h / x:.3f}" for k, (h, x) in ratios.items() if x > 0) + "."]
    if null_runs:
        rows = [rate_row("rank G-test", [r["g_p"] for r in null_runs]), rate_row("PIT-KS", [r["ks_p"] for r in null_runs])]
        ns = sorted(r["n"] for r in null_runs)
        lines += ["", "## Null false-alarm rates", "",
                  f"{len(null_runs)} independent null runs (disjoint seeds) on the correct toy backend, cycling over "
                  f"{len({r['backend'] for r in null_runs})} backend configurations x {len({r['config'] for r in null_runs})} "
                  f"sampling configurations; each run pools the observations (token, target law from "
                  f"target_distributions()) of {meta['generations']} real generate() calls of up to 48 tokens "
                  f"(n = {ns[0]}..{ns[-1]} observations, median {ns[len(ns) // 2]}), tested at alpha = {NULL_ALPHA}.", "",
                  "| test | false alarms | runs | rate | 95 % Clopper-Pearson interval | 0.05 inside | binomial test p | "
                  "KS of the p-values vs U(0,1), p |", "|---|---|---|---|---|---|---|---|"]
        for x in rows:
            lines.append(f"| {x['test']} | {x['alarms']} | {x['runs']} | {x['rate']:.3f} | [{x['ci_low']:.3f}, "
                         f"{x['ci_high']:.3f}] | {'yes' if x['within'] else '**no**'} | {x['binom_p']:.3g} | "
                         f"{x['pvalue_uniformity_ks']:.3g} |")
        by = {}
        for r in null_runs:
            by.setdefault(r["config"], []).append(r)
        lines += ["", "Per sampling configuration (alarms / runs): "
                  + "; ".join(f"{c}: G {sum(r['g_p'] < NULL_ALPHA for r in rs)}/{len(rs)}, KS "
                              f"{sum(r['ks_p'] < NULL_ALPHA for r in rs)}/{len(rs)}" for c, rs in by.items()) + ".",
                  "", "The rank G-test refers G (Williams-corrected) to chi-square; with heterogeneous laws across "
                  "contexts its reference is conservative (mtpcheck.laws.stats.rank_gtest), so a rate somewhat "
                  "below alpha is expected. KS on the randomized PIT is exact."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    p = argparse.ArgumentParser(prog="python -m research.calibrate")
    p.add_argument("--backend", choices=sorted(BACKEND_CONFIGS), default="mlx",
                   help="suite runs against the reference fixture (mlx, the main job's) or toy models")
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--call-timeout", type=float, default=120.0,
                   help="seconds a backend call may take (--mtp-timeout; the suite's default 120): raise it where the "
                        "runs share their CPUs, so a starved call is not a runner failure")
    p.add_argument("--null-runs", type=int, default=240)
    p.add_argument("--generations", type=int, default=20, help="generate() calls per null run")
    p.add_argument("--every-seed", action="store_true", help="run seed-free clauses under every seed too")
    p.add_argument("--skip-suite", action="store_true")
    p.add_argument("--skip-null", action="store_true")
    p.add_argument("--configs", help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--clauses", help="comma-separated clause ids (a reduced run; default: every clause)")
    p.add_argument("--out", default=str(ROOT / "docs" / "calibration.md"))
    p.add_argument("--json", help="also write the raw runs as JSON")
    p.add_argument("--reuse", action="append", default=[], metavar="JSON",
                   help="runs from an earlier --json (or its .runs.jsonl) to include (repeatable); a --json's wall "
                        "time is added")
    p.add_argument("--replace", action="append", default=[], metavar="JSON",
                   help="runs from a --json rerun after a fix: each replaces the run of the same config and seed, "
                        "and the page lists what the replaced run had failed (repeatable)")
    p.add_argument("--replaced-why", default="", help="one sentence on the fix, for the page")
    p.add_argument("--machines", default="", help="the machines the runs came from, for the page (default: this one)")
    p.add_argument("--note", default="", help="one more sentence for the page, after the run counts")
    p.add_argument("--earlier-wall-s", type=float, default=0.0,
                   help="wall time of the runs reused from .runs.jsonl files (they do not record it)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    known = BACKEND_CONFIGS[args.backend]
    names = [k.strip() for k in args.configs.split(",")] if args.configs else list(known)
    bad = [k for k in names if k not in known]
    if bad:
        p.error(f"--configs: {', '.join(bad)} not a configuration of {args.backend}: {', '.join(known)}")
    configs = {k: known[k] for k in names}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    clauses = [c.strip() for c in args.clauses.split(",")] if args.clauses else None
    lock = threading.Lock()

    def sink(rec):  # one JSON line per finished run, beside --json
        if args.json:
            with lock, open(args.json + ".runs.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")

    suite_runs = [] if args.skip_suite else suite_calibration(seeds, args.jobs, not args.every_seed, configs,
                                                              clauses=clauses, backend=args.backend, sink=sink,
                                                              call_timeout=args.call_timeout)
    null_runs = [] if args.skip_null else null_calibration(args.null_runs, args.generations, args.jobs)
    earlier = args.earlier_wall_s
    for path in args.reuse:
        if path.endswith(".jsonl"):  # the runs a calibration finished before it was stopped
            suite_runs = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()] + suite_runs
            continue
        old = json.loads(Path(path).read_text())
        suite_runs, null_runs = old["suite"] + suite_runs, old["null"] + null_runs
        earlier += old["meta"]["wall_s"]
        args.generations = old["meta"]["generations"] if old["null"] else args.generations
    replaced = []
    for path in args.replace:  # runs rerun after a fix stand in for the same (config, seed), and the page says so
        rerun = json.loads(Path(path).read_text())
        new = {(r["config"], r["seed"]): r for r in rerun["suite"]}
        for i, r in enumerate(suite_runs):
            if (r["config"], r["seed"]) in new:
                again = new[(r["config"], r["seed"])]
                # the same clauses as the run it replaces (a first-seed rerun also ran the seed-free ones)
                again = {**again, "clauses": {c: x for c, x in again["clauses"].items() if c in r["clauses"]},
                         "evidence": {c: x for c, x in again["evidence"].items() if c in r["clauses"]}}
                replaced.append({"config": r["config"], "seed": r["seed"],
                                 "failed": [c for c, x in r["clauses"].items() if x["outcome"] in ("failed", "error")]})
                suite_runs[i] = again
        earlier += rerun["meta"]["wall_s"]
    meta = {"cpus": os.cpu_count(), "wall_s": time.perf_counter() - t0 + earlier, "generations": args.generations,
            "seed_free_once": not args.every_seed, "clauses": clauses, "call_timeout": args.call_timeout, "backend": args.backend,
            "replaced": replaced, "replaced_why": args.replaced_why, "machines": args.machines, "note": args.note}
    Path(args.out).write_text(render(suite_runs, null_runs, meta))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "suite": suite_runs, "null": null_runs}, indent=1) + "\n")
    print(f"wrote {args.out}")
    failed = any(x["outcome"] in ("failed", "error") for r in suite_runs for x in r["clauses"].values())
    errors = any(r["error"] for r in suite_runs)
    off = null_runs and not all(rate_row(t, [r[k] for r in null_runs])["within"] for t, k in (("g", "g_p"), ("ks", "ks_p")))
    off = off or not all(rate_row(n, t["p"])["not_above"] for n, t in suite_pvalues(suite_runs).items())
    return 1 if failed or errors or off else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
