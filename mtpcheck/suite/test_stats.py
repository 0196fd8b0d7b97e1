import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpcheck.machinery.checks import stats_problems
from mtpcheck.machinery.configs import request, spec_for
from mtpcheck.machinery.strategies import sampling_params


@pytest.mark.contract("STATS-CONSISTENT")
def test_statistics_agree_with_the_stream(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed):
    """Hypothesis drives sampling controls, depths, budgets and prompts; every
    report must agree with itself and with the emitted tokens."""

    @settings(max_examples=mtp_profile.hypothesis_examples, phases=mtp_profile.hypothesis_phases(),
              deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(sp=sampling_params(), depth=st.integers(1, min(5, mtp_capabilities.max_depth)),
           max_tokens=st.integers(1, 40), prompt=st.sampled_from(sorted(mtp_fixture)), seed=st.integers(0, 2**20))
    def check(sp, depth, max_tokens, prompt, seed):
        req = request(mtp_fixture[prompt], max_tokens, sp.model_copy(update={"seed": mtp_seed + seed}),
                      spec_for(mtp_capabilities, depth))
        res = mtp_backend.generate(req)
        problems = stats_problems(res, req, mtp_capabilities)
        assert not problems, "; ".join(problems)

    check()
