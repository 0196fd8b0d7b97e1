"""DIST-CONTEXT's power from exact laws, at any profile and any bias size
(issue 12, item 4: a per-position draft-law bias of TV >= 0.03 caught
black-box with power >= 0.9 at `dev` and reliably at `thorough`).

docs/power.md section D replays runs from pools of real requests; the pools
are too small for `thorough` (4,200+ requests per prompt). Here the law of
what a short request emits is computed exactly instead, so a simulated run
can be of any size. A short request (`contexts.short_max_tokens`: the
prefill token and two more) emits

- the prefill token t ~ p0, the target law at the prompt;
- the first speculative token x ~ pi_t: one proposal d ~ q_t, accepted with
  the rule's probability a(p_t, q'_t, d), else the rule's correction law,
  where q is the law the proposal is drawn from and q' the law reported to
  verification (the same for a correct drafter); both come from one traced
  request at context prompt + t, found by choosing a seed whose
  position-addressed prefill draw is t;
- the token after it ~ p_{t,x} (a bonus, or a plain draw after a
  correction: exact for any correct or acceptance-only mutant).

Scaling the bias, pi^s = p + s (pi - p) for s in [0, 1], gives power as a
function of the per-context TV (s times the mutant's). A simulated run is
`machinery.contexts.staged_test` exactly as the suite calls it, with the
backend's own target_distributions as the laws; only the sampling of
requests is replaced. White-box inputs (traces) build the truth; the test
sees emitted tokens only.

`python -m research.context_exact [--mutant draft-law-unfiltered]
[--reps 200]` writes the section between the markers in docs/power.md.
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from research import write_section

START, END = "<!-- context-exact:start -->", "<!-- context-exact:end -->"
MASS = 1 - 1e-6  # prefill tokens traced: the most likely ones, up to this share of p0
TVS = (0.0, 0.02, 0.03, 0.04, 0.05)  # per-context TVs simulated, beside the mutant's own (scale 1)


def emitted_law(p: np.ndarray, q: np.ndarray, q_reported: np.ndarray, rule) -> np.ndarray:
    """Law of the token emitted at a verified position: d ~ q, accepted with
    rule.accept_probability(p, q', d), else drawn from rule.correction(p, q', d)."""
    out = np.zeros_like(p)
    for d in np.flatnonzero(q > 0):
        a = rule.accept_probability(p, q_reported, int(d))
        out[d] += q[d] * a
        if a < 1.0:
            out += q[d] * (1.0 - a) * rule.correction(p, q_reported, int(d))
    return out / out.sum()


def filtered(q_reported: np.ndarray, sp) -> np.ndarray:
    """The request's filters (top-k / top-p / min-p) applied to a law at
    temperature only: what draft-law-unfiltered draws its proposals from."""
    from mtpcheck.engine.sampling import process

    with np.errstate(divide="ignore"):
        return process(np.log(q_reported), sp.model_copy(update={"temperature": 1.0, "seed": None}))


# mutants whose proposals are drawn from another law than the one they report
PROPOSAL_LAW = {"draft-law-unfiltered": filtered}


class ExactContexts:
    """The exact laws of one prompt's short requests under one sampling
    configuration: p0, and per traced prefill token t, p_t and pi_t."""

    def __init__(self, backend, prompt: list[int], sp, spec: dict, rule, laws, max_tokens: int, proposal_law=None):
        """max_tokens: a short request's (contexts.short_max_tokens).
        proposal_law(reported law, sp): the law the proposal was drawn from,
        where the backend's bug makes it differ from the law it reports
        (PROPOSAL_LAW); by default the reported law itself."""
        from mtpcheck.contracts import GenerationRequest
        from mtpcheck.engine.sampling import STREAM_TARGET, sample, uniform

        self.prompt, self.laws = prompt, laws
        self.p0 = laws(prompt, [0])[0]
        order = np.argsort(-self.p0)
        keep = order[: int(np.searchsorted(np.cumsum(self.p0[order]), MASS)) + 1]
        self.pi: dict[int, np.ndarray] = {}
        self.p: dict[int, np.ndarray] = {}
        seed = 1
        for t in (int(x) for x in keep if self.p0[x] > 0):
            while sample(self.p0, uniform(seed, STREAM_TARGET, len(prompt))) != t:
                seed += 1
            res = backend.generate(GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, trace=True,
                                                     speculation=spec,
                                                     sampling=sp.model_copy(update={"seed": seed})))
            seed += 1
            if res.tokens[:1] != [t] or not res.trace or not res.trace[0].proposals:
                continue  # a float-boundary draw, or no draft: left at the target law (no bias counted)
            tr = res.trace[0]
            q_rep = np.asarray(tr.draft_probs[0], dtype=np.float64)
            p_t = np.asarray(tr.target_probs[0], dtype=np.float64)
            q = proposal_law(q_rep, sp) if proposal_law else q_rep
            self.p[t], self.pi[t] = p_t, emitted_law(p_t, q, q_rep, rule)

    def tv(self) -> tuple[float, float]:
        """(p0-weighted mean, max) of TV(pi_t, p_t) over the traced contexts."""
        tvs = {t: 0.5 * float(np.abs(self.pi[t] - self.p[t]).sum()) for t in self.pi}
        w = sum(self.p0[t] for t in tvs)
        return (sum(self.p0[t] * v for t, v in tvs.items()) / w if w else 0.0), max(tvs.values(), default=0.0)

    def draw(self, rng: np.random.Generator, m: int, scale: float) -> list[list[int]]:
        """m short requests' tokens [t, x, y] with the bias scaled by `scale`
        (drawn grouped by context: one multinomial per distinct prefix)."""
        out = []
        ts, nt = np.unique(rng.choice(len(self.p0), size=m, p=self.p0), return_counts=True)
        for t, k in zip(ts.tolist(), nt.tolist(), strict=True):
            law = self.p[t] + scale * (self.pi[t] - self.p[t]) if t in self.pi else self.laws(self.prompt, [t, 0])[1]
            xs, nx = np.unique(rng.choice(len(law), size=k, p=law / law.sum()), return_counts=True)
            for x, j in zip(xs.tolist(), nx.tolist(), strict=True):
                after = self.laws(self.prompt, [t, x, 0])[2]
                out += [[t, x, int(y)] for y in rng.choice(len(after), size=j, p=after / after.sum())]
        order = rng.permutation(len(out))  # requests in arrival order, not grouped
        return [out[i] for i in order]


def simulate(exact: dict[str, ExactContexts], prompts: dict[str, list[int]], laws, first: int, pilot: int, runs: int,
             alpha: float, scale: float, reps: int, seed: int) -> dict:
    """Share of simulated staged runs that fail (the suite's staged_test on exact-law samples)."""
    from mtpcheck.machinery.configs import (
        CONTEXT_ESCALATE,
        CONTEXT_PILOT_MIN_EXPECTED,
        CONTEXT_TARGETS,
        SUSPICIOUS,
    )
    from mtpcheck.machinery.contexts import staged_test

    rng = np.random.default_rng(seed)
    spec = SimpleNamespace(used=True, accepted=0, drafted=1)

    def sample(per_prompt):
        return [(k, prompts[k], SimpleNamespace(tokens=toks, speculation=spec))
                for k, m in per_prompt.items() for toks in exact[k].draw(rng, m, scale)]

    hits, stages = 0, {}
    for _ in range(reps):
        out = staged_test(sample, laws, list(prompts), first, pilot, runs, alpha, targets=CONTEXT_TARGETS,
                          escalate=CONTEXT_ESCALATE, suspicious=SUSPICIOUS,
                          pilot_min_expected=CONTEXT_PILOT_MIN_EXPECTED)
        if out.failed:
            hits += 1
            stages[out.failed[0]] = stages.get(out.failed[0], 0) + 1
    return {"rate": hits / reps, "stages": stages}


def measure(mutant: str, base: str, config: str, reps: int, profiles=("ci", "dev", "thorough"),
            tvs=TVS) -> dict:
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    from mtpcheck.backends import load_backend
    from mtpcheck.engine.acceptance import get_rule
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery import contexts as ctx
    from mtpcheck.machinery.configs import CONTEXT_STAGE_ALPHA, DIST_CONFIGS, spec_for
    from mtpcheck.machinery.harness import PROFILES
    from mtpcheck.mutants import load_mutant

    correct = load_backend(base, {})
    broken = load_mutant(mutant, base)
    caps = correct.capabilities()
    sp, cache = DIST_CONFIGS[config], {}

    def laws(prompt, cont):
        key = (tuple(prompt), tuple(cont[:-1]))
        if key not in cache:
            cache[key] = np.asarray(correct.target_distributions(prompt, cont, sp), dtype=np.float64)
        return cache[key]

    prompts = fixture_prompts(correct)
    rule = get_rule(caps.acceptance_rule)
    if not caps.first_token_from_prefill:
        raise ValueError(f"{base}: the simulator assumes the first token comes from the prefill (lead 1)")
    exact = {k: ExactContexts(broken, p, sp, spec_for(caps), rule, laws, ctx.short_max_tokens(caps),
                              PROPOSAL_LAW.get(mutant))
             for k, p in prompts.items()}
    by_prompt = {k: e.tv() for k, e in exact.items()}
    mean_tv = sum(a for a, _ in by_prompt.values()) / len(by_prompt)  # over prompts (the pilot gives each the same share)
    # scales that give the TVs asked for (only below the mutant's own: p + s (pi - p) stays a law for s <= 1)
    scales = sorted({round(tv / mean_tv, 6) for tv in tvs if tv < mean_tv} | {1.0})
    cells = {}
    for prof in profiles:
        P = PROFILES[prof]
        for s in scales:
            cells[prof, s] = simulate(exact, prompts, laws, ctx.lead(caps), P.context_pilot, P.context_runs,
                                      CONTEXT_STAGE_ALPHA, s, reps, seed=zlib.crc32(f"{prof} {s} {config}".encode()))
    return {"mutant": mutant, "base": base, "config": config, "tv_by_prompt": by_prompt, "mean_tv": mean_tv,
            "cells": cells, "alpha": CONTEXT_STAGE_ALPHA}


def render(results: list[dict], meta: dict) -> str:
    profs = meta["profiles"]
    lines = [START, "", "## E. DIST-CONTEXT from exact laws: power by profile and bias size", "",
             f"Generated by `python -m research.context_exact` ({meta['wall_min']:.0f} min wall on 2 shared "
             f"CPUs, beside another job). Backend `{meta['base']}`, mutant `{meta['mutant']}`. Section D replays pools of "
             "real requests, too small for `thorough`; here the law of what a short request emits is exact (the "
             "prefill token from p0, the first speculative token from the law the acceptance rule yields with the "
             "traced draft laws, the next token from the target law; research/context_exact.py), so a "
             "run can be of any size. A simulated run is `machinery.contexts.staged_test` as the suite calls it "
             f"(each stage at {meta['alpha']:.3g}); {meta['reps']} runs per cell. The bias is scaled: at scale s the "
             "emitted law is p + s (pi - p), so every per-context TV is s times the mutant's; TV 0 is a correct "
             "backend (its rate is the false-alarm rate at the suite's alpha).", "",
             "`TV`: the per-context TV(pi_t, p_t) at the first speculative position, p0-weighted within a prompt and "
             "averaged over the prompts; a cell gives the detection rate at " + " / ".join(f"`{p}`" for p in profs)
             + "; `caught` combines the three configurations of one run (independent samples: 1 - product of misses).",
             ""]
    lines += ["| mean per-context TV | " + " | ".join(f"{r['config']}" for r in results) + " | caught |",
              "|" + "---|" * (len(results) + 2)]
    def cell(r, s):
        return " / ".join(f"{r['cells'][p, s]['rate']:.2f}" for p in profs)

    for tv in meta["tvs"]:
        row, miss = [f"{tv:g}"], {p: 1.0 for p in profs}
        for r in results:
            s = round(tv / r["mean_tv"], 6)
            if (profs[0], s) not in r["cells"]:
                row.append("- (above the mutant's own)")
                miss = None
                continue
            row.append(cell(r, s))
            for p in profs:
                if miss is not None:
                    miss[p] *= 1 - r["cells"][p, s]["rate"]
        row.append(" / ".join(f"{1 - miss[p]:.2f}" for p in profs) if miss else "-")
        lines.append("| " + " | ".join(row) + " |")
    row, miss = ["the mutant's own"], {p: 1.0 for p in profs}
    for r in results:
        row.append(f"TV {r['mean_tv']:.3f}: " + cell(r, 1.0))
        for p in profs:
            miss[p] *= 1 - r["cells"][p, 1.0]["rate"]
    row.append(" / ".join(f"{1 - miss[p]:.2f}" for p in profs))
    lines.append("| " + " | ".join(row) + " |")
    stages = "; ".join(f"{r['config']} " + ", ".join(f"{k} {v}" for k, v in sorted(r["cells"][profs[-1], 1.0]["stages"].items()))
                       for r in results)
    lines += ["", f"Failing stage at `{profs[-1]}`, the mutant's own bias (runs of {meta['reps']}): {stages}.", "",
              "Per prompt, the mutant's own bias (p0-weighted mean / max per-context TV): "
              + "; ".join(f"{r['config']}: " + ", ".join(f"{k} {a:.3f}/{b:.3f}" for k, (a, b) in r["tv_by_prompt"].items())
                          for r in results) + "."]
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from mtpcheck.machinery.configs import CONTEXT_CONFIGS
    from research import ROOT

    ap = argparse.ArgumentParser(prog="python -m research.context_exact",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="mlx")
    ap.add_argument("--mutant", default="draft-law-unfiltered")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--profiles", default="ci,dev,thorough")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "docs" / "power.md"))
    args = ap.parse_args(argv)
    t0 = time.time()
    profs = tuple(args.profiles.split(","))
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as ex:
        futs = [ex.submit(measure, args.mutant, args.base, c, args.reps, profs) for c in CONTEXT_CONFIGS]
        results = [f.result() for f in futs]
    for r in results:
        print(r["config"], f"mean TV {r['mean_tv']:.4f}", {f"{p}@{s}": v["rate"] for (p, s), v in r["cells"].items()},
              flush=True)
    meta = {"base": args.base, "mutant": args.mutant, "reps": args.reps, "alpha": results[0]["alpha"],
            "profiles": profs, "tvs": TVS, "wall_min": (time.time() - t0) / 60}
    write_section(Path(args.out), START, END, render(results, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
