"""Statistical tests: null runs pass, the false-alarm rate is calibrated, the
power claims hold against a real mutant law, zero-probability tokens fail."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from mtpcheck.laws.stats import (
    MIN_EXPECTED,
    SUITE_ALPHA,
    ObservationBatch,
    TestResult,
    alpha_for,
    bonferroni,
    detectable_tv,
    observations,
    pit_ks,
    rank_gtest,
    samples_for_tv,
    zero_probability_violations,
)

V = 10
RANK_BINS_V10 = 6  # ranks 0, 1, 2, 3-4, 5-8, 9


def draw(P: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of P, inverse CDF."""
    cdf = np.cumsum(P, axis=1)
    u = rng.random(len(P))[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), P.shape[1] - 1)


def random_laws(n: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """Heterogeneous laws: Dirichlet(0.5) with some zeros, ties and one-hot rows."""
    P = rng.dirichlet(np.full(vocab, 0.5), n)
    P[rng.random((n, vocab)) < 0.15] = 0.0
    ties = rng.random(n) < 0.1
    P[ties, :3] = P[ties, :1]
    onehot = rng.random(n) < 0.05
    P[onehot] = 0.0
    P[onehot, rng.integers(0, vocab, onehot.sum())] = 1.0
    empty = P.sum(axis=1) == 0
    P[empty, 0] = 1.0
    return P / P.sum(axis=1, keepdims=True)


def ci999(count: int, runs: int):
    return stats.binomtest(count, runs).proportion_ci(0.999, method="exact")


# ---------------------------------------------------------------- null runs
@pytest.mark.parametrize("seed", range(5))
def test_null_runs_pass_at_suite_alpha(seed):
    rng = np.random.default_rng(seed)
    P = random_laws(3000, V, rng)
    batch = ObservationBatch(draw(P, rng), P)
    for res in (rank_gtest(batch, alpha=SUITE_ALPHA), pit_ks(batch, rng_seed=seed)):
        assert res.passed, res
        assert res.n_dropped > 0 and res.n + res.n_dropped == 3000
    assert zero_probability_violations(batch) == []


def test_null_run_mixed_vocabularies_as_pairs():
    rng = np.random.default_rng(11)
    obs = []
    for vocab in (3, 10, 40, 1000):
        P = random_laws(400, vocab, rng)
        obs += observations(draw(P, rng), P)
    res = rank_gtest(obs)
    assert res.passed and res.df >= 3, res
    assert pit_ks(obs, rng_seed=1).passed


def test_null_calibration_permuted_contexts():
    """Contexts whose laws are permutations of one law: the rank counts are
    exactly multinomial, so the false-alarm rate at 0.05 must be 0.05 (inside
    the 99.9% Clopper-Pearson interval of the observed rate)."""
    rng = np.random.default_rng(2024)
    base = rng.dirichlet(np.full(V, 0.7))
    runs, n, alarms_g, alarms_ks = 200, 300, 0, 0
    for r in range(runs):
        P = np.stack([rng.permutation(base) for _ in range(n)])
        batch = ObservationBatch(draw(P, rng), P)
        alarms_g += not rank_gtest(batch, alpha=0.05).passed
        alarms_ks += not pit_ks(batch, rng_seed=r, alpha=0.05).passed
    for alarms in (alarms_g, alarms_ks):
        ci = ci999(alarms, runs)
        assert ci.low <= 0.05 <= ci.high, (alarms_g, alarms_ks)


def test_null_calibration_heterogeneous_contexts():
    """Heterogeneous laws pooled in rank space: the G-test may only be
    conservative (rate not above 0.05); randomized PIT + KS is exact."""
    rng = np.random.default_rng(7)
    runs, n, alarms_g, alarms_ks = 200, 300, 0, 0
    for r in range(runs):
        P = random_laws(n, V, rng)
        batch = ObservationBatch(draw(P, rng), P)
        alarms_g += not rank_gtest(batch, alpha=0.05).passed
        alarms_ks += not pit_ks(batch, rng_seed=r, alpha=0.05).passed
    assert ci999(alarms_g, runs).low <= 0.05, alarms_g
    ci = ci999(alarms_ks, runs)
    assert ci.low <= 0.05 <= ci.high, alarms_ks


# ---------------------------------------------------------------- power
def _rank_bin_law(r: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Law of the rank bin (ranks under p) of a token drawn from r."""
    order = np.argsort(-p, kind="stable")
    return np.add.reduceat(r[order], [0, 1, 2, 3, 5, 9])


def _mutant_contexts(n_contexts: int, rng: np.random.Generator):
    """(p, r) per context: r is the first-token law of rejection sampling with
    the residual drawn from p instead of (p - q)+ (bug class B04)."""
    out = []
    for _ in range(n_contexts):
        p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
        m = np.minimum(p, q)
        out.append((p, m + (1.0 - m.sum()) * p))
    return out


@pytest.mark.parametrize("target_tv", [0.1, 0.05])
def test_power_against_residual_from_p(target_tv):
    """Mix the mutant law into p so that the pooled rank-bin TV is exactly
    target_tv, draw as many observations as samples_for_tv says is enough for
    power 0.99 at alpha 1e-6: every seeded run is rejected."""
    rng = np.random.default_rng(99)
    ctx = _mutant_contexts(4, rng)
    p_bins = np.mean([_rank_bin_law(p, p) for p, _ in ctx], axis=0)
    r_bins = np.mean([_rank_bin_law(r, p) for p, r in ctx], axis=0)
    full_tv = 0.5 * np.abs(r_bins - p_bins).sum()
    assert full_tv > target_tv  # the pure mutant is further away still
    s = target_tv / full_tv  # r_s = p + s (r - p) has pooled rank-bin TV = target_tv
    n = samples_for_tv(target_tv, RANK_BINS_V10, 1e-6)
    assert n == pytest.approx({0.1: 1613, 0.05: 6447}[target_tv], rel=0.01)
    P = np.stack([ctx[i % 4][0] for i in range(n)])
    R = np.stack([ctx[i % 4][0] + s * (ctx[i % 4][1] - ctx[i % 4][0]) for i in range(n)])
    for seed in range(5):
        res = rank_gtest(ObservationBatch(draw(R, np.random.default_rng(seed)), P), alpha=1e-6)
        assert res.df == RANK_BINS_V10 - 1
        assert res.detectable_tv <= target_tv
        assert not res.passed, res
    # and the same sizes pass the correct law
    for seed in range(3):
        res = rank_gtest(ObservationBatch(draw(P, np.random.default_rng(seed)), P), alpha=1e-6)
        assert res.passed, res


def test_pit_ks_catches_the_mutant_with_more_samples():
    rng = np.random.default_rng(5)
    ctx = _mutant_contexts(4, rng)
    n = 4 * samples_for_tv(0.1, RANK_BINS_V10, 1e-6)
    P = np.stack([ctx[i % 4][0] for i in range(n)])
    R = np.stack([ctx[i % 4][1] for i in range(n)])
    res = pit_ks(ObservationBatch(draw(R, rng), P), rng_seed=3)
    assert not res.passed and res.detectable_tv is None
    assert res.details["detectable_pit_sup"] == pytest.approx(4.32 / math.sqrt(n), rel=0.01)


def test_detectable_tv_monotone_and_inverse():
    ns = [10, 30, 100, 300, 1000, 3000, 10_000, 100_000]
    for bins in (2, 6, 20):
        tvs = [detectable_tv(n, bins, 1e-6) for n in ns]
        assert all(a > b for a, b in zip(tvs, tvs[1:], strict=False)), tvs
    assert detectable_tv(1000, 6, 1e-6) > detectable_tv(1000, 6, 1e-3)
    assert detectable_tv(1000, 20, 1e-6) > detectable_tv(1000, 6, 1e-6)
    assert detectable_tv(1000, 6, 1e-6, power=0.999) > detectable_tv(1000, 6, 1e-6, power=0.9)
    for tv in (0.3, 0.1, 0.05, 0.01):
        n = samples_for_tv(tv, 6, 1e-6)
        assert detectable_tv(n, 6, 1e-6) <= tv < detectable_tv(n - 1, 6, 1e-6)
    assert detectable_tv(0, 6, 1e-6) == math.inf


# ---------------------------------------------------------------- immediate failures
def test_zero_probability_violation():
    P = np.tile([0.5, 0.5, 0.0, 0.0], (50, 1))
    tokens = np.zeros(50, dtype=int)
    tokens[17] = 2
    tokens[30] = 7  # outside the vocabulary
    batch = ObservationBatch(tokens, P)
    assert zero_probability_violations(batch) == [17, 30]
    assert zero_probability_violations(list(batch)) == [17, 30]
    for res in (rank_gtest(batch), pit_ks(batch)):
        assert not res.passed and res.p_value == 0.0
        assert res.details["zero_probability_indices"] == [17, 30]
    ok = ObservationBatch(np.array([0, 1] * 25), P)
    assert zero_probability_violations(ok) == []


def test_deterministic_observations_are_dropped_and_counted():
    onehot = np.eye(V)[np.arange(40) % V]
    res = rank_gtest(ObservationBatch(np.arange(40) % V, onehot))
    assert res.passed and res.n == 0 and res.n_dropped == 40 and res.detectable_tv is None
    # a greedy stream that is wrong is a zero-probability violation, not a statistic
    assert not rank_gtest(ObservationBatch((np.arange(40) + 1) % V, onehot)).passed


def test_bins_respect_min_expected_and_cap():
    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.full(64, 0.3), 2000)
    batch = ObservationBatch(draw(P, rng), P)
    res = rank_gtest(batch)
    assert min(res.details["expected"]) >= MIN_EXPECTED
    assert sum(res.details["observed"]) == res.n == 2000
    assert res.details["bins"][0] == [0, 0] and res.details["bins"][-1][1] == 63
    capped = rank_gtest(batch, n_bins=3)
    assert capped.df == 2 and capped.details["bins"][-1][1] == 63
    assert rank_gtest(ObservationBatch(batch.tokens[:8], P[:8])).df == 0  # too few: no test


def test_alpha_budget():
    assert SUITE_ALPHA == 1e-6
    assert bonferroni(1e-6, 4) == pytest.approx(2.5e-7)
    assert alpha_for(10) == pytest.approx(1e-7)
    with pytest.raises(ValueError):
        bonferroni(1e-6, 0)


def test_result_is_json_serialisable():
    rng = np.random.default_rng(0)
    P = random_laws(500, V, rng)
    res = rank_gtest(ObservationBatch(draw(P, rng), P))
    d = json.loads(json.dumps(res.as_dict(), allow_nan=False))
    assert set(d) >= {
        "name", "alpha", "n", "statistic", "p_value", "df", "detectable_tv", "passed", "note",
    }  # fmt: skip
    assert TestResult.model_validate(d) == res
    bad = rank_gtest(ObservationBatch([2], np.array([[0.5, 0.5, 0.0]])))
    d = bad.as_dict()
    assert d["passed"] is False and d["statistic"] == "Infinity"
    json.dumps(d, allow_nan=False)
    assert TestResult.model_validate(d) == bad
