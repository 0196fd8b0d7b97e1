"""Independence of random streams (seed 000: "Target and draft random streams
are independent. Draft substreams are addressed by logical output position,
so scheduler interleaving or discarded optional work does not advance the
randomness assigned to canonical output."). Black-box: emitted tokens, seeds,
the report's accept counts and target_distributions as ground truth."""

import numpy as np
import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.independence import acceptance_series, coincidence_test, series_test
from mtpcheck.machinery import scheduling as S
from mtpcheck.machinery.configs import INDEPENDENCE_ALPHA, request, spec_for
from mtpcheck.machinery.seeds import REPLICATES, base_seeds, seed_pair_series

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
    res = series_test("seed-agreement", series, INDEPENDENCE_ALPHA)
    mtp_record(test=res.model_dump())
    assert res.passed, (f"runs under different seeds coincide more often than independent randomness allows "
                        f"(shared draws between seeds; or an output law other than the target's, see DIST-EQUIV): "
                        f"{res.note}; p={res.p_value:.3g} < alpha={INDEPENDENCE_ALPHA:.2g}")


# -- SEED-STREAMS-INDEPENDENT -------------------------------------------------------------


@pytest.mark.contract("SEED-STREAMS-INDEPENDENT")
@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_draft_randomness_is_independent_of_the_targets(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile,
                                                        mtp_seed, mtp_record, temperature):
    """Exact-match acceptance: an independent draft matches the target's draw
    with probability sum_x q(x) p(x) <= max p, whatever q."""
    prompts = list(mtp_fixture.values())
    sp = SamplingParams(temperature=temperature)
    hits, probs, rounds = [], [], 0
    for r, base in enumerate(base_seeds(mtp_seed + 17, REPLICATES[mtp_profile.name])):
        prompt = prompts[r % len(prompts)]
        req = request(prompt, mtp_profile.dist_tokens, sp.model_copy(update={"seed": base}), spec_for(mtp_capabilities),
                      stop_token_ids=[])
        res = mtp_backend.generate(req)
        s = res.speculation
        if not s.used:
            continue
        laws = mtp_backend.target_distributions(prompt, res.tokens, sp)
        h, p = acceptance_series(len(res.tokens), laws, s.accept_lens, s.draft_lens,
                                 mtp_capabilities.first_token_from_prefill)
        hits.append(h), probs.append(p)
        rounds += len(s.accept_lens)
    if not rounds:
        pytest.skip("speculation was not used (see REPORT-HONEST)")
    # two temperatures, each half the clause's budget
    res = coincidence_test("accept-vs-max-p", {"proposals": (_cat_all(hits), _cat_all(probs))}, INDEPENDENCE_ALPHA / 2)
    mtp_record(temperature=temperature, test=res.model_dump(), rounds=rounds)
    assert res.passed, (f"exact-match accepts more proposals than a draft drawn independently of the target's "
                        f"randomness can (at most max p each): {res.note}; p={res.p_value:.3g} < "
                        f"alpha={INDEPENDENCE_ALPHA / 2:.2g}")


def _cat_all(xs):
    return np.concatenate(xs) if xs else np.zeros(0)
