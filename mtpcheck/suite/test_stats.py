import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpcheck.contracts import SamplingParams
from mtpcheck.machinery.checks import finish_problems, stats_problems
from mtpcheck.machinery.configs import request, spec_for, without_speculation
from mtpcheck.machinery.exercise import unobserved
from mtpcheck.machinery.invariants import observed_stats_problems
from mtpcheck.machinery.seeds import samples_per_call
from mtpcheck.machinery.strategies import sampling_params

SIDE_WORDS = {"speculative": "speculative path deviates", "both": "both paths deviate (not speculative: the same "
              "request with speculation off breaks the same finish rule)"}
NOT_NAMED = "side not named (the same request with speculation off ended another way)"


@pytest.mark.contract("STATS-CONSISTENT")
def test_statistics_agree_with_the_stream(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed,
                                          mtp_record):
    """Hypothesis drives sampling controls, depths, budgets and prompts; every
    report must agree with itself and with the emitted tokens. A broken finish
    rule (budget, stop) names its side: the same request with speculation off
    held to the same rules; the statistics are speculation's own."""

    @settings(max_examples=mtp_profile.hypothesis_examples, phases=mtp_profile.hypothesis_phases(),
              deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(sp=sampling_params(), depth=st.integers(1, min(5, mtp_capabilities.max_depth)),
           max_tokens=st.integers(1, 40), prompt=st.sampled_from(sorted(mtp_fixture)), seed=st.integers(0, 2**20))
    def check(sp, depth, max_tokens, prompt, seed):
        req = request(mtp_fixture[prompt], max_tokens, sp.model_copy(update={"seed": mtp_seed + seed}),
                      spec_for(mtp_capabilities, depth))
        res = mtp_backend.generate(req)
        problems = observed_stats_problems(res, req, mtp_capabilities)
        if not problems:
            return
        side = "speculative"
        if finish_problems(res, req, mtp_capabilities):
            # a sampled twin need not end as the speculative run did: it names a side only if it did
            off = without_speculation(req)
            plain = mtp_backend.generate(off)
            side = ("both" if finish_problems(plain, off, mtp_capabilities)
                    else "speculative" if plain.finish_reason == res.finish_reason else None)
        mtp_record(deviating_side=side)
        raise AssertionError(f"{SIDE_WORDS.get(side, NOT_NAMED)}: " + "; ".join(problems))

    check()


@pytest.mark.contract("STATS-CONSISTENT")
def test_statistics_agree_in_results_served_together(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    """The same rules for results served together: each of generate_batch's
    and generate_n's results reports its own request's rounds (a batch slot
    that keeps the previous request's counters shows only here)."""
    caps = mtp_capabilities
    if not (caps.generate_batch or caps.parallel_samples):
        pytest.skip("the backend serves requests one at a time only (no generate_batch, no parallel_samples)")
    reqs = [request(prompt, 12 + 5 * i, SamplingParams(temperature=1.0, seed=mtp_seed + i),
                    spec_for(caps, 1 + i % min(3, caps.max_depth)))
            for i, prompt in enumerate(mtp_fixture.values())]
    served = []
    if caps.generate_batch:
        served += [(f"generate_batch() request {i}", r, res) for i, (r, res)
                   in enumerate(zip(reqs, mtp_backend.generate_batch(reqs), strict=True))]
    if caps.parallel_samples:
        served += [(f"generate_n() sample {i}", reqs[0], res) for i, res in enumerate(
            mtp_backend.generate_n(reqs[0], samples_per_call(caps, 4)))]
    judged = [(what, req, res) for what, req, res in served if not unobserved(res, caps)]
    if not judged:
        pytest.skip("speculation not observed: every result served together reports used with no round statistics "
                    "(a runtime that counts per response, not per sample)")
    problems = [f"{what}: {p}" for what, req, res in judged for p in stats_problems(res, req, caps)]
    assert not problems, f"{len(problems)} problems, first: {problems[:3]}"
