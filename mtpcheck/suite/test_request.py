import pydantic
import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams, SpeculationRequest
from mtpcheck.machinery.configs import request, skip_unless_depth, spec_for


@pytest.mark.contract("REQ-BLOCK")
@pytest.mark.parametrize("block, field", [
    ({"mode": "turbo"}, "mode"),
    ({"num_draft_tokens": 0}, "num_draft_tokens"),
    ({"draft_depth": 3}, "draft_depth"),
])
def test_malformed_block_raises_naming_the_field(block, field, mtp_fixture):
    prompt = next(iter(mtp_fixture.values()))
    with pytest.raises(pydantic.ValidationError, match=field):
        GenerationRequest(prompt_tokens=prompt, speculation=block)


@pytest.mark.contract("REQ-BLOCK")
def test_shorthands_mean_native_mtp_and_off(mtp_backend, mtp_fixture):
    prompt = next(iter(mtp_fixture.values()))
    assert SpeculationRequest.model_validate(True).mode == "native_mtp"
    off = mtp_backend.generate(request(prompt, 8, SamplingParams(temperature=0.0), False))
    assert off.speculation.mode == "off" and not off.speculation.used


@pytest.mark.contract("REQ-OVERRIDE")
def test_per_call_depth_override_does_not_leak(mtp_backend, mtp_capabilities, mtp_fixture):
    prompt = next(iter(mtp_fixture.values()))
    sp = SamplingParams(temperature=0.0)
    default = mtp_backend.generate(request(prompt, 12, sp, None)).speculation
    if not default.used:
        pytest.skip(f"the loaded default does not speculate ({default.reason})")
    other = 1 if default.num_draft_tokens != 1 else min(2, mtp_capabilities.max_depth)
    if other == default.num_draft_tokens:
        pytest.skip("backend supports a single depth")
    skip_unless_depth(mtp_capabilities, other)
    assert mtp_backend.generate(request(prompt, 12, sp, spec_for(mtp_capabilities, other))).speculation.num_draft_tokens == other
    assert mtp_backend.generate(request(prompt, 12, sp, False)).speculation.used is False
    after = mtp_backend.generate(request(prompt, 12, sp, None)).speculation
    assert (after.used, after.num_draft_tokens) == (True, default.num_draft_tokens), "a per-call override leaked"
