"""mtpcheck.laws.independence: the coincidence tests hold their level under
independence and fire on shared draws."""

import numpy as np
import pytest

from mtpcheck.laws.independence import (
    acceptance_series,
    agreement_series,
    closeness_series,
    coincidence_test,
    log_evalue,
    pit_values,
)


def _laws(rng, n, V=12, conc=0.5):
    return rng.dirichlet(np.full(V, conc), size=n)


def _draw(laws, u):
    """Inverse-cdf sampling, as the reference engine does."""
    return np.minimum((np.cumsum(laws, axis=1) <= np.asarray(u)[:, None]).sum(axis=1), laws.shape[1] - 1)


def test_agreement_series_aligns_lags_both_ways():
    a, b = [1, 2, 3, 4], [2, 3, 4, 9]
    la = lb = np.eye(10)[[1, 2, 3, 4]]
    h, p = agreement_series(a, la, b, lb, 1)  # a[n+1] vs b[n]
    assert h.tolist() == [1, 1, 1] and len(p) == 3
    h, p = agreement_series(b, lb, a, la, -1)  # b[n] vs a[n+1]: the same pairs
    assert h.tolist() == [1, 1, 1]
    h, _ = agreement_series(a, la, b, lb, 0)
    assert h.tolist() == [0, 0, 0, 0]


def test_acceptance_series_reads_the_report_schedule():
    # prefill token, then round 0: 2 of 3 accepted (+ correction), round 1: 3 of 3 (+ bonus)
    laws = np.tile(np.array([0.5, 0.3, 0.2]), (9, 1))
    h, p = acceptance_series(8, laws, [2, 3], [3, 3], first_token_from_prefill=True)
    assert h.tolist() == [1, 1, 0, 1, 1, 1] and p.tolist() == [0.5] * 6
    h, _ = acceptance_series(8, laws, [0], [3], first_token_from_prefill=False)
    assert h.tolist() == [0]


def test_evalue_of_an_empty_or_null_series_is_small():
    assert log_evalue(np.zeros(0), np.zeros(0)) == 0.0
    # hits exactly at their expectation: no evidence
    assert log_evalue(np.array([1.0, 0, 0, 0]), np.full(4, 0.25)) < 0.5


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_the_level_holds_under_independence(alpha):
    """Independent sequences with varying laws, series of token agreement and
    PIT closeness at five lags: false alarms at most alpha (the e-value test
    is conservative)."""
    rng = np.random.default_rng(7)
    runs, alarms = 300, 0
    for _ in range(runs):
        series = {}
        la, lb = _laws(rng, 40), _laws(rng, 40)
        ta, tb = _draw(la, rng.random(40)), _draw(lb, rng.random(40))
        wa, wb = pit_values(ta, la, rng), pit_values(tb, lb, rng)
        for lag in range(-2, 3):
            series[f"t{lag}"] = agreement_series(ta, la, tb, lb, lag)
            series[f"w{lag}"] = closeness_series(wa, wb, lag, 0.1)
        alarms += not coincidence_test("t", series, alpha).passed
    assert alarms / runs <= alpha + 3 * np.sqrt(alpha / runs)


def test_pit_values_are_uniform():
    rng = np.random.default_rng(1)
    laws = _laws(rng, 4000)
    w = pit_values(_draw(laws, rng.random(4000)), laws, rng)
    assert abs(w.mean() - 0.5) < 0.02 and abs((w < 0.1).mean() - 0.1) < 0.02


def test_shared_draws_between_seeds_are_found():
    """Seed + position keys: run B's uniforms are run A's one position later.
    The laws differ (so do most tokens); the PIT values still sit together."""
    rng = np.random.default_rng(3)
    u = rng.random(200)
    la, lb = _laws(rng, 199), _laws(rng, 199)
    ta, tb = _draw(la, u[1:]), _draw(lb, u[:-1])
    wa, wb = pit_values(ta, la, rng), pit_values(tb, lb, rng)
    series = {lag: closeness_series(wa, wb, lag, 0.1) for lag in range(-2, 3)}
    assert not coincidence_test("t", series, 1e-8).passed
    # the same laws with fresh uniforms pass
    wb2 = pit_values(_draw(lb, rng.random(199)), lb, rng)
    assert coincidence_test("t", {lag: closeness_series(wa, wb2, lag, 0.1) for lag in range(-2, 3)}, 1e-8).passed


def test_a_draft_on_the_targets_uniform_is_found_and_an_independent_one_is_not():
    rng = np.random.default_rng(5)
    p = _laws(rng, 300, conc=1.0)
    q = 0.8 * p + 0.2 * _laws(rng, 300, conc=1.0)  # a drafter close to the target
    u = rng.random(300)
    shared = (_draw(q, u) == _draw(p, u)).astype(float)
    independent = (_draw(q, rng.random(300)) == _draw(p, u)).astype(float)
    bound = p.max(axis=1)
    assert not coincidence_test("t", {"x": (shared, bound)}, 5e-9).passed
    assert coincidence_test("t", {"x": (independent, bound)}, 5e-9).passed


def test_the_series_combination_keeps_a_strong_series_strong():
    """Issue 24, item 1: 45 series (3 seed pairs x 5 lags x 3 kinds), one of
    which shows 18 coincidences where independence allows 7.4 (a PIT series:
    constant null probability). The mean of e-values put it at p 0.6; the
    exact tail of that series, Bonferroni over the 45, keeps it near 1e-2."""
    from mtpcheck.laws.independence import coincidence_test, series_test

    rng = np.random.default_rng(7)
    pi = 2 * 0.02 - 0.02 ** 2
    series = {f"null {i}": ((rng.random(187) < pi).astype(float), np.full(187, pi)) for i in range(44)}
    strong = np.zeros(187)
    strong[:18] = 1.0
    series["strong"] = (strong, np.full(187, pi))
    old, new = coincidence_test("t", series, 1e-8), series_test("t", series, 1e-8)
    assert old.p_value > 0.3
    assert new.p_value < 0.05 and new.p_value < old.p_value / 10
    assert new.note.startswith("strongest: strong, 18 coincidences where independence allows 7.4")
    assert new.details["strong"]["method"] == "binomial tail"


def test_the_series_combination_holds_its_level_under_the_null():
    """Under independence the Bonferroni of valid per-series p-values rejects
    at most alpha of the time: 600 null runs of 15 series at alpha 0.05
    (PIT-like constant probabilities and agreement-like varying ones)."""
    from mtpcheck.laws.independence import series_test

    rng = np.random.default_rng(11)
    rejections = 0
    for _ in range(600):
        series = {}
        for i in range(15):
            p = np.full(120, 0.0396) if i % 3 else rng.uniform(0.05, 0.4, 120)
            series[str(i)] = ((rng.random(120) < p).astype(float), p)
        rejections += not series_test("t", series, 0.05).passed
    assert rejections / 600 <= 0.05 + 3 * (0.05 * 0.95 / 600) ** 0.5, rejections


def test_agreement_under_truncated_laws_bounds_the_unlisted_mass():
    """Top-N laws (HTTP servers' logprobs): the null probability of agreement
    is bounded from above by what the unlisted tokens can add, never below the
    whole laws' value."""
    from mtpcheck.laws.independence import agreement_series

    rng = np.random.default_rng(3)
    whole_a, whole_b = rng.dirichlet(np.ones(12), 30), rng.dirichlet(np.ones(12), 30)

    def top(rows, n=4):
        out = np.zeros_like(rows)
        idx = np.argsort(-rows, axis=1)[:, :n]
        np.put_along_axis(out, idx, np.take_along_axis(rows, idx, axis=1), axis=1)
        return out

    toks = list(range(30))
    _, exact = agreement_series(toks, whole_a, toks, whole_b, 0)
    _, bound = agreement_series(toks, top(whole_a), toks, top(whole_b), 0)
    assert np.all(bound >= exact - 1e-12) and np.all(bound <= 1.0)
    assert np.mean(bound) < 2 * np.mean(exact) + 0.1  # a bound, not a surrender


# -- SEED-STREAMS-INDEPENDENT's role form (issue 24, item 2) ------------------------------


def _rejection_round(p, q, u_draft, u_accept, u_corr):
    """One proposal under the rejection rule from the given uniforms -> (token, role)."""
    from mtpcheck.engine.acceptance import rejection_accept_probability, rejection_correction
    from mtpcheck.engine.sampling import sample

    d = sample(q, u_draft)
    if u_accept < rejection_accept_probability(p, q, d):
        return d, "accepted"
    return sample(rejection_correction(p, q, d), u_corr), "correction"


def _role_obs(rng, n, share):
    """n single-proposal rounds; share: which uniform the acceptance reuses (None: independent)."""
    from mtpcheck.laws.independence import role_laws

    obs = []
    for _ in range(n):
        p, q = _laws(rng, 1, V=16, conc=0.7)[0], _laws(rng, 1, V=16, conc=0.7)[0]
        ud, ua, uc = rng.random(3)
        ua = {"draft": ud, "correction": uc, None: ua}[share]
        tok, role = _rejection_round(p, q, ud, ua, uc)
        acc, rej = role_laws(p, q, "rejection")
        obs.append((tok, acc if role == "accepted" else rej))
    return obs


@pytest.mark.parametrize("share", ["draft", "correction"])
def test_shared_acceptance_uniforms_break_the_role_laws_in_id_order(share):
    from mtpcheck.laws.stats import pit_ks

    rng = np.random.default_rng(11)
    assert pit_ks(_role_obs(rng, 4000, None), rng_seed=1, alpha=1e-9, order="id").passed
    assert not pit_ks(_role_obs(rng, 4000, share), rng_seed=1, alpha=1e-9, order="id").passed


def test_role_laws_sum_to_the_target_law():
    """accepted and corrected masses add up to p (rejection) whatever q: the marginal stays exact."""
    from mtpcheck.laws.independence import role_laws

    rng = np.random.default_rng(2)
    p, q = _laws(rng, 2, V=10)
    acc, rej = role_laws(p, q, "rejection")
    tv = np.maximum(p - q, 0).sum()
    np.testing.assert_allclose((1 - tv) * acc + tv * rej, p, atol=1e-12)
    acc, rej = role_laws(p, q, "exact_match")
    s = (p * q).sum()
    np.testing.assert_allclose(s * acc + (1 - s) * rej, p, atol=1e-12)
    with pytest.raises(ValueError, match="no role laws"):
        role_laws(p, q, "unknown")


def test_role_observations_read_the_round_structure():
    from mtpcheck.laws.independence import role_observations

    V, n = 5, 8
    P, Q = np.full((n, V), 1 / V), np.zeros((n, V))
    Q[1:4] = Q[5:7] = np.eye(V)[0]
    # prefill token 0; round 1: 2 of 3 accepted (1, 2 accepted, 3 correction); round 2: 0 drafted (4 plain);
    # round 3: 2 of 2 accepted (5, 6), 7 bonus
    roles = [r for *_, r in role_observations([0] * n, P, Q, [2, 0, 2], [3, 0, 2], "rejection")]
    assert roles == ["accepted", "accepted", "correction", "plain", "accepted", "accepted", "bonus"]


def test_acceptance_series_with_the_proposal_law_uses_the_exact_chance():
    laws = np.tile([0.5, 0.3, 0.2], (6, 1))
    q = np.tile([0.2, 0.3, 0.5], (6, 1))
    h, p = acceptance_series(6, laws, [1, 2], [2, 2], q_laws=q, rule="rejection")
    assert list(h) == [1.0, 0.0, 1.0, 1.0]
    np.testing.assert_allclose(p, 0.7)  # sum min(p, q)
    _, p = acceptance_series(6, laws, [1], [2], q_laws=q, rule="exact_match")
    np.testing.assert_allclose(p, 0.1 + 0.09 + 0.1)


@pytest.mark.parametrize("opts", [{}, {"drafter": "assistant"}, {"acceptance": "exact_match"}])
def test_the_replayed_proposal_law_is_the_one_the_engine_drew_from(opts):
    """draft_distributions (mtpcheck.engine.replay) against the round traces, bit for bit."""
    from mtpcheck.backends import load_backend
    from mtpcheck.contracts import SamplingParams
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery.configs import request, seeded, spec_for

    b = load_backend("toy", opts)
    caps = b.capabilities()
    assert caps.draft_distributions
    prompt = list(fixture_prompts(b).values())[0]
    for r in range(3):
        req = request(prompt, 30, seeded(SamplingParams(temperature=1.0, top_k=12), r), spec_for(caps),
                      stop_token_ids=[]).model_copy(update={"trace": True})
        res = b.generate(req)
        s = res.speculation
        Q = b.draft_distributions(req, res.tokens, s.accept_lens, s.draft_lens)
        e, seen = 1, 0
        for tr in res.trace:
            for j in range(min(tr.accepted + 1, len(tr.proposals))):
                if e + j < len(res.tokens):
                    np.testing.assert_array_equal(Q[e + j], np.array(tr.draft_probs[j]))
                    seen += 1
            e += len(tr.committed)
        assert seen > 5


# -- UNSEEDED-INDEPENDENT: together_test ---------------------------------------------------

COPIES, STRATA, ALPHA = 6, 4, 5e-9  # the suite's shape (machinery.seeds) and per-path alpha (configs)


def _zipf(m: int):
    """A sampler of whole outputs: Zipf over m outputs, or (m = 0) outputs that never repeat."""
    if m == 0:
        return lambda rng, size=None: rng.integers(1 << 60, size=size)
    p = 1 / np.arange(1, m + 1)
    p /= p.sum()
    return lambda rng, size=None: rng.choice(m, size=size, p=p)


def _strata(rng, draw, shared: bool) -> dict:
    """Alone outputs i.i.d.; together i.i.d. too, or (shared) COPIES copies of one draw."""
    out = {}
    for s in range(STRATA):
        alone = list(draw(rng, COPIES))
        together = [draw(rng)] * COPIES if shared else list(draw(rng, COPIES))
        out[s] = (together, alone)
    return out


def test_together_law_is_the_permutation_law():
    """The class-by-class count equals enumerating every labelling."""
    from itertools import combinations
    from math import comb

    from mtpcheck.laws.independence import identical_pairs, together_law

    together, alone = ["a", "a", "b", "c"], ["a", "b", "b", "d", "e"]
    pooled = together + alone
    brute: dict[int, int] = {}
    for idx in combinations(range(len(pooled)), len(together)):
        t = identical_pairs([pooled[i] for i in idx])
        brute[t] = brute.get(t, 0) + 1
    law = together_law(together, alone)
    assert law == brute and sum(law.values()) == comb(9, 4)


@pytest.mark.parametrize("m", [1, 3, 20, 1000, 0])
def test_together_test_holds_its_level(m):
    """Outputs served together drawn like those served alone: rejections at
    0.05 and 0.01 no more often than that. The test is exact given the pooled
    outputs, so whatever the law: one output only (m = 1), Zipf over 3, 20
    and 1000 outputs, outputs that never repeat (m = 0)."""
    from mtpcheck.laws.independence import together_test

    rng, draw = np.random.default_rng(m), _zipf(m)
    ps = np.array([together_test("t", _strata(rng, draw, False), 0.05).p_value for _ in range(600)])
    for a in (0.05, 0.01):
        assert np.mean(ps <= a) <= a + 3 * np.sqrt(a * (1 - a) / 600), (a, np.mean(ps <= a))


@pytest.mark.parametrize(("m", "power"), [(0, 1.0), (1000, 0.97), (100, 0.95)])
def test_together_test_finds_copies_served_together(m, power):
    """Copies served together (the unseeded-batch-shares-randomness bug) at
    the suite's alpha: outputs that never repeat give p = C(12, 6)^-4 every
    run; Zipf laws over 1000 and 100 outputs (collision rates 0.029 and
    0.061) measured 0.998 and 0.988 in 400 runs each."""
    from mtpcheck.laws.independence import together_test

    rng, draw = np.random.default_rng(5), _zipf(m)
    results = [together_test("t", _strata(rng, draw, True), ALPHA) for _ in range(200)]
    assert np.mean([not r.passed for r in results]) >= power
    if m == 0:
        assert results[0].p_value == pytest.approx(924.0 ** -4) and results[0].statistic == STRATA * 15
        assert results[0].details["power"] == pytest.approx(1.0)


def test_together_test_on_a_deterministic_output():
    """Every output the same, together and alone: nothing to see (p = 1), and
    the recorded power says the test could not have seen copies either."""
    from mtpcheck.laws.independence import together_test

    res = together_test("t", {s: ([7] * COPIES, [7] * COPIES) for s in range(STRATA)}, ALPHA)
    assert res.passed and res.p_value == 1.0 and res.details["power"] < 0.01


class _Slots:
    """generate_n of at most `slots` samples (llama-server's -np), every sample
    one shared draw (`shared`) or a fresh one; generate() a fresh draw."""

    def __init__(self, slots: int, shared: bool):
        from mtpcheck.contracts import Capabilities

        self.rng, self.shared = np.random.default_rng(11), shared
        self.caps = Capabilities(name="slots", version="1", vocab_size=8, max_depth=1, parallel_samples=True,
                                 max_parallel_samples=slots)

    def capabilities(self):
        return self.caps

    def _result(self, token):
        from mtpcheck.contracts import GenerationResult, SpeculationReport

        return GenerationResult(tokens=[int(token)], text="", finish_reason="length",
                                speculation=SpeculationReport(requested=False, used=False, mode="off", runtime="t"))

    def generate(self, req):
        return self._result(self.rng.integers(1 << 60))

    def generate_n(self, req, n):
        if n > self.caps.max_parallel_samples:
            raise ValueError(f"n={n} > {self.caps.max_parallel_samples} slots")
        draws = [self.rng.integers(1 << 60)] * n if self.shared else self.rng.integers(1 << 60, size=n)
        return [self._result(t) for t in draws]


@pytest.mark.parametrize("shared", [False, True])
def test_generate_n_is_asked_at_most_the_declared_samples(shared):
    """A backend that serves at most 4 samples a call (max_parallel_samples)
    is asked 4 of the 6 copies, and the exact test on groups of 4 together
    and 6 alone still finds copies served together: p = C(10, 4)^-4 =
    5.1e-10 below the per-path alpha; fresh draws pass."""
    from mtpcheck.laws.independence import together_test
    from mtpcheck.machinery.seeds import samples_per_call, served_alone, served_together

    backend, reqs = _Slots(4, shared), [object()] * STRATA
    together, alone = served_together(backend, reqs, "generate_n", COPIES), served_alone(backend, reqs, COPIES)
    assert [len(t) for t in together] == [4] * STRATA and samples_per_call(backend.caps, 3) == 3
    res = together_test("t", {s: (t, a) for s, (t, a) in enumerate(zip(together, alone, strict=True))}, ALPHA)
    assert res.passed is not shared
    if shared:
        assert res.p_value == pytest.approx(210.0 ** -4)
