"""Sampling: processing order, exact inverse-CDF draws, position-addressed keys."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpcheck.contracts import SamplingParams
from mtpcheck.engine.sampling import STREAM_DRAFT, STREAM_TARGET, process, sample, uniform


def cell_masses(probs):
    """Exact measure of {u in [0,1): sample(probs, u) == i}, found from the
    breakpoints of the draw (sample is a step function of u)."""
    cdf = np.cumsum(probs) / np.sum(probs)
    edges = np.concatenate([[0.0], cdf])
    out = np.zeros(len(probs))
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if hi > lo:
            out[sample(probs, (lo + hi) / 2)] += hi - lo
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.1, 0.25, 0.5, 1.0, 3.0]), min_size=1, max_size=9).filter(lambda w: sum(w) > 0))
def test_sample_realises_its_law_exactly(weights):
    p = np.array(weights) / sum(weights)
    np.testing.assert_allclose(cell_masses(p), p, atol=1e-12)
    assert all(p[sample(p, u)] > 0 for u in (0.0, 0.5, 1 - 2**-53))


def test_processing_order_and_filters():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))
    np.testing.assert_allclose(process(logits, SamplingParams(temperature=1.0)), [0.4, 0.3, 0.2, 0.06, 0.04])
    np.testing.assert_allclose(process(logits, SamplingParams(top_k=2)), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0])
    np.testing.assert_allclose(process(logits, SamplingParams(top_p=0.7)), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0])
    np.testing.assert_allclose(process(logits, SamplingParams(top_p=0.71)), [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0, 0])
    np.testing.assert_allclose(process(logits, SamplingParams(min_p=0.5)), [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0, 0])
    # top-k before top-p: top_p applies to the renormalised top-k law
    np.testing.assert_allclose(process(logits, SamplingParams(top_k=3, top_p=0.5)), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0])
    t2 = process(logits, SamplingParams(temperature=2.0))
    np.testing.assert_allclose(t2, np.sqrt([0.4, 0.3, 0.2, 0.06, 0.04]) / np.sqrt([0.4, 0.3, 0.2, 0.06, 0.04]).sum())
    np.testing.assert_array_equal(process(np.array([1.0, 3.0, 3.0]), SamplingParams(temperature=0.0)), [0, 1, 0])


def test_penalties_only_touch_the_history():
    logits = np.zeros(4)
    p = process(logits, SamplingParams(presence_penalty=1.0), history=[2, 2])
    assert p[2] < p[0] == p[1] == p[3]
    p = process(logits + 1.0, SamplingParams(repetition_penalty=2.0), history=[1])
    assert p[1] < p[0]


def test_uniform_is_position_addressed_and_streams_are_independent():
    us = [uniform(1, STREAM_TARGET, n) for n in range(2000)]
    assert uniform(1, STREAM_TARGET, 5) == us[5]  # a pure function of its key
    assert 0.0 <= min(us) and max(us) < 1.0
    assert abs(np.mean(us) - 0.5) < 0.03
    # additive seed+position mixing would make these equal
    assert uniform(1, STREAM_TARGET, 6) != uniform(2, STREAM_TARGET, 5)
    assert uniform(1, STREAM_TARGET, 5) != uniform(1, STREAM_DRAFT, 5)
    a = np.array([uniform(9, STREAM_TARGET, n) for n in range(2000)])
    b = np.array([uniform(9, STREAM_DRAFT, n) for n in range(2000)])
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.1


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0.7, top_k=3), SamplingParams(top_p=0.8, min_p=0.1)])
def test_processed_laws_are_normalised(sp):
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = process(rng.normal(size=17) * 3, sp)
        assert p.min() >= 0 and abs(p.sum() - 1) < 1e-12
