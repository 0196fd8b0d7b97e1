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
