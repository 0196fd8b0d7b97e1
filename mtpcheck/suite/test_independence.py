"""Independence of random streams (seed 000: "Target and draft random streams
are independent. Draft substreams are addressed by logical output position,
so scheduler interleaving or discarded optional work does not advance the
randomness assigned to canonical output."). Black-box: emitted tokens, seeds,
the report's accept counts and target_distributions as ground truth; unseeded
requests against the same requests served alone, without ground truth."""

import numpy as np
import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.independence import (
    EMPIRICAL_ALPHA,
    acceptance_series,
    coincidence_test,
    role_observations,
    series_test,
    together_test,
)
from mtpcheck.laws.stats import pit_ks, rank_gtest
from mtpcheck.machinery import scheduling as S
from mtpcheck.machinery.configs import (
    STREAM_TEMPERATURES,
    request,
    spec_for,
    statistical,
    subtest_alpha,
)
from mtpcheck.machinery.seeds import (
    REPLICATES,
    UNSEEDED_COPIES,
    base_seeds,
    sample_pair_series,
    samples_per_call,
    seed_pair_series,
    served_alone,
    served_together,
    unseeded_requests,
)

TOKENS = 32  # per request of SEED-HISTORY


# -- SEED-HISTORY -------------------------------------------------------------------------


def _histories(prompts, sp, seed, caps):
    """Request sequences served before the request under test: other controls,
    depths, prompts, seeds (the request's own controls under a neighbouring seed
    last, so that state kept from the previous request shows), greedy, plain."""
    other = prompts[1 % len(prompts)]
    return {
        "other controls": [request(other, 24, SamplingParams(temperature=0.7, top_k=8, seed=seed + 5), spec_for(caps, 1))],
        "same controls, neighbouring seed": [
            request(other, 24, SamplingParams(temperature=1.3, seed=seed ^ 1), spec_for(caps, 5)),
            request(prompts[0], TOKENS, sp.model_copy(update={"seed": seed + 1}), spec_for(caps)),
        ],
        "greedy then plain": [request(other, 16, SamplingParams(temperature=0.0), spec_for(caps, 5)),
                              request(prompts[0], TOKENS, sp.model_copy(update={"seed": 0}), False)],
        "same controls, other prompt and depth": [
            request(other, 40, sp.model_copy(update={"seed": seed + 1000}), spec_for(caps, 1))],
    }


@pytest.mark.contract("SEED-HISTORY")
def test_seeded_output_does_not_depend_on_request_history(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    prompts = list(mtp_fixture.values())
    problems = []
    for i in range(min(3, len(prompts))):
        rotated = prompts[i:] + prompts[:i]
        sp = SamplingParams(temperature=1.0, top_p=0.95, seed=mtp_seed + 31 * i)
        req = request(rotated[0], TOKENS, sp, spec_for(mtp_capabilities))
        first = mtp_backend.generate(req).tokens
        for name, history in _histories(rotated, sp, sp.seed, mtp_capabilities).items():
            for h in history:
                mtp_backend.generate(h)
            again = mtp_backend.generate(req).tokens
            if again != first:
                problems.append(_differs(i, sp.seed, name, first, again))
        if mtp_capabilities.scheduler:  # served among concurrent requests of other controls and seeds
            session = S.open_session(mtp_backend)
            others = [h for hs in _histories(rotated, sp, sp.seed, mtp_capabilities).values() for h in hs][:3]
            ids = [session.submit(r) for r in [others[0], req, *others[1:]]]
            S.run_all(session)
            again = session.outcome(ids[1]).tokens
            if again != first:
                problems.append(_differs(i, sp.seed, "concurrent requests", first, again))
    assert not problems, "a seeded request's output depends on the requests served before it: " + "; ".join(problems[:4])


def _differs(i, seed, name, first, again) -> str:
    at = next((j for j, (x, y) in enumerate(zip(first, again, strict=False)) if x != y), min(len(first), len(again)))
    return (f"prompt {i}, seed {seed}: after [{name}] the output differs from its first run at token {at} "
            f"({first[at:at + 3]} vs {again[at:at + 3]})")


# -- SEED-INDEPENDENT ---------------------------------------------------------------------


@pytest.mark.contract("SEED-INDEPENDENT")
def test_different_seeds_share_no_draws(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed, mtp_record):
    rng = np.random.default_rng(mtp_seed)  # the PIT randomisation: the suite's own, not the backend's
    series = seed_pair_series(mtp_backend, mtp_capabilities, list(mtp_fixture.values()), mtp_profile.dist_tokens,
                              base_seeds(mtp_seed, REPLICATES[mtp_profile.name]), rng)
    res = series_test("seed-agreement", series, subtest_alpha("test_different_seeds_share_no_draws"))
    mtp_record(test=res.model_dump())
    if res.passed:
        return
    control = seed_pair_series(mtp_backend, mtp_capabilities, list(mtp_fixture.values()), mtp_profile.dist_tokens,
                               base_seeds(mtp_seed, REPLICATES[mtp_profile.name]), rng, control=True)
    _judge_against_unrelated(res, series, control, mtp_record, "runs under different seeds")


# -- SEED-SAMPLES-INDEPENDENT -------------------------------------------------------------

SAMPLES_N = 4  # samples per request (OpenAI's n)


@pytest.mark.contract("SEED-SAMPLES-INDEPENDENT")
def test_parallel_samples_reproduce(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed, mtp_record):
    problems, n = [], samples_per_call(mtp_capabilities, SAMPLES_N)
    for i, prompt in enumerate(list(mtp_fixture.values())[:2]):
        req = request(prompt, mtp_profile.dist_tokens, SamplingParams(temperature=1.0, seed=mtp_seed + 101 * i),
                      spec_for(mtp_capabilities), stop_token_ids=[])
        first = [r.tokens for r in mtp_backend.generate_n(req, n)]
        again = [r.tokens for r in mtp_backend.generate_n(req, n)]
        problems += [f"prompt {i}, seed {req.sampling.seed}: sample {j} differs on the second call"
                     for j, (a, b) in enumerate(zip(first, again, strict=True)) if a != b]
    mtp_record(n=n, problems=problems)
    assert not problems, "a seeded request's n samples do not reproduce: " + "; ".join(problems[:4])


@pytest.mark.contract("SEED-SAMPLES-INDEPENDENT")
def test_parallel_samples_share_no_draws(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed,
                                         mtp_record):
    rng = np.random.default_rng(mtp_seed + 3)  # the PIT randomisation: the suite's own
    n = samples_per_call(mtp_capabilities, SAMPLES_N)
    series = sample_pair_series(mtp_backend, mtp_capabilities, list(mtp_fixture.values()), mtp_profile.dist_tokens,
                                base_seeds(mtp_seed + 29, REPLICATES[mtp_profile.name]), n, rng)
    res = series_test("sample-agreement", series, subtest_alpha("test_parallel_samples_share_no_draws"))
    mtp_record(n=n, test=res.model_dump())
    if res.passed:
        return
    control = sample_pair_series(mtp_backend, mtp_capabilities, list(mtp_fixture.values()), mtp_profile.dist_tokens,
                                 base_seeds(mtp_seed + 29, REPLICATES[mtp_profile.name]), n, rng, control=True)
    _judge_against_unrelated(res, series, control, mtp_record, "samples of one request, or of requests under "
                             "neighbouring seeds, (copies, shifted streams, or child seeds that overlap)")


def _judge_against_unrelated(res, series, control, mtp_record, what: str) -> None:
    """The exact test against the target law rejected. The seeds are blamed only
    if pairs of unrelated seeds from the same runtime (same prompts, lags and
    kinds) keep the target law's allowance (p > EMPIRICAL_ALPHA): then the
    excess is the related seeds'. If the unrelated pairs exceed it too, the
    runtime's output law is not the target's (DIST-EQUIV judges that) and
    its seeds cannot be judged against it: a skip that says so."""
    unrelated = series_test(res.name + ", unrelated seeds", control, EMPIRICAL_ALPHA)
    mtp_record(empirical_null=unrelated.model_dump())
    if not unrelated.passed:
        pytest.skip(f"not judged: unrelated seeds of this runtime coincide beyond the target law's allowance too "
                    f"({unrelated.note}; p={unrelated.p_value:.3g} <= {EMPIRICAL_ALPHA:g}): its output law is not the "
                    f"target's (DIST-EQUIV), so the related seeds' excess ({res.note}) cannot be pinned on the seeds")
    pytest.fail(f"{what} coincide more often than independent randomness allows: {res.note}; p={res.p_value:.3g} "
                f"< alpha={res.alpha:.2g}; unrelated seeds of this runtime keep the allowance (p={unrelated.p_value:.3g})")


# -- UNSEEDED-INDEPENDENT -----------------------------------------------------------------


@pytest.fixture(scope="module")
def unseeded_alone(mtp_backend, mtp_capabilities, mtp_fixture):
    """The strata's requests and their outputs served alone: the empirical null
    both paths are judged against."""
    reqs = unseeded_requests(mtp_capabilities, list(mtp_fixture.values()))
    return reqs, served_alone(mtp_backend, reqs)


@pytest.mark.contract("UNSEEDED-INDEPENDENT")
@pytest.mark.parametrize("path", [pytest.param("generate_batch", marks=pytest.mark.requires("concurrent")),
                                  pytest.param("generate_n", marks=pytest.mark.requires("parallel_samples"))])
def test_unseeded_requests_served_together_are_independent(mtp_backend, unseeded_alone, mtp_record, path):
    reqs, alone = unseeded_alone
    together = served_together(mtp_backend, reqs, path)
    strata = {f"stratum {s}": (t, a) for s, (t, a) in enumerate(zip(together, alone, strict=True))}
    res = together_test("together-vs-alone", strata,
                        subtest_alpha("test_unseeded_requests_served_together_are_independent"))
    mtp_record(path=path, copies=UNSEEDED_COPIES, together=len(together[0]), test=res.model_dump())
    assert res.passed, (f"identical unseeded requests served together ({path}) coincide more often than the same "
                        f"requests served alone: {res.note}; p={res.p_value:.3g} < alpha={res.alpha:.2g} (exact "
                        f"permutation test): they share randomness")


# -- SEED-STREAMS-INDEPENDENT -------------------------------------------------------------

# The clause's INDEPENDENCE_ALPHA: two forms x two temperatures, a quarter each;
# the role form splits its quarter over its four tests (union bound; configs.STATISTICAL).


def _stream_runs(backend, caps, prompts, profile, seed, sp, runs):
    """(prompt, request, result) of the clause's seeded runs; only those that speculated."""
    out = []
    for r, base in enumerate(base_seeds(seed + 17, runs)):
        prompt = prompts[r % len(prompts)]
        req = request(prompt, profile.dist_tokens, sp.model_copy(update={"seed": base}), spec_for(caps),
                      stop_token_ids=[])
        res = backend.generate(req)
        if res.speculation.used:
            out.append((prompt, req, res))
    return out


@pytest.mark.contract("SEED-STREAMS-INDEPENDENT")
@pytest.mark.requires("exact_match")
@pytest.mark.parametrize("temperature", STREAM_TEMPERATURES)
def test_draft_randomness_is_independent_of_the_targets(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile,
                                                        mtp_seed, mtp_record, temperature):
    """Exact-match acceptance: an independent draft matches the target's draw
    with probability sum_x q(x) p(x) <= max p, whatever q."""
    sp = SamplingParams(temperature=temperature)
    hits, probs, rounds = [], [], 0
    for prompt, _, res in _stream_runs(mtp_backend, mtp_capabilities, list(mtp_fixture.values()), mtp_profile,
                                       mtp_seed, sp, REPLICATES[mtp_profile.name]):
        s = res.speculation
        laws = mtp_backend.target_distributions(prompt, res.tokens, sp)
        h, p = acceptance_series(len(res.tokens), laws, s.accept_lens, s.draft_lens,
                                 mtp_capabilities.first_token_from_prefill)
        hits.append(h), probs.append(p)
        rounds += len(s.accept_lens)
    if not rounds:
        pytest.skip("speculation was not used (see REPORT-HONEST)")
    alpha = subtest_alpha("test_draft_randomness_is_independent_of_the_targets")
    res = coincidence_test("accept-vs-max-p", {"proposals": (_cat_all(hits), _cat_all(probs))}, alpha)
    mtp_record(temperature=temperature, test=res.model_dump(), rounds=rounds)
    assert res.passed, (f"exact-match accepts more proposals than a draft drawn independently of the target's "
                        f"randomness can (at most max p each): {res.note}; p={res.p_value:.3g} < "
                        f"alpha={alpha:.2g}")


@pytest.mark.contract("SEED-STREAMS-INDEPENDENT")
@pytest.mark.requires("draft_distributions")
@pytest.mark.parametrize("temperature", STREAM_TEMPERATURES)
def test_each_role_follows_its_law(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed, mtp_record,
                                   temperature):
    """Either rule, with the proposal law q known (draft_distributions): with
    independent streams an accepted token follows min(p, q) (exact match: p q),
    a correction (p - q)+ (exact match: p (1 - q)), a bonus p, each given the
    past and its role; and a proposal is accepted with probability
    sum min(p, q) (exact match: sum p q). Shared uniforms break these laws
    while the marginal law stays close to p (docs/statistics.md)."""
    rule = mtp_capabilities.acceptance_rule
    if temperature not in mtp_profile.stream_temperatures:
        pytest.skip(f"profile {mtp_profile.name} samples the role laws at T = "
                    f"{', '.join(map(str, mtp_profile.stream_temperatures))} only (--mtp-profile=dev for all)")
    if rule not in ("rejection", "exact_match"):
        pytest.skip(f"role laws need a declared acceptance rule, backend declares {rule!r}")
    sp = SamplingParams(temperature=temperature)
    obs, hits, probs, rounds = [], [], [], 0
    # as many runs as a DIST-EQUIV configuration: the role laws are tested like the target's
    for prompt, req, res in _stream_runs(mtp_backend, mtp_capabilities, list(mtp_fixture.values()), mtp_profile,
                                         mtp_seed, sp, mtp_profile.dist_runs):
        s = res.speculation
        p_laws = mtp_backend.target_distributions(prompt, res.tokens, sp)
        q_laws = mtp_backend.draft_distributions(req, res.tokens, s.accept_lens, s.draft_lens)
        obs += role_observations(res.tokens, p_laws, q_laws, s.accept_lens, s.draft_lens, rule,
                                 mtp_capabilities.first_token_from_prefill)
        h, pi = acceptance_series(len(res.tokens), p_laws, s.accept_lens, s.draft_lens,
                                  mtp_capabilities.first_token_from_prefill, q_laws=q_laws, rule=rule)
        hits.append(h), probs.append(pi)
        rounds += len(s.accept_lens)
    if not rounds:
        pytest.skip("speculation was not used (see REPORT-HONEST)")
    alpha = subtest_alpha("test_each_role_follows_its_law")
    pairs = [(t, law) for t, law, _ in obs]
    corrections = [(t, law) for t, law, role in obs if role == "correction"]
    tests = {
        "rank G-test, every role": rank_gtest(pairs, alpha=alpha),
        "PIT KS in token-id order, every role": pit_ks(pairs, rng_seed=mtp_seed, alpha=alpha, order="id"),
        "PIT KS in token-id order, corrections": pit_ks(corrections, rng_seed=mtp_seed + 1, alpha=alpha, order="id"),
        "acceptances vs sum min(p, q)" if rule == "rejection" else "acceptances vs sum p q":
            coincidence_test("accept-vs-law", {"proposals": (_cat_all(hits), _cat_all(probs))}, alpha),
    }
    # the registry's count is what split the alpha: a test added here without it would overspend
    assert len(tests) == statistical("test_each_role_follows_its_law").subtests, "configs.STATISTICAL: role tests"
    roles = {r: sum(1 for *_, role in obs if role == r) for r in ("accepted", "correction", "bonus", "plain")}
    mtp_record(temperature=temperature, rounds=rounds, roles=roles, tests={k: t.model_dump() for k, t in tests.items()})
    failed = [f"{k}: p={t.p_value:.3g} < alpha={alpha:.2g} ({t.note})" for k, t in tests.items() if not t.passed]
    assert not failed, (f"emitted tokens do not follow the laws of their roles under independent draft and target "
                        f"randomness (roles {roles}; shared uniforms, or a rule other than the declared {rule!r}): "
                        + "; ".join(failed))


def _cat_all(xs):
    return np.concatenate(xs) if xs else np.zeros(0)
