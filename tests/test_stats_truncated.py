"""Truncated ground truth (top N + the tail mass): the coarsened rank G-test
and PIT stay exact under the null, still catch a broken sampler, and equal
the whole-law tests when nothing is cut."""

from __future__ import annotations

import numpy as np
import pytest

from mtpcheck.laws.stats import (
    ObservationBatch,
    pit_ks,
    rank_gtest,
    truncate_laws,
    truncated_pit_ks,
    truncated_rank_gtest,
    truncated_zero_probability_violations,
)

V = 64


def _laws(rng, n, temp=1.0):
    logits = rng.normal(0, 2.0, size=(n, V))
    p = np.exp(logits / temp)
    return p / p.sum(axis=1, keepdims=True)


def _draw(rng, P):
    c = np.cumsum(P, axis=1)
    return np.minimum((rng.random(len(P))[:, None] > c).sum(axis=1), P.shape[1] - 1)


def test_truncate_keeps_the_top_n_by_probability_then_id():
    P = np.array([[0.1, 0.4, 0.1, 0.4]])
    assert truncate_laws(P, 2).tolist() == [[0.0, 0.4, 0.0, 0.4]]
    assert truncate_laws(P, 3).tolist() == [[0.1, 0.4, 0.0, 0.4]]


@pytest.mark.parametrize("top_n", [1, 5, 20])
def test_null_p_values_are_not_too_small(top_n):
    """Under the null both tests reject at about their level (here 0.05, 80 runs)."""
    rng = np.random.default_rng(top_n)
    rejects_g = rejects_ks = 0
    for r in range(80):
        P = _laws(rng, 200)
        obs = ObservationBatch(_draw(rng, P), truncate_laws(P, top_n))
        rejects_g += truncated_rank_gtest(obs, top_n, alpha=0.05).p_value < 0.05
        rejects_ks += truncated_pit_ks(obs, top_n, rng_seed=r, alpha=0.05).p_value < 0.05
    # binomial(80, 0.05): mean 4, P(X > 14) < 1e-4
    assert rejects_g <= 14 and rejects_ks <= 14, (rejects_g, rejects_ks)


@pytest.mark.parametrize("top_n", [5, 20])
def test_a_hotter_sampler_is_caught_through_the_truncated_laws(top_n):
    rng = np.random.default_rng(1)
    P = _laws(rng, 4000)
    hot = _laws(np.random.default_rng(1), 4000, temp=1.3)  # same logits, temperature 1.3
    obs = ObservationBatch(_draw(rng, hot), truncate_laws(P, top_n))
    assert not truncated_rank_gtest(obs, top_n, alpha=1e-6).passed
    assert not truncated_pit_ks(obs, top_n, rng_seed=0, alpha=1e-6).passed


def test_whole_laws_give_the_whole_law_tests():
    rng = np.random.default_rng(3)
    P = _laws(rng, 2000)
    obs = ObservationBatch(_draw(rng, P), P)
    assert truncated_rank_gtest(obs, V).p_value == pytest.approx(rank_gtest(obs).p_value)
    assert truncated_pit_ks(obs, V, rng_seed=5).p_value == pytest.approx(pit_ks(obs, rng_seed=5).p_value)


def test_only_provable_zeros_count():
    P = np.array([[0.5, 0.5, 0.0, 0.0], [0.6, 0.3, 0.0, 0.0]])  # row 0: no tail; row 1: tail 0.1
    assert truncated_zero_probability_violations(ObservationBatch(np.array([2, 3]), P), 2) == [0]
    assert not truncated_rank_gtest(ObservationBatch(np.array([2, 0]), P), 2).passed


def test_a_row_with_more_than_n_entries_is_refused():
    with pytest.raises(ValueError, match="more than top_n=1"):
        truncated_rank_gtest(ObservationBatch(np.array([0]), np.array([[0.5, 0.5]])), 1)
