"""The exact-law simulator behind docs/power.md section E: the emitted law it
computes is lossless for a correct drafter and biased for one that reports
the wrong law; its simulated runs are the suite's staged test."""

import numpy as np
import pytest

from mtpcheck.engine.acceptance import get_rule
from research.context_exact import ExactContexts, emitted_law, simulate


def _law(rng, v, conc=0.5):
    return rng.dirichlet(np.full(v, conc))


@pytest.mark.parametrize("rule", ["rejection", "exact_match"])
def test_a_correct_drafter_emits_the_target_law(rule):
    rng = np.random.default_rng(3)
    for _ in range(50):
        p, q = _law(rng, 9), _law(rng, 9)
        q[rng.integers(9)] = 0.0  # a filtered draft law has zeros
        q /= q.sum()
        assert np.abs(emitted_law(p, q, q, get_rule(rule)) - p).max() < 1e-12


def test_a_wrongly_reported_draft_law_biases_the_rejection_rule():
    """Proposals from top-3 of q, verified against q itself (the
    draft-law-unfiltered bug): the emitted law leans to q's favourites."""
    rng = np.random.default_rng(4)
    p, q_rep = _law(rng, 8), _law(rng, 8)
    q = np.where(q_rep >= np.sort(q_rep)[-3], q_rep, 0.0)
    q /= q.sum()
    pi = emitted_law(p, q, q_rep, get_rule("rejection"))
    assert abs(pi.sum() - 1) < 1e-12 and 0.5 * np.abs(pi - p).sum() > 0.01
    top = np.argsort(-q_rep)[:3]
    assert pi[top].sum() > p[top].sum()


def _toy_exact(rng, v=6, tilt=0.0):
    """An ExactContexts built by hand: one prompt, prefill laws p0, per t a
    target law and a tilted emitted law; every later position draws from p."""
    e = ExactContexts.__new__(ExactContexts)
    e.prompt = [1, 2]
    e.p0 = np.array([0.5, 0.3, 0.2] + [0.0] * (v - 3))
    laws_at = {t: _law(rng, v, 2.0) for t in range(v)}
    e.p = {t: laws_at[t] for t in range(3)}
    e.pi = {}
    for t in range(3):
        w = e.p[t] * np.exp(tilt * np.arange(v))
        e.pi[t] = w / w.sum()

    def laws(prompt, cont):  # law at i: a function of cont[:i] only, like target_distributions
        def at(i):
            return e.p0 if i == 0 else laws_at[cont[0]] if i == 1 else _law(np.random.default_rng(cont[:i]), v, 2.0)
        return np.stack([at(i) for i in range(len(cont))])

    e.laws = laws
    return e, laws


def test_simulated_runs_pass_a_correct_law_and_catch_a_tilt():
    rng = np.random.default_rng(5)
    e, laws = _toy_exact(rng)
    prompts = {"a": e.prompt}
    clean = simulate({"a": e}, prompts, laws, 1, 40, 400, 1e-4, scale=0.0, reps=10, seed=1)
    assert clean["rate"] == 0.0
    e2, laws2 = _toy_exact(np.random.default_rng(5), tilt=0.6)
    bad = simulate({"a": e2}, prompts, laws2, 1, 40, 400, 1e-4, scale=1.0, reps=10, seed=1)
    assert bad["rate"] >= 0.8


def test_draws_follow_the_scaled_law():
    rng = np.random.default_rng(6)
    e, _ = _toy_exact(rng, tilt=0.8)
    toks = np.array(e.draw(np.random.default_rng(7), 20_000, 0.5))
    assert toks.shape == (20_000, 3)
    t0 = toks[:, 0] == 0
    want = e.p[0] + 0.5 * (e.pi[0] - e.p[0])
    got = np.bincount(toks[t0, 1], minlength=len(want)) / t0.sum()
    assert np.abs(got - want).max() < 0.03
    assert abs(t0.mean() - 0.5) < 0.02
