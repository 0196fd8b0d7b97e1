"""SEED-INDEPENDENT's power against key collisions of several shapes (issue
24, item 1), the old combination of its series (the mean of e-values,
`laws.independence.coincidence_test`) beside the new one (each series'
exact or Markov p-value, Bonferroni over series: `series_test`).

A collision shape is a careless key k(seed, position): the runtime draws
U(k, stream, 0) instead of U(seed, stream, position). Its strength f is the
fraction of keys that are careless (chosen by the careless key itself, so
two runs that share a key make the same choice): f = 1 is a runtime that
always collides, smaller f a collision that shows at some positions only.
Shapes and the seed pair / alignment where they collide:

- additive: k = seed + position - pair s, s+1 at lag 1;
- shifted: k = 2 seed + position - pair s, s+1 at lag 2;
- xor: k = seed xor position - pair s, s+1 at lag +1 or -1 (half each);
- truncation: k = (seed mod 2^32, position) - pair s, s xor 2^32 at lag 0;
- float64: k = (int(float(seed)), position) - pair 2^60+s, 2^60+s+1 at lag 0;
- multiplicative: k = 1000003 seed + position - collides at lag 1000003,
  beyond every alignment the clause compares: by design not detectable.

Each run is the suite's own series (`machinery.seeds.seed_pair_series`) on
the reference engine with the collision put into its randomness
(`Engine.uniform`), at the profile's replicates and tokens.

`python -m research.independence_power [--reps 6] [--profile ci]`
writes the section between the markers in docs/power.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from research import write_section

START, END = "<!-- independence-power:start -->", "<!-- independence-power:end -->"
STRENGTHS = (1.0, 0.5, 0.25, 0.125)


def _careless(shape: str, seed: int, position: int) -> tuple[int, int] | None:
    """(key seed, key position) of the careless derivation."""
    if shape == "additive":
        return seed + position, 0
    if shape == "shifted":
        return 2 * seed + position, 0
    if shape == "xor":
        return seed ^ position, 0
    if shape == "truncation":
        return seed % (1 << 32), position
    if shape == "float64":
        return int(float(seed)), position
    if shape == "multiplicative":
        return 1_000_003 * seed + position, 0
    raise ValueError(f"unknown collision shape {shape!r}")


SHAPES = ("additive", "shifted", "xor", "truncation", "float64", "multiplicative")


def collide(engine, shape: str, strength: float) -> None:
    """Put a careless key of `shape` into the engine's randomness, for a
    fraction `strength` of keys (selected by the key itself)."""
    from mtpcheck.engine.sampling import uniform
    from mtpcheck.mutants.zoo import KeyedDraw, become, with_drafters

    class Collides(type(engine)):
        def uniform(self, seed, stream, position):
            k_seed, k_pos = _careless(shape, seed, position)
            k_seed %= 1 << 64
            if strength >= 1.0 or uniform(k_seed, 97, k_pos) < strength:
                return uniform(k_seed, stream, k_pos)
            return super().uniform(seed, stream, position)

    become(engine, Collides)
    with_drafters(engine, KeyedDraw, attrs={"engine": engine})  # the drafters draw through it too


def one_run(base: str, profile: str, shape: str | None, strength: float, run_seed: int,
            temperature: float | None = None) -> dict:
    """The clause's series for one run, judged by both combinations."""
    from mtpcheck.backends import load_backend
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.laws.independence import coincidence_test, series_test
    from mtpcheck.machinery.configs import INDEPENDENCE_ALPHA
    from mtpcheck.machinery.harness import PROFILES
    from mtpcheck.machinery.seeds import REPLICATES, base_seeds, seed_pair_series

    backend = load_backend(base, {})
    if shape is not None:
        collide(backend.engine, shape, strength)
    caps = backend.capabilities()
    prof = PROFILES[profile]
    series = seed_pair_series(backend, caps, list(fixture_prompts(backend).values()), prof.dist_tokens,
                              base_seeds(run_seed, REPLICATES[profile]), np.random.default_rng(run_seed),
                              **({} if temperature is None else {"temperature": temperature}))
    old, new = coincidence_test("old", series, INDEPENDENCE_ALPHA), series_test("new", series, INDEPENDENCE_ALPHA)
    return {"shape": shape, "strength": strength, "seed": run_seed, "old_p": old.p_value, "new_p": new.p_value,
            "old_caught": not old.passed, "new_caught": not new.passed, "strongest": new.note}


def render(rows: list[dict], meta: dict) -> str:
    from mtpcheck.machinery.configs import INDEPENDENCE_ALPHA

    lines = [START, "", "## F. SEED-INDEPENDENT: power against key collisions, old and new combination", "",
             f"`python -m research.independence_power` (research/independence_power.py): "
             f"base `{meta['base']}`, profile `{meta['profile']}` ({meta['replicates']} base seeds x 3 seed pairs x "
             f"{meta['tokens']} tokens per run, T = {meta['temperature']:g}), {meta['reps']} runs per cell, alpha {INDEPENDENCE_ALPHA:g}, "
             f"{meta['wall_min']:.1f} min. A cell is the fraction of runs that fail the clause, old combination "
             f"(mean of e-values over the series) / new (each series' exact binomial tail or 1/E, Bonferroni over "
             f"the series); in brackets the median p-value, old / new. Strength: the fraction of keys that are "
             f"careless (1: always).", "",
             "| shape | " + " | ".join(f"strength {s:g}" for s in STRENGTHS) + " |",
             "|---|" + "---|" * len(STRENGTHS)]
    for shape in SHAPES:
        cells = []
        for s in STRENGTHS:
            rs = [r for r in rows if r["shape"] == shape and r["strength"] == s]
            if not rs:
                cells.append("-")
                continue
            old = sum(r["old_caught"] for r in rs) / len(rs)
            new = sum(r["new_caught"] for r in rs) / len(rs)
            cells.append(f"{old:.2f} / {new:.2f} ({np.median([r['old_p'] for r in rs]):.1g} / "
                         f"{np.median([r['new_p'] for r in rs]):.1g})")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    null = [r for r in rows if r["shape"] is None]
    if null:
        lines += ["", f"No collision (the reference as shipped), {len(null)} runs: failed "
                      f"{sum(r['old_caught'] for r in null)} (old) / {sum(r['new_caught'] for r in null)} (new); "
                      f"smallest p-value {min(r['old_p'] for r in null):.2g} / {min(r['new_p'] for r in null):.2g}."]
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from mtpcheck.machinery.harness import PROFILES
    from mtpcheck.machinery.seeds import INDEPENDENCE_TEMPERATURE, REPLICATES
    from research import ROOT

    ap = argparse.ArgumentParser(prog="python -m research.independence_power",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="mlx")
    ap.add_argument("--profile", default="ci", choices=sorted(PROFILES))
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--null-reps", type=int, default=6)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--temperature", type=float, default=INDEPENDENCE_TEMPERATURE)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "docs" / "power.md"))
    args = ap.parse_args(argv)
    t0 = time.time()
    jobs = [(args.base, args.profile, shape, s, 10_000 + 97 * r, args.temperature) for shape in args.shapes.split(",")
            for s in STRENGTHS for r in range(args.reps)]
    jobs += [(args.base, args.profile, None, 0.0, 50_000 + 89 * r, args.temperature) for r in range(args.null_reps)]
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as ex:
        rows = list(ex.map(one_run, *zip(*jobs, strict=True)))
    for r in rows:
        print(r["shape"], r["strength"], f"old p {r['old_p']:.3g}", f"new p {r['new_p']:.3g}", r["strongest"],
              flush=True)
    meta = {"base": args.base, "profile": args.profile, "replicates": REPLICATES[args.profile], "reps": args.reps,
            "temperature": args.temperature,
            "tokens": PROFILES[args.profile].dist_tokens, "wall_min": (time.time() - t0) / 60}
    write_section(Path(args.out), START, END, render(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
