"""BlackBox: the white-box capabilities withheld, every declared method served."""

import pytest

from mtpcheck.backends.blackbox import WHITE_BOX, load_black_box
from mtpcheck.contracts import GenerationRequest, SamplingParams


def _req(seed):
    return GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=6, trace=True,
                             sampling=SamplingParams(temperature=1.0, seed=seed),
                             speculation={"mode": "native_mtp", "num_draft_tokens": 3})


def test_black_box_serves_what_it_declares_and_hides_traces():
    bb = load_black_box("toy")
    caps = bb.capabilities()
    assert all(getattr(caps, k) == v for k, v in WHITE_BOX.items())
    assert caps.generate_batch  # declared, so it must be served (DIST-EQUIV and DIST-CONTEXT call it)
    batch = bb.generate_batch([_req(1), _req(2)])
    single = [bb.generate(_req(1)), bb.generate(_req(2))]
    assert [r.tokens for r in batch] == [r.tokens for r in single]
    assert all(r.trace is None and r.logprobs is None for r in batch + single)
    with pytest.raises(AttributeError, match="no open_scheduler"):
        _ = bb.open_scheduler


def test_server_mask_keeps_concurrency_and_logprobs_and_hides_the_hooks():
    from mtpcheck.backends.blackbox import HOOKS

    sv = load_black_box("toy", mask="server")
    caps = sv.capabilities()
    assert all(getattr(caps, k) is False for k in HOOKS)
    assert caps.logprobs and caps.concurrent and caps.streaming
    req = _req(4).model_copy(update={"logprobs": True})
    res = sv.generate(req)
    assert res.trace is None and res.logprobs is not None
    assert [r.tokens for r in sv.generate_batch([req, _req(5)])] == [res.tokens, sv.generate(_req(5)).tokens]
    with pytest.raises(ValueError, match="mask='x'"):
        load_black_box("toy", mask="x")


def test_output_mask_withholds_concurrency():
    assert not load_black_box("toy").capabilities().concurrent
