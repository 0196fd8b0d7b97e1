"""SEED-INDEPENDENT's coincidence series, drawn from a backend (the suite's
test and research.independence_power both use this): pairs of
runs under seeds a careless key derivation collides, compared position by
position at a few alignments (mtpcheck.laws.independence); and
UNSEEDED-INDEPENDENT's outputs, unseeded requests served together and alone."""

from __future__ import annotations

import numpy as np

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.independence import agreement_series, closeness_series, pit_values
from mtpcheck.machinery.configs import TOGETHER_PATHS, request, spec_for

REPLICATES = {"ci": 4, "dev": 8, "thorough": 24}  # base seeds of SEED-INDEPENDENT / SEED-STREAMS-INDEPENDENT
# SEED-INDEPENDENT samples at T = 2 (the top of the OpenAI range): a trained model's T = 1 laws are so
# peaked that a randomized PIT value is mostly the suite's own noise; flatter laws let a shared uniform
# show (docs/power.md, section F: seed + position keys, p 0.01 at T = 1, 2e-27 at T = 2 on the fixture)
INDEPENDENCE_TEMPERATURE = 2.0
LAGS = range(-2, 3)  # position alignments compared between two seeds
DELTAS = (0.02, 0.1)  # PIT closeness radii
# Seeds a careless key derivation collides with b: neighbours (seed + position,
# seed + stream, seed xor position), one bit above 32 (truncation to 32 bits),
# neighbours above 2^53 (seeds through a float64).
HIGH = 1 << 60
PAIRS = {"s,s+1": lambda b: (b, b + 1), "s,s^2^32": lambda b: (b, b ^ (1 << 32)),
         "2^60+s,2^60+s+1": lambda b: (HIGH + b, HIGH + b + 1)}


def unrelated(seed: int) -> int:
    """A seed no careless derivation ties to `seed` or its pair partners: a 62-bit
    mix (its low 32 bits differ too, for runtimes that keep 32)."""
    return (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % (1 << 62)


def base_seeds(mtp_seed: int, n: int) -> list[int]:
    """Seed 0 first (often special-cased), then spread-out seeds of this run."""
    return [0] + [(mtp_seed * 7919 + 1_000_003 * r) % (1 << 40) for r in range(1, n)]


def seed_pair_series(backend, caps, prompts: list[list[int]], n_tokens: int, seeds: list[int],
                     rng: np.random.Generator, temperature: float = INDEPENDENCE_TEMPERATURE,
                     control: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each base seed, each pair shape and each lag: token agreement and
    PIT closeness (both radii) between the pair's two runs, concatenated over
    base seeds into one series per (pair, lag, kind). `rng` randomizes the
    PIT values (the suite's own generator, not the backend's). `control`: each
    pair's second seed replaced by an unrelated one (the empirical null)."""
    sp = SamplingParams(temperature=temperature)
    runs: dict[tuple[int, int], tuple] = {}

    def run(r: int, seed: int):
        if (r, seed) not in runs:
            prompt = prompts[r % len(prompts)]
            req = request(prompt, n_tokens, sp.model_copy(update={"seed": seed}), spec_for(caps), stop_token_ids=[])
            toks = backend.generate(req).tokens
            laws = backend.target_distributions(prompt, toks, sp)
            runs[r, seed] = toks, laws, None if caps.truncated_laws else pit_values(toks, laws, rng)
        return runs[r, seed]

    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(key, h, p):
        old = series.get(key)
        series[key] = (h, p) if old is None else (np.concatenate([old[0], h]), np.concatenate([old[1], p]))

    for r, base in enumerate(seeds):
        for name, pair in PAIRS.items():
            a, b = pair(base)
            b = unrelated(b) if control else b
            for key, (h, p) in run_pair_series(run(r, a), run(r, b), bool(caps.truncated_laws)).items():
                add(f"{name} {key}", h, p)
    return series


def run_pair_series(a: tuple, b: tuple, truncated: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Token agreement and PIT closeness of two runs (tokens, laws, PIT values) at each lag."""
    (ta, la, wa), (tb, lb, wb) = a, b
    out = {}
    for lag in LAGS:
        out[f"lag {lag}: tokens agree"] = agreement_series(ta, la, tb, lb, lag)
        if not truncated:  # a PIT value needs the whole law: top-N rows leave it undefined
            for delta in DELTAS:
                out[f"lag {lag}: PIT within {delta}"] = closeness_series(wa, wb, lag, delta)
    return out


def sample_pair_series(backend, caps, prompts: list[list[int]], n_tokens: int, seeds: list[int], n: int,
                       rng: np.random.Generator, temperature: float = INDEPENDENCE_TEMPERATURE,
                       control: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """SEED-SAMPLES-INDEPENDENT's series: for each base seed s, n samples of one
    request under s and n under s + 1 (generate_n); samples j and j + 1 of one
    request ("within a request") and every sample of s against every sample of
    s + 1 ("neighbouring seeds"), concatenated by kind and lag. `control`: the
    same pairs among 2n single requests under distinct unrelated seeds (the
    empirical null: the runtime's own law, without its n-sample path)."""
    sp = SamplingParams(temperature=temperature)
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(kind, found):
        for key, (h, p) in found.items():
            old = series.get(f"{kind}, {key}")
            series[f"{kind}, {key}"] = (h, p) if old is None else (np.concatenate([old[0], h]),
                                                                   np.concatenate([old[1], p]))

    def one(prompt, res):
        laws = backend.target_distributions(prompt, res.tokens, sp)
        return res.tokens, laws, None if caps.truncated_laws else pit_values(res.tokens, laws, rng)

    def req(prompt, seed):
        return request(prompt, n_tokens, sp.model_copy(update={"seed": seed}), spec_for(caps), stop_token_ids=[])

    for r, base in enumerate(seeds):
        prompt = prompts[r % len(prompts)]
        if control:
            # 2n single requests under distinct unrelated seeds: samples of one call may be the very
            # copies under test, and a copy paired n times would read as excess coincidence
            singles = [one(prompt, backend.generate(req(prompt, unrelated(base * 4 * n + i)))) for i in range(2 * n)]
            mine, partner = singles[:n], singles[n:]
            within = [mine[0], *partner[1:]]  # mine[j] against partner[j + 1]: two unrelated requests
        else:
            mine = [one(prompt, res) for res in backend.generate_n(req(prompt, base), n)]
            partner = [one(prompt, res) for res in backend.generate_n(req(prompt, base + 1), n)]
            within = mine
        for j in range(n - 1):
            add("within a request", run_pair_series(mine[j], within[j + 1], bool(caps.truncated_laws)))
        for j in range(n):
            for k in range(n):
                add("neighbouring seeds", run_pair_series(mine[j], partner[k], bool(caps.truncated_laws)))
    return series


# UNSEEDED-INDEPENDENT: strata of identical unseeded requests, each served
# UNSEEDED_COPIES times together and as many times alone. Six copies in four
# strata let complete sharing reach p = C(12, 6)^-4 = 1.4e-12; temperature 1
# over 12 tokens keeps the outputs apart on the fixtures (docs/statistics.md).
UNSEEDED_COPIES = 6
UNSEEDED_STRATA = 4
UNSEEDED_TOKENS = 12
UNSEEDED_SAMPLING = SamplingParams(temperature=1.0)


def unseeded_requests(caps, prompts: list[list[int]]) -> list:
    """One unseeded sampled request per stratum, the prompts cycled."""
    return [request(prompts[s % len(prompts)], UNSEEDED_TOKENS, UNSEEDED_SAMPLING, spec_for(caps), stop_token_ids=[])
            for s in range(UNSEEDED_STRATA)]


def served_alone(backend, reqs: list, copies: int = UNSEEDED_COPIES) -> list[list[tuple[int, ...]]]:
    """Each request `copies` times, one generate() call each."""
    return [[tuple(backend.generate(r).tokens) for _ in range(copies)] for r in reqs]


def samples_per_call(caps, wanted: int) -> int:
    """`wanted` samples of one generate_n call, or fewer where the backend
    declares a smaller max_parallel_samples (a runtime's slots)."""
    return min(wanted, caps.max_parallel_samples or wanted)


def served_together(backend, reqs: list, path: str, copies: int = UNSEEDED_COPIES) -> list[list[tuple[int, ...]]]:
    """Each request `copies` times in one call: all strata in one generate_batch
    (a stratum's copies adjacent, so that they are admitted, and in flight,
    together), or one generate_n per stratum (of at most the declared
    max_parallel_samples: the exact test takes groups of unequal size)."""
    if path == "generate_batch":
        res = backend.generate_batch([r for r in reqs for _ in range(copies)])
        return [[tuple(x.tokens) for x in res[s * copies:(s + 1) * copies]] for s in range(len(reqs))]
    if path == "generate_n":
        n = samples_per_call(backend.capabilities(), copies)
        return [[tuple(x.tokens) for x in backend.generate_n(r, n)] for r in reqs]
    raise ValueError(f"path {path!r}: expected one of {', '.join(TOGETHER_PATHS)}")
