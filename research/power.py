"""Power of the statistical clauses, measured on mutants; and the same
mutants side by side with the L2-convergence heuristic of vLLM's rejection
sampler test. Writes docs/power.md.

A. The suite's setting. For each mutant (and the correct backend), a pool of
   seeded generations on the toy backend (the suite's `temperature`
   sampling configuration, depth 3, up to 48 tokens), every emitted token
   paired with its target law from target_distributions(). Runs of n
   observations are drawn from the pool (whole generations, in random order,
   cut at n) and tested with the suite's DIST-EQUIV tests at the suite's
   per-test alpha (SUITE_ALPHA / STAT_SUBTESTS): detection rate vs n.

B. One position, vocabulary 10, one proposal (k = 1): vLLM's setting. p and q
   come from vLLM's generator (softmax of U(0,1) logits), seed 0. Each
   mutant is its acceptance rule from the zoo; the law of the first emitted
   token is computed exactly by running the rule's verify on every cell of
   its uniforms (mtpcheck.laws.exact.verify_law), and n emitted tokens are n
   draws from it. Three tests at the same false-alarm rate (alpha = 0.01):
   the rank G-test, PIT-KS, and vLLM's heuristic - empirical pdfs from
   samples of five sizes geometric from 10 to N (vLLM: N = 100,000, sizes
   10, 100, .., 100,000, 111,110 samples in all; a smaller N keeps the first
   size 10, as vLLM's test does); it passes when the L2 distance to the target
   shrinks more than `multiplier` times faster from the first size to the
   last than the mean L2 distance to 100 random reference laws (torch.dist
   of the [100, V] references against the pdf, divided by 100; vLLM's
   multiplier is 20). Its multiplier is calibrated here to a 1 % false-alarm
   rate on the correct rule. Samples needed = the smallest sample total at
   which a test detects the mutant with probability >= 0.9.

`python -m research.power`.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
import time
import types
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from mtpcheck.mutants import MUTANTS
from research import ROOT

ENGINE_MUTANTS = ["argmax-verification", "onehot-q-acceptance", "lenient-acceptance", "residual-from-p"]
RULE_MUTANTS = ["argmax-verification", "onehot-q-acceptance", "typical-acceptance", "lenient-acceptance",
                "residual-from-p", "unnormalised-residual"]
N_GRID = [100, 200, 400, 800, 1600, 3200, 6400]
POWER_TARGET = 0.9
SIDE_ALPHA = 0.01
VLLM_MULTIPLIER = 20.0
VLLM_N = 100_000
TOTALS = [10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
          1_000_000, 2_000_000, 5_000_000, 10_000_000]


# -- A. pools of real observations ------------------------------------------------------------


def pool(name: str | None, config: str, generations: int, seed0: int, max_tokens: int = 48,
         base: str = "toy") -> dict:
    """Seeded generations with their target laws, on the base backend (toy, or
    mlx: the reference fixture) or the mutant `name` built on it."""
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    from mtpcheck.backends import load_backend
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery.configs import DIST_CONFIGS, request, seeded
    from mtpcheck.mutants import load_mutant

    backend = load_mutant(name, base) if name and name != "correct" else load_backend(base, {})
    prompts = list(fixture_prompts(backend).values())
    sp0 = DIST_CONFIGS[config]
    gens, accepted, drafted = [], 0, 0
    for r in range(generations):
        prompt = prompts[r % len(prompts)]
        res = backend.generate(request(prompt, max_tokens, seeded(sp0, seed0 + r), {"mode": "native_mtp", "num_draft_tokens": 3}))
        laws = backend.target_distributions(prompt, res.tokens, sp0)
        gens.append((np.array(res.tokens), np.asarray(laws)))
        accepted, drafted = accepted + res.speculation.accepted, drafted + res.speculation.drafted
    return {"name": name or "correct", "gens": gens, "acceptance": accepted / max(drafted, 1)}


def draw_run(gens: list, n: int, rng: np.random.Generator):
    from mtpcheck.laws.stats import ObservationBatch

    toks, probs, total = [], [], 0
    for i in rng.permutation(len(gens)):
        t, p = gens[i]
        toks.append(t)
        probs.append(p)
        total += len(t)
        if total >= n:
            break
    return ObservationBatch(np.concatenate(toks)[:n], np.concatenate(probs)[:n])


def rank_tv(gens: list) -> float:
    """TV between observed and expected rank-bin frequencies over the whole pool
    (what the rank G-test sees; includes sampling noise ~ sqrt(bins / n))."""
    from mtpcheck.laws.stats import ObservationBatch, rank_gtest

    g = rank_gtest(ObservationBatch(np.concatenate([t for t, _ in gens]), np.concatenate([p for _, p in gens])))
    o, e = np.array(g.details["observed"]), np.array(g.details["expected"])
    return float(0.5 * np.abs(o - e).sum() / o.sum()), g.n


def engine_power(pools: list[dict], reps: int, alpha: float) -> list[dict]:
    from mtpcheck.laws.stats import pit_ks, rank_gtest

    rows = []
    for pl in pools:
        rng = np.random.default_rng(7)
        tv, n_pool = rank_tv(pl["gens"])
        row = {"name": pl["name"], "acceptance": pl["acceptance"], "pool": n_pool, "rank_tv": tv, "g": {}, "ks": {}, "tv99": {}}
        for n in N_GRID:
            if n > n_pool:
                continue
            g_hits = ks_hits = 0
            for r in range(reps):
                obs = draw_run(pl["gens"], n, rng)
                g = rank_gtest(obs, alpha=alpha)
                g_hits += not g.passed
                ks_hits += not pit_ks(obs, rng_seed=r, alpha=alpha).passed
                row["tv99"][n] = g.detectable_tv
            row["g"][n], row["ks"][n] = g_hits / reps, ks_hits / reps
        rows.append(row)
    return rows


# -- B. one position, vLLM's heuristic ----------------------------------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def vllm_probs(rng: np.random.Generator, vocab: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's _CorrectnessTestHelper.generate_probs_for_test: softmax(rand(V)) for draft and target."""
    q, p = softmax(rng.random(vocab)), softmax(rng.random(vocab))
    return p, q


def rule_of(name: str | None):
    from mtpcheck.engine.acceptance import get_rule

    holder = types.SimpleNamespace(rule=get_rule("rejection"))
    if name:
        MUTANTS[name].apply(holder)
    return holder.rule


def first_token_law(rule, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact law of the first emitted token of one k=1 block: the proposal when
    accepted, else the correction (the bonus is not counted, as in vLLM's test)."""
    from mtpcheck.laws.exact import verify_law

    out = np.zeros(len(p))
    for d in np.flatnonzero(q > 0):
        for (acc, tok), w in verify_law(rule, np.stack([p, p]), q[None], [int(d)]).items():
            out[d if acc == 1 else tok] += q[d] * w
    return out / out.sum()


def l2_sizes(n_last: int) -> list[int]:
    """vLLM's sample sizes [10, 100, 1000, 10000, 100000] for n_last = 100,000: five, geometric from 10."""
    return [int(round(x)) for x in np.geomspace(10, n_last, 5)]


def l2_statistic(law: np.ndarray, p: np.ndarray, n_last: int, rng: np.random.Generator, refs: int = 100) -> float:
    """vLLM's test statistic: (d_target(first) / d_target(last)) / (d_ref(first) / d_ref(last)) over the sample
    sizes l2_sizes(n_last); vLLM asserts it exceeds 20."""
    ref = softmax(rng.random((refs, len(p))))
    sizes = l2_sizes(n_last)
    d_t, d_r = [], []
    for n in sizes:
        pdf = rng.multinomial(n, law) / n  # torch.histogram(..., density=True) with unit bins
        d_t.append(float(np.linalg.norm(p - pdf)))
        d_r.append(float(np.linalg.norm(ref - pdf)) / refs)
    return (d_t[0] / max(d_t[-1], 1e-300)) / (d_r[0] / d_r[-1])


def l2_total(n_last: int) -> int:
    return sum(l2_sizes(n_last))


def side_by_side(reps: int, null_reps: int, alpha: float, seed: int = 0, suite_alpha: float = 1.25e-7) -> dict:
    from mtpcheck.laws.stats import ObservationBatch, pit_ks, rank_gtest

    rng = np.random.default_rng(seed)
    p, q = vllm_probs(rng)
    laws = {name: first_token_law(rule_of(name), p, q) for name in RULE_MUTANTS}
    correct = first_token_law(rule_of(None), p, q)
    out = {"p": p, "q": q, "tv_pq": float(0.5 * np.abs(p - q).sum()), "correct_error": float(np.abs(correct - p).max()),
           "rows": [], "l2_thresholds": {}, "vllm": {}}
    vocab = len(p)
    # the heuristic's threshold at each schedule, calibrated on the correct rule
    lasts = [n for n in TOTALS if n >= 100]
    for n_last in lasts:
        null = np.array([l2_statistic(correct, p, n_last, rng) for _ in range(null_reps)])
        out["l2_thresholds"][n_last] = float(np.quantile(null, alpha))
        if n_last == VLLM_N:
            out["vllm"]["false_alarm"] = float((null <= VLLM_MULTIPLIER).mean())
            out["vllm"]["null_reps"] = null_reps

    def gtest_power(law, n, a=alpha):
        hits_g = hits_k = 0
        for r in range(reps):
            toks = rng.choice(vocab, size=n, p=law)
            obs = ObservationBatch(toks, np.broadcast_to(p, (n, vocab)))
            hits_g += not rank_gtest(obs, alpha=a).passed
            hits_k += not pit_ks(obs, rng_seed=r, alpha=a).passed
        return hits_g / reps, hits_k / reps

    null_g = gtest_power(correct, 2_000)
    out["null_rates"] = {"g": null_g[0], "ks": null_g[1], "n": 2_000}
    for name in RULE_MUTANTS:
        law = laws[name]
        row = {"name": name, "tv": float(0.5 * np.abs(law - p).sum()), "g": {}, "ks": {}, "l2": {}, "g_suite": {}}
        for n in TOTALS:
            if n > 200_000:
                break
            if row["g"] and list(row["g"].values())[-1] >= 1.0 and list(row["ks"].values())[-1] >= POWER_TARGET:
                break
            row["g"][n], row["ks"][n] = gtest_power(law, n)
        for n in TOTALS:  # the G-test at the suite's own per-test alpha
            if n > 200_000:
                break
            row["g_suite"][n] = gtest_power(law, n, suite_alpha)[0]
            if row["g_suite"][n] >= 1.0:
                break
        for n_last in lasts:
            stats_ = np.array([l2_statistic(law, p, n_last, rng) for _ in range(reps)])
            row["l2"][l2_total(n_last)] = float((stats_ <= out["l2_thresholds"][n_last]).mean())
            if n_last == VLLM_N:
                row["vllm_power"] = float((stats_ <= VLLM_MULTIPLIER).mean())
            if n_last >= VLLM_N and row["l2"][l2_total(n_last)] >= 1.0:
                break
        out["rows"].append(row)
    return out


def needed(curve: dict, target: float = POWER_TARGET) -> int | None:
    """Samples for `target` detection: log-linear interpolation between the
    grid points around the first one that reaches it (None: never reached)."""
    pts = sorted(curve.items())
    for i, (n, v) in enumerate(pts):
        if v >= target:
            if i == 0 or v == pts[i - 1][1]:
                return n
            n0, v0 = pts[i - 1]
            f = (target - v0) / (v - v0)
            return int(round(math.exp(math.log(n0) + f * (math.log(n) - math.log(n0)))))
    return None


# -- the report ----------------------------------------------------------------------------------------


def _fmt_n(n: int | None, limit: int | None = None, low: int | None = None) -> str:
    """A sample count; '> limit' when never reached, '<= low' when reached at the grid's first point."""
    if n is None:
        return f"> {limit:,}" if limit else "-"
    return f"<= {n:,}" if low is not None and n <= low else f"{n:,}"


def render(engine_rows: list[dict], side: dict | None, meta: dict) -> str:
    lines = ["# Power", "", "<!-- Generated by `python -m research.power` (research/power.py); do not edit. -->", "",
             "Generated by `python -m research.power`; do not edit by hand. "
             f"Wall time {meta['wall_s'] / 60:.0f} min on {meta['cpus']} shared CPUs.", ""]
    if engine_rows:
        alpha = meta["alpha"]
        lines += ["## A. Detection rate vs sample size, in the suite's setting", "",
                  f"Toy backend, sampling configuration `temperature` (T = 1), depth 3, up to 48 tokens per generation; "
                  f"observations pooled over contexts as DIST-EQUIV does; {meta['reps']} runs per cell drawn from a pool of "
                  f"{meta['generations']} generations per mutant; alpha = {alpha:.3g} per test (the suite's SUITE_ALPHA / "
                  f"STAT_SUBTESTS). The `ci` profile draws 40 generations per configuration "
                  f"(about {meta.get('ci_n', '?')} observations at T = 1 on the toy backend).", "",
                  "`rank TV` is the total variation between observed and expected rank-bin frequencies over the whole pool "
                  "(the deviation the G-test sees; sampling noise included); `acc` the mutant's acceptance rate.", "",
                  "| mutant | acc | rank TV | test | " + " | ".join(f"n={n}" for n in N_GRID) + " | n for 90 % |",
                  "|---|---|---|---|" + "---|" * len(N_GRID) + "---|"]
        for row in engine_rows:
            for test, key in (("rank G-test", "g"), ("PIT-KS", "ks")):
                vals = [f"{row[key][n]:.2f}" if n in row[key] else "" for n in N_GRID]
                lines.append(f"| `{row['name']}` | {row['acceptance']:.2f} | {row['rank_tv']:.3f} | {test} | "
                             + " | ".join(vals) + f" | {_fmt_n(needed(row[key]), max(row[key], default=None), min(row[key]))} |")
        tv = engine_rows[0]["tv99"]
        lines += ["", "The G-test's guaranteed detectable rank-space TV at power 0.99 (mtpcheck.laws.stats.detectable_tv) "
                  "at these n: " + ", ".join(f"n={n}: {v:.3f}" for n, v in sorted(tv.items())) + "."]
    if side:
        lines += ["", "## B. Side by side with vLLM's L2-convergence heuristic", "",
                  f"One position, vocabulary {len(side['p'])}, one proposal; p and q from vLLM's generator "
                  f"(softmax of U(0,1) logits, seed 0; TV(p, q) = {side['tv_pq']:.3f}). The correct rule's exact law equals "
                  f"p within {side['correct_error']:.1e}. All three tests at a {SIDE_ALPHA:.0%} false-alarm rate: the G-test "
                  f"and PIT-KS at alpha = {SIDE_ALPHA} (measured on the correct rule at n = {side['null_rates']['n']:,}: "
                  f"G {side['null_rates']['g']:.3f}, KS {side['null_rates']['ks']:.3f} over {meta['reps_b']} runs); the "
                  f"heuristic's multiplier set to the {SIDE_ALPHA:.0%} quantile of its statistic over "
                  f"{meta['null_reps']} null runs at each schedule (vLLM's fixed 20 instead: a false-alarm rate of "
                  f"{side['vllm']['false_alarm']:.3f} at its 111,110 samples). Samples needed: the smallest total with "
                  f"detection rate >= {POWER_TARGET} over {meta['reps_b']} runs (the heuristic's total is the sum of its "
                  "five sample sizes).", "",
                  "| mutant | TV(emitted, p) | rank G-test | PIT-KS | L2 heuristic (calibrated) | L2 / G-test | "
                  f"G-test at the suite's alpha ({meta['alpha']:.3g}) | "
                  "vLLM's test as written (111,110 samples, x20): detection |", "|---|---|---|---|---|---|---|---|"]
        ratios = []
        for row in side["rows"]:
            ng, nk, nl = needed(row["g"]), needed(row["ks"]), needed(row["l2"])
            g_low, l_low = ng is not None and ng <= min(row["g"]), nl is not None and nl <= min(row["l2"])
            ratio = (nl / ng) if (ng and nl) else None
            if ratio and not (g_low or l_low):
                ratios.append(ratio)
            lim_l = max(row["l2"]) if row["l2"] else None
            shown = "-" if not ratio else (">= " if g_low and not l_low else "<= " if l_low and not g_low else
                                            "~ " if g_low else "") + f"{ratio:.1f}x"
            lines.append(f"| `{row['name']}` | {row['tv']:.3f} | {_fmt_n(ng, max(row['g']), min(row['g']))} | "
                         f"{_fmt_n(nk, max(row['ks']), min(row['ks']))} | {_fmt_n(nl, lim_l, min(row['l2']))} | {shown} | "
                         f"{_fmt_n(needed(row['g_suite']), max(row['g_suite']), min(row['g_suite']))} | "
                         f"{row.get('vllm_power', float('nan')):.2f} |")
        thr = ", ".join(f"{l2_total(n):,}: {t:.2f}" for n, t in side["l2_thresholds"].items())
        lines += ["", f"Calibrated multipliers by sample total: {thr}."]
        if ratios:
            g_suite = [needed(r["g_suite"]) for r in side["rows"]]
            lines += ["", f"**Calibrated to the same 1 % false-alarm rate, the L2 heuristic needs {min(ratios):.1f}x to "
                      f"{max(ratios):.1f}x the samples of the rank G-test (geometric mean "
                      f"{math.exp(np.mean(np.log(ratios))):.1f}x) for 90 % power** (mutants whose figures both lie inside "
                      "the grid; `>=`: the G-test already had that power at its smallest n). As written (multiplier 20, 111,110 "
                      "samples, no stated alpha) it spends "
                      + (f"{111_110 / max(x for x in g_suite if x):.0f}x to {111_110 / min(x for x in g_suite if x):.0f}x "
                         if all(g_suite) else "many times ")
                      + "the samples the rank G-test needs for the same mutants at the suite's alpha of "
                      f"{meta['alpha']:.3g} per test. Sample counts between grid points are interpolated (log n, linear in "
                      "the detection rate)."]
        lines += ["", "Detection rate by sample total:", ""]
        for row in side["rows"]:
            lines.append(f"- `{row['name']}`: G-test " + ", ".join(f"{n:,}: {v:.2f}" for n, v in row["g"].items())
                         + f"; G-test at alpha {meta['alpha']:.3g} " + ", ".join(f"{n:,}: {v:.2f}" for n, v in row["g_suite"].items())
                         + "; PIT-KS " + ", ".join(f"{n:,}: {v:.2f}" for n, v in row["ks"].items())
                         + "; L2 " + ", ".join(f"{n:,}: {v:.2f}" for n, v in row["l2"].items()))
    return "\n".join(lines) + "\n"


def plot(engine_rows: list[dict], side: dict | None, path: Path, alpha: float) -> bool:
    """Detection rate vs sample size (part A, and part B's tests) as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [x for x in (engine_rows, side) if x]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    if engine_rows:
        _curves(axes[0][0], engine_rows, {"g": ("-o", "G-test"), "ks": (":s", "PIT-KS")}, 7,
                xlabel="observations (pooled over contexts)", title=f"A. toy backend, T = 1, alpha = {alpha:.3g}")
    if side:
        _curves(axes[0][-1], side["rows"], {"g": ("-o", "G-test"), "l2": ("--^", "L2 heuristic")}, 6,
                xlabel="samples (the heuristic: all five sizes)",
                title=f"B. one position, V = 10, false alarms {SIDE_ALPHA:.0%}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _curves(ax, rows, tests: dict[str, tuple[str, str]], fontsize: int, xlabel: str, title: str) -> None:
    """One panel: detection rate against sample size, a colour per row, a line style per test."""
    for i, row in enumerate(rows):
        for key, (style, test) in tests.items():
            ns = sorted(row[key])
            ax.plot(ns, [row[key][n] for n in ns], style, color=f"C{i}", ms=4, label=f"{row['name']} ({test})")
    ax.set(xscale="log", xlabel=xlabel, ylabel="detection rate", title=title)
    ax.legend(fontsize=fontsize)
    ax.grid(alpha=0.3)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    ap = argparse.ArgumentParser(prog="python -m research.power")
    ap.add_argument("--generations", type=int, default=500, help="pool size per mutant (part A)")
    ap.add_argument("--reps", type=int, default=40, help="runs per cell (part A)")
    ap.add_argument("--reps-b", type=int, default=200, help="runs per cell (part B)")
    ap.add_argument("--null-reps", type=int, default=2000, help="null runs per schedule for the heuristic's threshold")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-side", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "power.md"))
    ap.add_argument("--save", help="pickle the measured parts here")
    ap.add_argument("--reuse", help="a --save pickle whose parts fill in the skipped ones")
    args = ap.parse_args(argv)
    from mtpcheck.machinery.configs import DIST_ALPHA

    t0 = time.perf_counter()
    alpha = DIST_ALPHA
    engine_rows, side = [], None
    if not args.skip_engine:
        names = [*ENGINE_MUTANTS, None]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as ex:
            pools = list(ex.map(pool, names, ["temperature"] * len(names), [args.generations] * len(names),
                                [50_000_000] * len(names)))
        engine_rows = engine_power(pools, args.reps, alpha)
        ci_n = int(np.mean([len(t) for t, _ in pools[-1]["gens"]]) * 40)
    if not args.skip_side:
        side = side_by_side(args.reps_b, args.null_reps, SIDE_ALPHA, suite_alpha=alpha)
    meta = {"wall_s": time.perf_counter() - t0, "cpus": os.cpu_count(), "alpha": alpha, "reps": args.reps,
            "generations": args.generations, "reps_b": args.reps_b, "null_reps": args.null_reps}
    if engine_rows:
        meta["ci_n"] = ci_n
    if args.reuse:
        old = pickle.loads(Path(args.reuse).read_bytes())
        if not engine_rows and old["engine_rows"]:
            engine_rows = old["engine_rows"]
            meta.update({k: old["meta"][k] for k in ("reps", "generations", "ci_n")})
        if side is None and old["side"]:
            side = old["side"]
            meta.update({k: old["meta"][k] for k in ("reps_b", "null_reps")})
        meta["wall_s"] += old["meta"]["wall_s"]
    if args.save:
        Path(args.save).write_bytes(pickle.dumps({"engine_rows": engine_rows, "side": side, "meta": meta}))
    png = Path(args.out).with_suffix(".png")
    text = render(engine_rows, side, meta)
    if plot(engine_rows, side, png, alpha):
        text = text.replace("\n## A.", f"\n![detection rate vs sample size]({png.name})\n\n## A.", 1)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
