"""Exact laws: the lossless rules reproduce the target law in float64, the
engine's `verify` realises the rules' analytic laws, and broken rules
(mutants) are caught."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mtpcheck.engine.acceptance import (
    RULES,
    Verdict,
    rejection_accept_probability,
    rejection_correction,
)
from mtpcheck.engine.sampling import sample
from mtpcheck.laws.exact import (
    ToyModel,
    acceptance_probability,
    block_law,
    distribution_pairs,
    max_law_error,
    rule_law_problems,
    stream_law,
    stream_law_error,
    target_law,
    toy_models,
    verify_law,
    verify_law_error,
)

TOL = 1e-12
RULE_NAMES = sorted(RULES)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- mutants
@dataclass(frozen=True)
class Mutant:
    name: str
    accept_probability: Any
    correction: Any
    verify: Any = None


def _onehot(V: int, i: int) -> np.ndarray:
    e = np.zeros(V)
    e[i] = 1.0
    return e


def _residual_raw(p, q, d):
    return np.maximum(p - q, 0.0)  # B04: never normalised


def _residual_leftover_on_argmax(p, q, d):
    r = np.maximum(p - q, 0.0)  # B04: "renormalised" by dumping the rest on argmax p
    r[int(np.argmax(p))] += 1.0 - r.sum()
    return r


def _residual_softmax(p, q, d):
    r = np.maximum(p - q, 0.0)  # B04: softmax of the residual
    e = np.exp(r - r.max())
    return e / e.sum()


def _ratio_inverted(p, q, d):
    return min(1.0, q[d] / p[d]) if p[d] > 0 else 0.0


MUTANTS = {
    # B04: residual drawn from p instead of (p - q)+
    "residual_from_p": Mutant(
        "residual_from_p", rejection_accept_probability, lambda p, q, d: p.copy()
    ),
    "residual_unnormalised": Mutant(
        "residual_unnormalised", rejection_accept_probability, _residual_raw
    ),
    "residual_leftover_on_argmax": Mutant(
        "residual_leftover_on_argmax", rejection_accept_probability, _residual_leftover_on_argmax
    ),
    "residual_softmax": Mutant("residual_softmax", rejection_accept_probability, _residual_softmax),
    # the ratio the wrong way round: min(1, q/p)
    "ratio_inverted": Mutant("ratio_inverted", _ratio_inverted, rejection_correction),
    # B13: deterministic threshold - accept iff p >= q
    "threshold_accept": Mutant(
        "threshold_accept", lambda p, q, d: 1.0 if p[d] >= q[d] else 0.0, rejection_correction
    ),
    # B03: argmax verification at T > 0; the correction is the target's argmax
    "argmax_verification": Mutant(
        "argmax_verification",
        lambda p, q, d: 1.0 if d == int(np.argmax(p)) else 0.0,
        lambda p, q, d: _onehot(len(p), int(np.argmax(p))),
    ),
}

# A fixed model with no zeros and p != q in every row: every mutant above
# changes the stream law on it.
P3 = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5], [0.6, 0.3, 0.1]])
Q3 = np.array([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2], [0.3, 0.4, 0.3], [0.1, 0.6, 0.3]])
MODEL3 = ToyModel(P3, Q3)


# ---------------------------------------------------------------- laws
@pytest.mark.parametrize("name", RULE_NAMES)
@FAST
@given(model=toy_models(2, 6), depth=st.integers(1, 4), n_tokens=st.integers(1, 4))
def test_stream_law_equals_target_law(name, model, depth, n_tokens):
    n_tokens = min(n_tokens, 3 if model.vocab > 4 else 4)
    s = stream_law(model, RULES[name], depth, n_tokens)
    t = target_law(model, n_tokens)
    assert max_law_error(s, t) <= TOL
    assert abs(sum(s.values()) - 1.0) <= TOL


@pytest.mark.parametrize("name", RULE_NAMES)
@settings(max_examples=4, deadline=None)
@given(model=toy_models(8, 8))
def test_stream_law_vocab8_depth4_five_tokens(name, model):
    assert stream_law_error(model, RULES[name], 4, 5) <= TOL


def test_stream_law_small_cases_by_hand():
    # V=2, depth 1: enumerate the chain by hand for the first token and pair.
    p = np.array([[0.7, 0.3], [0.4, 0.6], [0.9, 0.1]])
    q = np.array([[0.2, 0.8], [0.5, 0.5], [0.5, 0.5]])
    model = ToyModel(p, q)
    law = stream_law(model, RULES["rejection"], 1, 2)
    for a in range(2):
        for b in range(2):
            assert law[(a, b)] == pytest.approx(p[2][a] * p[a][b], abs=TOL)
    assert target_law(model, 0) == {(): 1.0}
    assert stream_law(model, RULES["rejection"], 1, 0) == {(): 1.0}


@FAST
@given(st.integers(2, 8).flatmap(distribution_pairs))
def test_acceptance_probability(pq):
    p, q = pq
    assert acceptance_probability(p, q, RULES["rejection"]) == pytest.approx(
        np.minimum(p, q).sum(), abs=TOL
    )
    assert acceptance_probability(p, q, RULES["exact_match"]) == pytest.approx(
        (p * q).sum(), abs=TOL
    )


# ---------------------------------------------------------------- verify realises the laws
@st.composite
def blocks(draw, max_vocab=6, max_depth=3):
    V = draw(st.integers(2, max_vocab))
    k = draw(st.integers(1, max_depth))
    pairs = [draw(distribution_pairs(V)) for _ in range(k + 1)]
    ps = np.stack([a for a, _ in pairs])
    qs = np.stack([b for _, b in pairs[:k]])
    proposals = [draw(st.sampled_from(np.flatnonzero(qs[j] > 0).tolist())) for j in range(k)]
    return ps, qs, proposals


@pytest.mark.parametrize("name", RULE_NAMES)
@FAST
@given(block=blocks())
def test_verify_realises_laws_given_proposals(name, block):
    ps, qs, proposals = block
    rule = RULES[name]
    vl = verify_law(rule, ps, qs, proposals)
    assert max_law_error(vl, block_law(rule, ps, qs, proposals)) <= TOL
    assert abs(sum(vl.values()) - 1.0) <= TOL


@pytest.mark.parametrize("name", RULE_NAMES)
@settings(max_examples=15, deadline=None)
@given(block=blocks(max_vocab=4, max_depth=2))
def test_verify_realises_laws_marginal(name, block):
    ps, qs, _ = block
    assert verify_law_error(RULES[name], ps, qs) <= TOL


@pytest.mark.parametrize("name", RULE_NAMES)
def test_verify_marginal_depth3(name):
    rng = np.random.default_rng(5)
    ps = rng.dirichlet(np.ones(4), 4)
    qs = rng.dirichlet(np.ones(4), 3)
    qs[1, 2] = 0.0
    qs[1] /= qs[1].sum()
    ps[0] = [0.0, 0.5, 0.5, 0.0]
    assert verify_law_error(RULES[name], ps, qs) <= TOL


def test_block_law_marginal_first_token_is_p():
    # Both lossless rules: whatever happens in the block, the first emitted
    # token (proposal 0 if accepted, else the correction) is distributed as ps[0].
    rng = np.random.default_rng(1)
    ps = rng.dirichlet(np.ones(5), 3)
    qs = rng.dirichlet(np.ones(5), 2)
    for rule in RULES.values():
        first = np.zeros(5)
        for d in range(5):
            a = rule.accept_probability(ps[0], qs[0], d)
            first[d] += qs[0][d] * a
            first += qs[0][d] * (1 - a) * rule.correction(ps[0], qs[0], d)
        np.testing.assert_allclose(first, ps[0], atol=TOL)
        law = block_law(rule, ps, qs)
        assert sum(law.values()) == pytest.approx(1.0, abs=TOL)


# ---------------------------------------------------------------- the checks can fail
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_rule_breaks_stream_law(mutant):
    err = stream_law_error(MODEL3, MUTANTS[mutant], 2, 3)
    assert err > 1e-6, f"{mutant}: law error {err}"


@pytest.mark.parametrize("mutant", ["residual_from_p", "threshold_accept", "argmax_verification"])
def test_property_fails_on_mutant(mutant):
    """The property test above, run on a mutant, fails (generation only: no
    shrinking, to keep it fast)."""

    @settings(max_examples=100, deadline=None, database=None, phases=[Phase.generate])
    @given(model=toy_models(2, 4))
    def prop(model):
        assert stream_law_error(model, MUTANTS[mutant], 1, 2) <= TOL

    with pytest.raises(AssertionError):
        prop()


def test_unclipped_ratio_is_named_by_rule_law_problems():
    """p/q without min(1, .): the signed law composition cancels exactly (and a
    verify testing u < p/q behaves as min(1, p/q)), so the stream law cannot
    see it; the law sanity check does."""
    unclipped = Mutant("ratio_unclipped", lambda p, q, d: float(p[d] / q[d]), rejection_correction)
    assert stream_law_error(MODEL3, unclipped, 2, 3) <= TOL
    assert any("not in [0, 1]" in s for s in rule_law_problems(unclipped, P3[0], Q3[0]))
    for name in RULE_NAMES:
        for p, q in zip(P3, Q3, strict=True):
            assert rule_law_problems(RULES[name], p, q) == []
    raw = MUTANTS["residual_unnormalised"]
    assert any("not a probability vector" in s for s in rule_law_problems(raw, P3[0], Q3[0]))


@FAST
@given(st.integers(2, 6).flatmap(distribution_pairs))
def test_lossless_rules_have_sane_laws(pq):
    p, q = pq
    for name in RULE_NAMES:
        assert rule_law_problems(RULES[name], p, q) == []


def test_argmax_draft_verified_as_sampled_breaks_stream_law():
    # B01: proposals are argmax q, but the rule is told q; a correct rule then
    # produces the wrong law.
    draft = np.stack([_onehot(3, int(np.argmax(row))) for row in Q3])
    broken = ToyModel(P3, Q3, draft_table=draft)
    assert stream_law_error(broken, RULES["rejection"], 2, 3) > 1e-6
    assert stream_law_error(ToyModel(P3, Q3, draft_table=Q3), RULES["rejection"], 2, 3) <= TOL


def test_exact_match_acceptance_gap_is_not_a_law_error():
    # exact_match accepts less, and is still lossless.
    p, q = P3[3], Q3[3]
    assert acceptance_probability(p, q, RULES["exact_match"]) < acceptance_probability(
        p, q, RULES["rejection"]
    )
    assert stream_law_error(MODEL3, RULES["exact_match"], 3, 4) <= TOL


# verify-level mutants: the laws are right, the decision procedure is not
def _verify_residual_from_p(ps, qs, proposals, accept_uniforms, target_uniforms):
    for j, d in enumerate(proposals):
        if not accept_uniforms[j] < rejection_accept_probability(ps[j], qs[j], d):
            return Verdict(j, sample(ps[j], target_uniforms[j]), "correction", ps[j])
    k = len(proposals)
    return Verdict(k, sample(ps[k], target_uniforms[k]), "bonus", ps[k])


def _verify_reuses_accept_uniform(ps, qs, proposals, accept_uniforms, target_uniforms):
    for j, d in enumerate(proposals):
        if not accept_uniforms[j] < rejection_accept_probability(ps[j], qs[j], d):
            law = rejection_correction(ps[j], qs[j], d)
            return Verdict(j, sample(law, accept_uniforms[j]), "correction", law)
    k = len(proposals)
    return Verdict(k, sample(ps[k], target_uniforms[k]), "bonus", ps[k])


def _verify_bonus_from_last_position(ps, qs, proposals, accept_uniforms, target_uniforms):
    for j, d in enumerate(proposals):  # B07: bonus drawn from p_k-1 instead of p_k
        if not accept_uniforms[j] < rejection_accept_probability(ps[j], qs[j], d):
            law = rejection_correction(ps[j], qs[j], d)
            return Verdict(j, sample(law, target_uniforms[j]), "correction", law)
    k = len(proposals)
    return Verdict(k, sample(ps[k - 1], target_uniforms[k]), "bonus", ps[k - 1])


def _verify_skips_first(ps, qs, proposals, accept_uniforms, target_uniforms):
    for j, d in enumerate(proposals):  # B06: first proposal never verified
        if j == 0:
            continue
        if not accept_uniforms[j] < rejection_accept_probability(ps[j], qs[j], d):
            law = rejection_correction(ps[j], qs[j], d)
            return Verdict(j, sample(law, target_uniforms[j]), "correction", law)
    k = len(proposals)
    return Verdict(k, sample(ps[k], target_uniforms[k]), "bonus", ps[k])


VERIFY_MUTANTS = {
    "residual_from_p": _verify_residual_from_p,
    "reuses_accept_uniform": _verify_reuses_accept_uniform,
    "bonus_from_last_position": _verify_bonus_from_last_position,
    "skips_first": _verify_skips_first,
}


@pytest.mark.parametrize("mutant", sorted(VERIFY_MUTANTS))
def test_mutant_verify_breaks_verify_law(mutant):
    rej = RULES["rejection"]
    broken = Mutant(mutant, rej.accept_probability, rej.correction, VERIFY_MUTANTS[mutant])
    ps = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    qs = np.array([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]])
    assert verify_law_error(rej, ps, qs) <= TOL
    err = verify_law_error(broken, ps, qs)
    assert err > 1e-6, f"{mutant}: verify law error {err}"


def test_verify_law_walk_is_exact_on_a_hand_example():
    # k=1, V=2; rejection: a(d=0) = min(1, .3/.6) = .5, a(d=1) = 1.
    ps = np.array([[0.3, 0.7], [0.25, 0.75]])
    qs = np.array([[0.6, 0.4]])
    law = verify_law(RULES["rejection"], ps, qs)
    expected = {(0, 1): 0.6 * 0.5, (1, 0): (0.3 + 0.4) * 0.25, (1, 1): (0.3 + 0.4) * 0.75}
    assert max_law_error(law, expected) <= TOL
