import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpcheck.machinery.checks import finish_problems, stats_problems
from mtpcheck.machinery.configs import request, spec_for, without_speculation
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
        problems = stats_problems(res, req, mtp_capabilities)
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
