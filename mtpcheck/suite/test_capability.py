import pytest

from mtpcheck.contracts import SamplingParams, SpeculationUnavailableError
from mtpcheck.machinery.configs import request


def _folders(mtp_backend):
    return getattr(mtp_backend, "backend", mtp_backend).checkpoints()


@pytest.mark.contract("CAP-HONESTY")
def test_declared_mtp_capability_matches_the_weights(mtp_backend, mtp_capabilities):
    from mtpcheck.inspect import inspect_checkpoint

    folders = _folders(mtp_backend)
    if "embedded" in mtp_capabilities.mtp_kinds:
        cap = inspect_checkpoint(folders["target"]).capability
        assert cap.kind == "embedded" and cap.validated_depth >= 1, (
            f"declares embedded MTP but the target's weights say {cap.kind} (evidence: {[e.detail for e in cap.evidence]})")


@pytest.mark.contract("CAP-HONESTY")
def test_depth_beyond_capability_is_never_silently_run(mtp_backend, mtp_capabilities, mtp_fixture):
    prompt = next(iter(mtp_fixture.values()))
    too_deep = mtp_capabilities.max_depth + 1
    block = {"mode": "native_mtp", "num_draft_tokens": too_deep}
    res = mtp_backend.generate(request(prompt, 8, SamplingParams(temperature=0.0), block, stop_token_ids=[]))
    s = res.speculation
    assert not s.used or s.num_draft_tokens <= mtp_capabilities.max_depth, (
        f"ran depth {s.num_draft_tokens} beyond the declared max_depth {mtp_capabilities.max_depth}")
    assert max(s.draft_lens, default=0) <= mtp_capabilities.max_depth
    if not s.used:
        assert s.reason == "depth_exceeds_capability", (
            f"reason={s.reason!r} at depth {too_deep}, expected 'depth_exceeds_capability' (message: {s.message!r})")
        with pytest.raises(SpeculationUnavailableError):
            mtp_backend.generate(request(prompt, 8, SamplingParams(temperature=0.0), {**block, "require_acceleration": True}),
                                 expect=(SpeculationUnavailableError,))


@pytest.mark.contract("ASSISTANT-VALIDATION")
def test_the_assistant_run_matches_the_target(mtp_backend, mtp_capabilities):
    from mtpcheck.inspect import check_pair

    folders = _folders(mtp_backend)
    if "assistant" not in mtp_capabilities.mtp_kinds or "assistant" not in folders:
        pytest.skip("the backend runs no external assistant")
    report = check_pair(folders["target"], folders["assistant"], strict=False)
    assert not report.mismatches, f"the assistant it runs does not match the target: {report.mismatches}"
