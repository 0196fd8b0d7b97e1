"""Capability generate_batch: the reference serves a batch as generate() would,
and the guarded call rejects a batch answer of the wrong shape."""

import pytest

from mtpcheck.backends.toy import load_toy
from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.machinery.harness import BackendGarbage, Guarded


def _reqs():
    return [GenerationRequest(prompt_tokens=[3, 4, 5], max_tokens=12, sampling=SamplingParams(temperature=1.0, seed=s),
                              speculation={"mode": "native_mtp", "num_draft_tokens": 2}) for s in (1, 2, 3)]


def test_reference_batch_equals_one_by_one():
    backend = Guarded(load_toy())
    assert backend.capabilities().generate_batch
    batch = backend.generate_batch(_reqs())
    assert [r.tokens for r in batch] == [backend.generate(q).tokens for q in _reqs()]


def test_a_short_batch_answer_is_garbage():
    class Short:
        def __init__(self):
            self.inner = load_toy()

        def capabilities(self):
            return self.inner.capabilities()

        def generate_batch(self, reqs):
            return [self.inner.generate(r) for r in reqs[:-1]]

    with pytest.raises(BackendGarbage, match="generate_batch\\(\\) returned list of length 2 for 3 requests"):
        Guarded(Short()).generate_batch(_reqs())
