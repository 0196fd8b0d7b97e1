"""Hypothesis strategies for downstream suites: sampling parameters,
probability vectors and speculation requests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from mtpcheck.contracts import SamplingParams, SpeculationRequest


def sampling_params(greedy: bool = True, penalties: bool = False) -> st.SearchStrategy[SamplingParams]:
    """Sampling controls that speculation must honour (no penalties unless asked)."""
    temps = st.sampled_from([0.0, 0.5, 1.0, 1.5]) if greedy else st.sampled_from([0.5, 0.8, 1.0, 1.5])
    base = st.builds(
        SamplingParams,
        temperature=temps,
        top_k=st.one_of(st.none(), st.integers(1, 50)),
        top_p=st.one_of(st.none(), st.sampled_from([0.5, 0.8, 0.95, 1.0])),
        min_p=st.one_of(st.none(), st.sampled_from([0.0, 0.02, 0.1])),
    )
    if not penalties:
        return base
    return st.builds(
        lambda sp, rp, pp: sp.model_copy(update={"repetition_penalty": rp, "presence_penalty": pp}),
        base, st.sampled_from([None, 1.0, 1.3]), st.sampled_from([None, 0.0, 0.5]),
    )


def distributions(vocab: int, allow_zeros: bool = True) -> st.SearchStrategy[np.ndarray]:
    """Probability vectors with the awkward cases: zeros, ties, one-hot."""
    weights = st.sampled_from([0.0, 1.0, 1.0, 2.0, 0.5, 1e-6]) if allow_zeros else st.sampled_from([1.0, 2.0, 0.5, 1e-3])
    one_hot = st.integers(0, vocab - 1).map(lambda i: np.eye(vocab)[i])
    general = st.lists(weights, min_size=vocab, max_size=vocab).filter(lambda w: sum(w) > 0).map(
        lambda w: np.asarray(w, dtype=np.float64) / sum(w)
    )
    return st.one_of(one_hot, general)


def speculation_requests(max_depth: int = 5) -> st.SearchStrategy[SpeculationRequest]:
    return st.one_of(
        st.just(SpeculationRequest(mode="off")),
        st.builds(SpeculationRequest, mode=st.just("native_mtp"),
                  num_draft_tokens=st.one_of(st.none(), st.integers(1, max_depth))),
    )
