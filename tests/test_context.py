"""DIST-CONTEXT's statistic (laws.context_gtest) and its staged sampling
(machinery.contexts): null calibration, the cancellation it exists for, the
stages' decisions."""

from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from mtpcheck.laws.context_gtest import ContextDraws, context_gtest
from mtpcheck.laws.stats import ObservationBatch, rank_gtest
from mtpcheck.machinery import contexts as ctx


def _laws(rng, k, v=12, conc=0.6):
    return [rng.dirichlet(np.full(v, conc)) for _ in range(k)]


def _draws(rng, laws, n, tilt=None):
    out = []
    for i, p in enumerate(laws):
        law = p if tilt is None else tilt(i, p)
        out.append(ContextDraws(f"c{i}", rng.choice(len(p), size=n, p=law), p))
    return out


def test_null_rejection_rate_matches_alpha():
    """1,000 null runs of 6 contexts x 150 draws: the rate at alpha 0.01 and
    0.05 lies in its 99.9 % Clopper-Pearson interval, and the p-values are
    uniform (KS)."""
    rng = np.random.default_rng(5)
    ps = []
    for _ in range(1000):
        r = context_gtest(_draws(rng, _laws(rng, 6), 150), alpha=0.05)
        ps.append(r.p_value)
    ps = np.array(ps)
    for a in (0.01, 0.05):
        k = int((ps <= a).sum())
        lo, hi = stats.binomtest(k, len(ps)).proportion_ci(0.999)
        assert lo <= a <= hi, (a, k)
    assert stats.kstest(ps, "uniform").pvalue > 1e-4


def _swap_tilt(delta):
    """Context i: +delta on its rank-(i % 2) token, -delta on its rank-(1 - i % 2)
    token - the same shift in rank space with opposite signs, so pooled ranks cancel."""

    def tilt(i, p):
        order = np.argsort(-p)
        q = p.copy()
        up, down = order[i % 2], order[1 - i % 2]
        d = min(delta, q[down])
        q[up] += d
        q[down] -= d
        return q

    return tilt


def test_a_per_context_tilt_that_cancels_in_ranks_is_caught():
    rng = np.random.default_rng(1)
    laws = _laws(rng, 8, conc=1.5)
    draws = _draws(rng, laws, 800, tilt=_swap_tilt(0.06))
    r = context_gtest(draws, alpha=1e-7)
    assert not r.passed, r
    pooled = ObservationBatch(np.concatenate([d.tokens for d in draws]),
                              np.concatenate([np.tile(d.p, (len(d.tokens), 1)) for d in draws]))
    assert rank_gtest(pooled, alpha=1e-7).passed  # the pooled rank test does not see it
    top = r.details["top_contexts"][0]
    assert top["tv"] > 0.03 and top["most_over"]["observed"] > top["most_over"]["target"]


def test_zero_probability_token_fails_at_once():
    p = np.array([0.5, 0.5, 0.0])
    r = context_gtest([ContextDraws("c", np.array([0, 1, 2] * 20), p)])
    assert not r.passed and r.p_value == 0.0 and "token 2" in r.note


def test_truncated_law_pools_unlisted_tokens_into_a_tail_cell():
    rng = np.random.default_rng(3)
    full = np.array([0.4, 0.3, 0.1, 0.1, 0.1])
    top2 = np.array([0.4, 0.3, 0.0, 0.0, 0.0])  # a runtime's top-2 law: 0.3 left to the tail
    toks = rng.choice(5, size=2000, p=full)
    r = context_gtest([ContextDraws("c", toks, top2)], alpha=1e-6)
    assert r.passed and r.df == 2  # cells: token 0, token 1, tail
    wrong = rng.choice(5, size=2000, p=[0.55, 0.15, 0.1, 0.1, 0.1])
    assert not context_gtest([ContextDraws("c", wrong, top2)], alpha=1e-6).passed


def test_contexts_too_rare_for_two_cells_are_skipped_not_tested():
    r = context_gtest([ContextDraws("c", np.array([0] * 12), np.array([0.9, 0.1]))])
    assert r.passed and r.df == 0 and r.details["contexts_skipped"] == 1 and "no test" in r.note


# -- staged sampling ----------------------------------------------------------------------------


class _Fake:
    """Two-token contexts: prompt P's first speculative token follows law[P]
    (tilted for the prompts in `bad`); `lead` 1: a fixed prefill token 7 first."""

    def __init__(self, bad=(), delta=0.2, seed=0):
        self.law = {"a": np.array([0.5, 0.3, 0.2]), "b": np.array([0.4, 0.4, 0.2]), "c": np.array([0.6, 0.2, 0.2])}
        self.prompts = {k: [i] for i, k in enumerate(self.law)}
        self.bad, self.delta, self.rng, self.calls = set(bad), delta, np.random.default_rng(seed), []

    def sample(self, per_prompt):
        self.calls.append(dict(per_prompt))
        out = []
        for k, m in per_prompt.items():
            p = self.law[k].copy()
            if k in self.bad:
                p = p + np.array([self.delta, -self.delta, 0.0])
            for t in self.rng.choice(3, size=m, p=p):
                res = SimpleNamespace(tokens=[7, int(t)], speculation=SimpleNamespace(used=True, accepted=1, drafted=2))
                out.append((k, self.prompts[k], res))
        return out

    def laws(self, prompt, cont):
        name = next(k for k, v in self.prompts.items() if v == prompt)
        rows = np.zeros((len(cont), 8))
        rows[len(cont) - 1, :3] = self.law[name]
        return rows


def test_targets_come_from_the_pilot_and_a_tilt_there_fails_the_targeted_stage():
    f = _Fake(bad={"b"}, delta=0.12)
    out = ctx.staged_test(f.sample, f.laws, list(f.prompts), 1, pilot=150, runs=1200, alpha=1e-7, targets=1)
    assert out.targets == ["b"] and out.failed and out.failed[0] in ("targeted", "escalated")
    assert f.calls[1] == {"b": 1200}
    assert out.acceptance == {"a": 0.5, "b": 0.5, "c": 0.5}


@pytest.mark.parametrize("plain_bad", [False, True])
def test_a_failure_is_judged_again_on_the_plain_path(plain_bad):
    """The failing stage's requests drawn again with speculation off and judged
    by the same test: a plain path that keeps the law passes (the deviation is
    speculation's), one that shares the tilt fails too (both paths)."""
    f = _Fake(bad={"b"}, delta=0.12)
    out = ctx.staged_test(f.sample, f.laws, list(f.prompts), 1, pilot=150, runs=1200, alpha=1e-7, targets=1)
    assert out.failed and out.failed_requests == {"b": 1200 if out.failed[0] == "targeted" else 2400}
    plain = _Fake(bad={"b"} if plain_bad else (), delta=0.12, seed=9)
    r = ctx.plain_test(plain.sample, plain.laws, out, 1, alpha=1e-6)
    assert plain.calls == [out.failed_requests]
    assert r.passed is not plain_bad, r


def test_a_correct_backend_passes_every_stage():
    f = _Fake(seed=4)
    out = ctx.staged_test(f.sample, f.laws, list(f.prompts), 1, pilot=100, runs=600, alpha=1e-7, targets=2)
    assert out.failed is None and [s["stage"] for s in out.stages][:2] == ["pilot", "targeted"]
    assert len(out.targets) == 2


def test_a_suspicious_targeted_p_value_escalates(monkeypatch):
    f = _Fake(seed=2)
    out = ctx.staged_test(f.sample, f.laws, list(f.prompts), 1, pilot=100, runs=300, alpha=1e-7, suspicious=1.0,
                          escalate=2)
    assert [s["stage"] for s in out.stages] == ["pilot", "targeted", "escalated"]
    assert out.stages[2]["requests"] == 600 and out.failed is None


def test_only_the_first_speculative_position_is_grouped():
    """A short request's token after the verified proposal (a bonus or a plain
    draw) is not a context of the test: it would add degrees of freedom and no
    signal for an acceptance bug. positions=2 groups it too."""
    res = [SimpleNamespace(tokens=[7, t, 1]) for t in [0] * 12 + [1] * 12]
    draws = [("a", [0], r) for r in res]
    fetched = []

    def laws(prompt, cont):
        fetched.append(tuple(cont[:-1]))
        rows = np.zeros((len(cont), 3))
        rows[:, :2] = 0.5
        return rows

    one = ctx.context_draws(laws, draws, 1)
    assert [d.label for d in one["a"]] == ["a + [7]"] and len(one["a"][0].tokens) == 24
    assert fetched == [(7,)]
    two = ctx.context_draws(laws, draws, 1, positions=2)
    assert sorted(d.label for d in two["a"]) == ["a + [7, 0]", "a + [7, 1]", "a + [7]"]


def test_an_excused_token_leaves_its_context_and_others_still_fail():
    """DIST-CONTEXT applies DIST-ZERO's boundary excuse: an accepted
    zero-probability token is dropped from its context, a refused one still
    fails the test at once."""
    res = [SimpleNamespace(tokens=[7, t]) for t in [0] * 10 + [1] * 10 + [2]]
    draws = [("a", [0], r) for r in res]

    def laws(prompt, cont):
        rows = np.zeros((len(cont), 3))
        rows[:, :2] = 0.5  # token 2 has probability 0
        return rows

    kept = ctx.context_draws(laws, draws, 1, excuse=lambda prompt, prefix, tok: tok == 2)
    assert len(kept["a"][0].tokens) == 20 and 2 not in kept["a"][0].tokens
    refused = ctx.context_draws(laws, draws, 1, excuse=lambda prompt, prefix, tok: False)
    r = context_gtest(refused["a"], alpha=1e-6)
    assert not r.passed and r.p_value == 0.0


def test_an_empty_pilot_hands_its_alpha_to_the_targeted_stage():
    """Issue 24, item 5: a pilot that tests nothing (n = 0: too few short
    requests for two cells of the expected count) spends no alpha; the
    targeted stage is then tested at twice the stage alpha. A pilot that
    tests keeps its share."""
    f = _Fake(seed=3)
    empty = ctx.staged_test(f.sample, f.laws, list(f.prompts), 1, pilot=12, runs=600, alpha=1e-7, targets=1,
                            pilot_min_expected=2.0)
    assert empty.stages[0]["n"] == 0 and empty.stages[1]["stage"] == "targeted"
    assert empty.stages[1]["alpha"] == 2e-7
    full = ctx.staged_test(f.sample, f.laws, list(f.prompts), 1, pilot=100, runs=600, alpha=1e-7, targets=1)
    assert full.stages[0]["n"] > 0 and full.stages[1]["alpha"] == 1e-7
