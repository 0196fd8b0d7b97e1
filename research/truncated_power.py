"""What truncated ground truth costs: detection rate of the DIST-EQUIV tests
on the zoo's engine mutants when the target laws are cut to their top N
(N = 5, 20, and whole laws), at the suite's per-test alpha. Reuses the pools
of :mod:`research.power` (toy backend, `temperature` configuration,
depth 3); each run of n observations is tested with
``truncated_rank_gtest``/``truncated_pit_ks`` on ``truncate_laws(P, N)``.

    python -m research.truncated_power [--generations 150 --reps 20]

Prints a markdown table (the one in docs/statistics.md, "Truncated laws")."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from research.power import ENGINE_MUTANTS, draw_run, pool

TOP_N = [5, 20, None]
N_GRID = [200, 400, 800, 1600, 3200]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    ap = argparse.ArgumentParser(prog="python -m research.truncated_power")
    ap.add_argument("--generations", type=int, default=150)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    from mtpcheck.laws.stats import (
        SUITE_ALPHA,
        ObservationBatch,
        truncate_laws,
        truncated_pit_ks,
        truncated_rank_gtest,
    )
    from mtpcheck.machinery.configs import STAT_SUBTESTS

    alpha = SUITE_ALPHA / STAT_SUBTESTS
    t0 = time.perf_counter()
    lines = ["| mutant | N | " + " | ".join(f"G n={n}" for n in N_GRID) + " | KS n=3200 |",
             "|---|---|" + "---|" * (len(N_GRID) + 1)]
    for name in [*ENGINE_MUTANTS, None]:
        pl = pool(name, "temperature", args.generations, 50_000_000)
        n_pool = sum(len(t) for t, _ in pl["gens"])
        V = pl["gens"][0][1].shape[1]
        for top in TOP_N:
            n_eff = top or V
            cells, ks_rate = [], "-"
            for n in N_GRID:
                if n > n_pool:
                    cells.append("-")
                    continue
                rng = np.random.default_rng(7)
                hits = ks_hits = 0
                for r in range(args.reps):
                    run = draw_run(pl["gens"], n, rng)
                    obs = ObservationBatch(run.tokens, truncate_laws(run.probs, n_eff))
                    hits += not truncated_rank_gtest(obs, n_eff, alpha=alpha).passed
                    if n == N_GRID[-1]:
                        ks_hits += not truncated_pit_ks(obs, n_eff, rng_seed=r, alpha=alpha).passed
                cells.append(f"{hits / args.reps:.2f}")
                if n == N_GRID[-1]:
                    ks_rate = f"{ks_hits / args.reps:.2f}"
            lines.append(f"| {name or 'correct'} | {top or f'full ({V})'} | " + " | ".join(cells) + f" | {ks_rate} |")
        print(lines[-3:], file=sys.stderr, flush=True)
    print("\n".join(lines))
    print(f"\nalpha {alpha:.3g} per test, {args.reps} runs per cell, {args.generations} generations per pool, "
          f"wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
