"""Black-box power of DIST-EQUIV at the suite's profiles (issue 12, item 4).

For each distribution mutant of the zoo (and its sampling configuration), a
pool of seeded generations on the toy backend with their target laws (only
emitted tokens and target_distributions: what a runtime without hooks
gives). A run of a profile is `dist_runs` generations drawn from the pool
(without replacement), each cut at the profile's `dist_tokens`, tested as
DIST-EQUIV does (rank G-test and PIT-KS at DIST_ALPHA; detected when either
fails). Writes the section between the markers in docs/power.md.

`python -m mtpcheck.measurement.profile_power [--pool-size N] [--names ...]`.
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from mtpcheck.mutants.run import DIST_CONFIG, ROOT

START, END = "<!-- profile-power:start -->", "<!-- profile-power:end -->"
# distribution mutants (declare DIST-EQUIV or bias the output law) and the configuration they act in
DEFAULT = [("draft-law-unfiltered", "top_k"), ("draft-law-unfiltered", "top_p"), ("argmax-draft", "temperature"),
           ("one-sided-temperature", "min_p"), ("target-filters-dropped", "top_k"),
           ("draft-sampler-unprocessed", "top_k"), ("argmax-verification", "temperature"),
           ("residual-from-p", "temperature"), ("unnormalised-residual", "temperature"),
           ("residual-softmax", "top_k"), ("onehot-q-acceptance", "temperature"),
           ("lenient-acceptance", "temperature"), ("typical-acceptance", "temperature"),
           ("confident-draft-accepted", "top_k"),
           # the reference fixture (the suite's default backend), where the issue measured TV 0.04-0.07
           ("draft-law-unfiltered", "top_k", "mlx"), ("draft-law-unfiltered", "top_p", "mlx")]


def pool(name: str | None, config: str, generations: int, seed0: int, max_tokens: int = 64, base: str = "toy") -> dict:
    """As mutants.power.pool, on any base backend (toy, or mlx: the reference fixture)."""
    from mtpcheck.backends import load_backend
    from mtpcheck.machinery.checks import fixture_prompts
    from mtpcheck.mutants import load_mutant
    from mtpcheck.suite._util import DIST_CONFIGS, request, seeded

    backend = load_mutant(name, base) if name and name != "correct" else load_backend(base, {})
    prompts = list(fixture_prompts(backend).values())
    sp0 = DIST_CONFIGS[config]
    gens, accepted, drafted = [], 0, 0
    for r in range(generations):
        prompt = prompts[r % len(prompts)]
        res = backend.generate(request(prompt, max_tokens, seeded(sp0, seed0 + r), {"mode": "native_mtp", "num_draft_tokens": 3}))
        gens.append((np.array(res.tokens), np.asarray(backend.target_distributions(prompt, res.tokens, sp0))))
        accepted, drafted = accepted + res.speculation.accepted, drafted + res.speculation.drafted
    return {"name": name or "correct", "gens": gens, "acceptance": accepted / max(drafted, 1)}


def _pool(args):
    name, config, size, cache, *rest = args
    base = rest[0] if rest else "toy"
    path = Path(cache) / f"{name}-{config}-{size}{'' if base == 'toy' else '-' + base}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    t0 = time.process_time()
    p = pool(name, config, size, 50_000_000, max_tokens=64, base=base)
    p["config"], p["cpu_s"], p["base"] = config, time.process_time() - t0, base
    path.write_bytes(pickle.dumps(p))
    return p


def detection(pl: dict, runs: int, tokens: int, reps: int, alpha: float, seed: int = 7,
              escalate: bool = False) -> float:
    """Detection rate of DIST-EQUIV; with `escalate`, as the suite runs it:
    stage 1 at alpha/2, and on a p-value <= SUSPICIOUS the sample grown
    ESCALATE-fold (the stage-1 generations kept) at alpha/2."""
    from mtpcheck.laws.stats import ObservationBatch, pit_ks, rank_gtest
    from mtpcheck.suite.test_distribution import ESCALATE, SUSPICIOUS

    rng = np.random.default_rng(seed)
    gens = pl["gens"]

    def test(pick, a, r):
        obs = ObservationBatch(np.concatenate([gens[i][0][:tokens] for i in pick]),
                               np.concatenate([gens[i][1][:tokens] for i in pick]))
        g, ks = rank_gtest(obs, alpha=a), pit_ks(obs, rng_seed=r, alpha=a)
        return g.passed and ks.passed, min(g.p_value, ks.p_value)

    hits = 0
    for r in range(reps):
        order = rng.permutation(len(gens)) if len(gens) >= ESCALATE * runs else rng.choice(len(gens), ESCALATE * runs)
        passed, p = test(order[:runs], alpha / 2 if escalate else alpha, r)
        if escalate and passed and p <= SUSPICIOUS:
            passed, _ = test(order[: ESCALATE * runs], alpha / 2, r + 10_000)
        hits += not passed
    return hits / reps


def render(rows: list[dict], meta: dict) -> str:
    lines = [START, "", "## C. Black-box power at the suite's profiles (DIST-EQUIV)", "",
             f"Generated by `python -m mtpcheck.measurement.profile_power` ({meta['wall_s'] / 60:.0f} min wall on 2 shared "
             f"CPUs). Toy backend (vocabulary 48; `mlx`: the reference fixture, vocabulary 512), depth 3, default stops; pools of seeded generations of up to 64 tokens per mutant and "
             f"configuration (size in the table); a profile's run draws `dist_runs` generations from the pool without "
             f"replacement (with, when the pool is smaller) and cuts each at `dist_tokens` (ci 40 x 48, dev 80 x 48, "
             f"thorough 300 x 64); detected when the rank G-test or PIT-KS rejects at DIST_ALPHA = {meta['alpha']:.3g}; "
             f"{meta['reps']} runs per cell. Where the pool is not much larger than the run, runs share most "
             f"generations and the figure is nearly a single run's outcome (marked *).", "",
             "Each cell: detection rate without escalation / with it (stage 1 at alpha/2; a p-value <= 1e-3 grows the "
             "sample four-fold, drawn with replacement when the pool is smaller). †: the escalated sample is larger "
             "than the pool, so it repeats generations and the escalated figure overstates power (an upper bound); "
             "the figure without escalation is unaffected.", "",
             "| mutant | backend | config | pool gens (tokens) | acc | rank TV (pool) | ci | dev | thorough |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[p]:.2f} / {r[p + '+esc']:.2f}" + ("*" if r['pool'] < 2 * n else "")
                 + ("†" if r['pool'] < 4 * n else "") for p, n in (("ci", 40), ("dev", 80), ("thorough", 300))]
        lines.append(f"| `{r['name']}` | {r['base']} | {r['config']} | {r['pool']} ({r['tokens']}) | {r['acceptance']:.2f} | "
                     f"{r['rank_tv']:.3f} | " + " | ".join(cells) + " |")
    goal = [r for r in rows if r["name"] == "draft-law-unfiltered"]
    if goal:
        best = max(goal, key=lambda r: r["dev+esc"])
        met = best["dev+esc"] >= 0.9
        lines += ["", f"**Goal of issue 12** (the draft law reported without its top-k/top-p filter, a per-position "
                  f"TV of 0.04-0.07 as the issue measured it, caught black-box with power >= 0.9 at `dev`): "
                  f"**{'met' if met else 'not met'}**. Best `dev` detection with escalation: {best['dev+esc']:.2f} "
                  f"({best['base']}, {best['config']}); at `thorough`: "
                  + ", ".join(f"{r['base']}/{r['config']} {r['thorough+esc']:.2f}" for r in goal) + ". "
                  "In rank space (what the G-test and PIT-KS see, pooled over contexts) the bias shows as a rank-bin "
                  "TV of " + ", ".join(f"{r['rank_tv']:.3f}" for r in goal) + " over whole pools of 11-12k tokens: "
                  "pooling by rank cancels most of a per-context tilt towards the draft's favourites, and escalation "
                  "cannot recover what the statistic does not see (docs/statistics.md, 'Power from output alone')."]
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool-size", type=int, default=120)
    ap.add_argument("--big", type=int, default=400, help="pool size for draft-law-unfiltered (the TV 0.03 goal)")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/mtpcheck-profile-power")
    ap.add_argument("--names", nargs="*", help="mutant:config pairs (default: every distribution mutant)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "power.md"))
    ap.add_argument("--rows", help="render these rows (JSON list, as a run saves in the cache) instead of measuring")
    args = ap.parse_args(argv)
    if args.rows:
        import json

        saved = json.loads(Path(args.rows).read_text())
        _write(Path(args.out), render(saved["rows"], saved["meta"]))
        return 0
    from mtpcheck.measurement.power import rank_tv as _rank_tv
    from mtpcheck.suite._util import DIST_ALPHA

    def rank_tv(gens):  # a pool with a zero-probability token has no bins to compare: the G-test fails outright
        try:
            return _rank_tv(gens)
        except KeyError:
            return float("nan"), 0

    t0 = time.perf_counter()
    pairs = [tuple(s.split(":")) for s in args.names] if args.names else DEFAULT
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    jobs = [(n, c or DIST_CONFIG.get(n, "temperature"), args.big if n == "draft-law-unfiltered" else args.pool_size,
             args.cache, *rest) for n, c, *rest in pairs]
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as ex:
        pools = list(ex.map(_pool, jobs))
    rows = []
    for pl in pools:
        tv, _ = rank_tv(pl["gens"])
        row = {"name": pl["name"], "config": pl["config"], "base": pl.get("base", "toy"), "pool": len(pl["gens"]),
               "tokens": int(sum(len(t) for t, _ in pl["gens"])), "acceptance": pl["acceptance"], "rank_tv": tv}
        for prof, runs, toks in (("ci", 40, 48), ("dev", 80, 48), ("thorough", 300, 64)):
            row[prof] = detection(pl, runs, toks, args.reps, DIST_ALPHA)
            row[prof + "+esc"] = detection(pl, runs, toks, args.reps, DIST_ALPHA, escalate=True)
        rows.append(row)
        print(row, flush=True)
    meta = {"alpha": DIST_ALPHA, "reps": args.reps, "wall_s": time.perf_counter() - t0}
    import json

    (Path(args.cache) / "rows.json").write_text(json.dumps({"rows": rows, "meta": meta}))
    _write(Path(args.out), render(rows, meta))
    return 0


def _write(out: Path, section: str) -> None:
    text = out.read_text()
    text = (text[: text.index(START)] + section + text[text.index(END) + len(END):] if START in text
            else text.rstrip() + "\n\n" + section + "\n")
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
