"""Black-box power and null behaviour of DIST-CONTEXT (issue 12, item 4).

For a backend (the reference fixture `mlx`, or `toy`) and a mutant built on
it, a pool of short seeded requests per fixture prompt and filter
configuration: only emitted tokens, the reported acceptance and
target_distributions, what a runtime without hooks gives. A simulated run
is `machinery.contexts.staged_test` exactly as the suite calls it, its
`sample` drawing from the pool without replacement (a fresh permutation per
run). A run that would need more requests on a prompt than its pool holds
is not simulated: drawing the same requests twice makes the pool's own
sampling noise look like a bias (it raised the correct backend's rate to 1),
so such cells read "-".

`python -m research.context_power [--base mlx] [--per-prompt 1600]`
writes the section between the markers in docs/power.md.
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from research import write_section

START, END = "<!-- context-power:start -->", "<!-- context-power:end -->"
NAMES = ("correct", "draft-law-unfiltered")


def _backend(name: str, base: str):
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    from mtpcheck.backends import load_backend
    from mtpcheck.mutants import load_mutant

    return load_backend(base, {}) if name == "correct" else load_mutant(name, base)


def build_pool(name: str, base: str, config: str, per_prompt: int, seed0: int) -> dict:
    """per_prompt short requests on every fixture prompt: tokens and the
    reported speculation counts only."""
    import itertools

    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery import contexts as ctx
    from mtpcheck.machinery.configs import DIST_CONFIGS, spec_for

    be = _backend(name, base)
    caps = be.capabilities()
    prompts = fixture_prompts(be)
    seeds = itertools.count(seed0)
    t0 = time.process_time()
    draws = ctx.draw(be, caps, prompts, {k: per_prompt for k in prompts}, DIST_CONFIGS[config], spec_for(caps),
                     lambda: next(seeds))
    pool: dict[str, list] = {k: [] for k in prompts}
    for pname, _, res in draws:
        s = res.speculation
        pool[pname].append((tuple(res.tokens), s.used, s.accepted, s.drafted))
    return {"name": name, "base": base, "config": config, "prompts": prompts, "pool": pool,
            "first": ctx.lead(caps), "cpu_s": time.process_time() - t0}


def _cached_pool(args) -> dict:
    name, base, config, per_prompt, cache = args
    path = Path(cache) / f"ctx-{base}-{name}-{config}-{per_prompt}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    p = build_pool(name, base, config, per_prompt, 900_000_000 + 10_000 * len(config) + 7 * per_prompt)
    path.write_bytes(pickle.dumps(p))
    return p


class _Spent(Exception):
    pass


def detection(pl: dict, laws, pilot: int, runs: int, reps: int, alpha: float, seed: int = 11) -> dict:
    """Share of simulated staged runs that fail, and how often each stage decided."""
    from mtpcheck.machinery.configs import (
        CONTEXT_ESCALATE,
        CONTEXT_PILOT_MIN_EXPECTED,
        CONTEXT_TARGETS,
        SUSPICIOUS,
    )
    from mtpcheck.machinery.contexts import staged_test

    rng = np.random.default_rng(seed)
    hits, by_stage, replaced, p_values = 0, {}, 0, []
    for _ in range(reps):
        order = {k: list(rng.permutation(len(v))) for k, v in pl["pool"].items()}
        spent = [False]

        def sample(per_prompt):
            out = []
            for k, m in per_prompt.items():
                for _ in range(m):
                    if not order[k]:  # noqa: B023 - sample() runs within this repetition
                        spent[0] = True  # noqa: B023
                        raise _Spent
                    i = order[k].pop()  # noqa: B023
                    toks, used, acc, dr = pl["pool"][k][i]
                    res = SimpleNamespace(tokens=list(toks), speculation=SimpleNamespace(used=used, accepted=acc,
                                                                                         drafted=dr))
                    out.append((k, pl["prompts"][k], res))
            return out

        try:
            out = staged_test(sample, laws, list(pl["prompts"]), pl["first"], pilot, runs, alpha, targets=CONTEXT_TARGETS,
                              escalate=CONTEXT_ESCALATE, suspicious=SUSPICIOUS, pilot_min_expected=CONTEXT_PILOT_MIN_EXPECTED)
        except _Spent:
            replaced += 1
            continue
        p_values.append(min(s["p_value"] for s in out.stages))
        if out.failed:
            hits += 1
            by_stage[out.failed[0]] = by_stage.get(out.failed[0], 0) + 1
    done = reps - replaced
    return {"rate": hits / done if done else None, "runs": done, "by_stage": by_stage, "replaced": replaced / reps,
            "median_min_p": float(np.median(p_values)) if p_values else None}


def _laws_for(base: str, config: str):
    from mtpcheck.machinery.configs import DIST_CONFIGS

    be, sp, cache = _backend("correct", base), DIST_CONFIGS[config], {}

    def laws(prompt, cont):
        key = (tuple(prompt), tuple(cont[:-1]))
        if key not in cache:
            cache[key] = np.asarray(be.target_distributions(prompt, cont, sp))
        return cache[key]

    return laws


def _evaluate(args) -> list[dict]:
    pl, reps, alpha = args
    from mtpcheck.machinery.harness import PROFILES

    laws = _laws_for(pl["base"], pl["config"])
    rows = []
    for prof in ("ci", "dev", "thorough"):
        P = PROFILES[prof]
        t0 = time.time()
        d = detection(pl, laws, P.context_pilot, P.context_runs, reps, alpha)
        rows.append({"name": pl["name"], "config": pl["config"], "base": pl["base"], "profile": prof,
                     "pool": sum(len(v) for v in pl["pool"].values()), "per_prompt": len(next(iter(pl["pool"].values()))),
                     "sim_s": time.time() - t0, **d})
    return rows


def render(rows: list[dict], meta: dict) -> str:
    lines = [START, "", "## D. DIST-CONTEXT: black-box power at the suite's profiles", "",
             f"Generated by `python -m research.context_power` ({meta['wall_min']:.0f} min wall on 2 shared "
             f"CPUs). Backend `{meta['base']}`; pools of {meta['per_prompt']} short seeded requests per fixture prompt "
             "and filter configuration (emitted tokens, reported accepted/drafted, target_distributions: nothing "
             "else). A simulated run is `machinery.contexts.staged_test` as the suite calls it (pilot, targeted "
             "stage on the 2 prompts whose pilot statistic stood out, escalation at p <= 1e-3), each stage at "
             f"DIST_ALPHA / 3 = {meta['alpha']:.3g}; {meta['reps']} runs per cell, each a fresh permutation of the pool. "
             "`correct` is the reference itself: its rate is the false-alarm rate at the suite's alpha. "
             "`-`: the profile needs more requests on a prompt than its pool holds (not simulated: reusing "
             "requests makes the pool's own noise look like a bias); `(k)`: only k of the runs fitted the pool "
             "(the others escalated beyond it).", "",
             "| backend | config | ci | dev | thorough | dev: failing stage | dev: median smallest p |",
             "|---|---|---|---|---|---|---|"]
    key = {}
    for r in rows:
        key.setdefault((r["name"], r["config"]), {})[r["profile"]] = r
    for (name, config), cells in key.items():
        def cell(p, cells=cells):
            r = cells[p]
            if r["rate"] is None:
                return "-"
            return f"{r['rate']:.2f}" + (f" ({r['runs']})" if r["replaced"] > 0 else "")
        dev = cells["dev"]
        stages = ", ".join(f"{k} {v}" for k, v in sorted(dev["by_stage"].items())) or "-"
        lines.append(f"| `{name}` | {config} | {cell('ci')} | {cell('dev')} | {cell('thorough')} | {stages} | "
                     + (f"{dev['median_min_p']:.2g}" if dev["median_min_p"] is not None else "-") + " |")
    union = meta.get("union")
    if union:
        lines += ["", union]
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from mtpcheck.machinery.configs import CONTEXT_CONFIGS, CONTEXT_STAGE_ALPHA
    from research import ROOT

    ap = argparse.ArgumentParser(prog="python -m research.context_power", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="mlx")
    ap.add_argument("--names", nargs="+", default=list(NAMES))
    ap.add_argument("--per-prompt", type=int, default=1600)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "mtpcheck-context-power"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "power.md"))
    args = ap.parse_args(argv)
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    jobs = [(n, args.base, c, args.per_prompt, args.cache) for n in args.names for c in CONTEXT_CONFIGS]
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as ex:
        pools = list(ex.map(_cached_pool, jobs))
        rows = [r for rs in ex.map(_evaluate, [(p, args.reps, CONTEXT_STAGE_ALPHA) for p in pools]) for r in rs]
    for r in rows:
        print(r, flush=True)
    meta = {"base": args.base, "per_prompt": args.per_prompt, "reps": args.reps, "alpha": CONTEXT_STAGE_ALPHA,
            "wall_min": (time.time() - t0) / 60}
    # the suite runs the three configurations in one run: a mutant is caught when any fails
    for name in args.names:
        for prof in ("dev", "thorough"):
            rates = [r["rate"] for r in rows if r["name"] == name and r["profile"] == prof]
            if None in rates:
                continue
            miss = np.prod([1 - r for r in rates])
            meta.setdefault("lines", []).append(f"`{name}` at `{prof}`: {1 - miss:.2f}")
    meta["union"] = meta.get("lines") and ("Caught by at least one of the three configurations (runs independent, 1 - product of misses): "
                     + "; ".join(meta["lines"]) + ".")
    write_section(Path(args.out), START, END, render(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
