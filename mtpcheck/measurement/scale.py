"""`mtpcheck bench-scale`: the suite's own cost as the vocabulary grows.

DIST-ZERO and DIST-EQUIV read, per sampling configuration, one target law of
width V for every emitted token (ci: 40 generations x 48 tokens). Here those
laws are synthetic, so any V can be measured without a model: each row is a
Zipf law p(rank r) ~ r^-a with the exponent a drawn per row (a long tail with
entropy and nucleus sizes of a small trained model's), token ids permuted per
row, then the configuration's temperature and filters, and the emitted token
drawn from the processed law (the null). Each generation's rows go through
what the suite does with them (`summarise`, then DIST-ZERO's zero check and
DIST-EQUIV's rank G-test and PIT-KS on the joined summaries), timed, with the
peak of traced allocations (tracemalloc: numpy's arrays included) and the
bytes the summaries keep for the whole run.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.stats import (
    LawSummary,
    pit_ks,
    rank_gtest,
    summarise,
    zero_probability_violations,
)
from mtpcheck.machinery.configs import DIST_CONFIGS

ZIPF_EXPONENTS = (1.25, 1.65)  # per-row exponent range: entropy about 3.4 nats, top-p 0.9 on ~100 tokens at 32k


def zipf_rows(V: int, rows: int, sp: SamplingParams, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [rows], processed laws [rows, V]): Zipf laws in rank order,
    tempered and filtered there (no sort needed), drawn from, then scattered
    to a random permutation of the ids."""
    r = np.arange(1, V + 1, dtype=np.float64)
    a = rng.uniform(*ZIPF_EXPONENTS, size=(rows, 1)) / (sp.temperature or 1.0)
    p = np.exp(-a * np.log(r))
    p /= p.sum(axis=1, keepdims=True)
    if sp.top_k is not None:
        p[:, sp.top_k :] = 0.0
    if sp.top_p is not None and sp.top_p < 1.0:  # keep up to and including the token that crosses top_p
        cut = (np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1) < sp.top_p).sum(axis=1) + 1
        p[np.arange(V) >= cut[:, None]] = 0.0
    if sp.min_p:
        p[p < sp.min_p * p[:, :1]] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    ranks = (np.cumsum(p, axis=1) < rng.random((rows, 1))).sum(axis=1).clip(max=V - 1)
    perm = rng.permuted(np.tile(np.arange(V), (rows, 1)), axis=1)  # token id of each rank
    laws = np.zeros_like(p)
    np.put_along_axis(laws, perm, p, axis=1)
    return perm[np.arange(rows), ranks], laws


@dataclass
class ConfigCost:
    vocab: int
    config: str
    rows: int
    summarise_s: float  # the ground-truth path: each generation's rows summarised, as the suite memoises them
    tests_s: float  # DIST-ZERO's zero check + DIST-EQUIV's G-test and PIT-KS on the joined summaries
    peak_mb: float  # peak traced allocation, one generation's rows of width V included
    kept_kb: float  # what the summaries keep for this configuration
    gtest_p: float
    pit_ks_p: float


def law_shape(V: int, rng: np.random.Generator, rows: int = 200) -> dict:
    """Median entropy (nats) and top-p 0.9 nucleus size of the unfiltered synthetic laws."""
    _, laws = zipf_rows(V, rows, SamplingParams(temperature=1.0), rng)
    p = -np.sort(-laws, axis=1)
    entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
    nucleus = (np.cumsum(p, axis=1) < 0.9).sum(axis=1) + 1
    return {"entropy_nats": round(float(np.median(entropy)), 2), "top_p_0.9_tokens": int(np.median(nucleus))}


def measure_config(V: int, config: str, runs: int, tokens: int, seed: int) -> ConfigCost:
    """One configuration's statistics path at vocabulary V (see the module docstring)."""
    rng = np.random.default_rng(seed)
    sp = DIST_CONFIGS[config]
    tracemalloc.start()
    summarise_s, parts = 0.0, []
    for _ in range(runs):
        toks, laws = zipf_rows(V, tokens, sp, rng)
        start = time.perf_counter()
        parts.append(summarise([(int(t), row) for t, row in zip(toks, laws, strict=True)]))
        summarise_s += time.perf_counter() - start
        del toks, laws
    start = time.perf_counter()
    obs = LawSummary.join(parts)
    bad = zero_probability_violations(obs)
    g, ks = rank_gtest(obs), pit_ks(obs, rng_seed=seed)
    tests_s = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    if bad:
        raise AssertionError(f"synthetic {config} at V={V}: a token of probability 0 was drawn")
    kept = sum(a.nbytes for a in (obs.zero, obs.informative, obs.ranks, obs.mass, obs.below, obs.below_id, obs.bins))
    return ConfigCost(V, config, len(obs), round(summarise_s, 3), round(tests_s, 3), round(peak / 2**20, 1),
                      round(kept / 2**10, 1), g.p_value, ks.p_value)


def peak_rss_mb() -> float:
    """The process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def table(rows: list[ConfigCost]) -> list[str]:
    out = ["| V | config | rows | summarise s | tests s | peak MB | kept KB | G-test p | PIT-KS p |", "|---" * 9 + "|"]
    out += [f"| {c.vocab} | {c.config} | {c.rows} | {c.summarise_s:.2f} | {c.tests_s:.3f} | {c.peak_mb:.1f} | "
            f"{c.kept_kb:.0f} | {c.gtest_p:.3g} | {c.pit_ks_p:.3g} |" for c in rows]
    return out


def run_scale(args) -> int:
    vocabs = [int(v) for v in args.vocab.split(",")]
    configs = list(DIST_CONFIGS) if args.configs == "all" else args.configs.split(",")
    unknown = [c for c in configs if c not in DIST_CONFIGS]
    if unknown:
        sys.stderr.write(f"mtpcheck: error: unknown configurations {unknown}; known: {list(DIST_CONFIGS)}\n")
        return 2
    rows, report = [], {"runs": args.runs, "tokens": args.tokens, "zipf_exponents": ZIPF_EXPONENTS, "vocab": {}}
    for V in vocabs:
        costs = [measure_config(V, c, args.runs, args.tokens, args.seed + i) for i, c in enumerate(configs)]
        rows += costs
        report["vocab"][V] = {"law": law_shape(V, np.random.default_rng(args.seed)),
                              "seconds_per_config": round(sum(c.summarise_s + c.tests_s for c in costs) / len(costs), 2),
                              "peak_mb": max(c.peak_mb for c in costs),
                              "kept_kb_all_configs": round(sum(c.kept_kb for c in costs), 1)}
        print(f"V={V}: {report['vocab'][V]}", flush=True)
    report["configs"] = [asdict(c) for c in rows]
    report["peak_rss_mb"] = round(peak_rss_mb(), 1)
    print("\n".join(table(rows)))
    print(f"process peak RSS {report['peak_rss_mb']:.0f} MB")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `mtpcheck bench-scale`."""
    p = subparsers.add_parser(
        "bench-scale", help="the DIST clauses' own time and memory as the vocabulary grows (synthetic laws)",
        description="Drive synthetic Zipf target laws of each vocabulary size through DIST-ZERO's and "
        "DIST-EQUIV's statistics path, one sampling configuration at a time: seconds, peak traced memory "
        "and what the summaries keep. No model is loaded.")
    p.add_argument("--vocab", default="512,32000,256000", help="vocabulary sizes (default 512,32000,256000)")
    p.add_argument("--configs", default="all", help="sampling configurations, comma-separated (default all eight)")
    p.add_argument("--runs", type=int, default=40, help="generations per configuration (default 40, the ci profile)")
    p.add_argument("--tokens", type=int, default=48, help="tokens per generation (default 48, the ci profile)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the figures as JSON")
    p.set_defaults(func=run_scale)
    return p
