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


# -- capability `concurrent` (issue 23) --------------------------------------------------


def test_reference_serves_a_batch_together_requests_joining_and_leaving():
    """At most SLOTS in flight; later requests are admitted while earlier ones run."""
    from mtpcheck.backends.reference import SLOTS

    backend = load_toy()
    assert backend.capabilities().concurrent
    engine, in_flight = backend.engine, []
    admit = engine.admit
    live = []

    def counting_admit(req, *a, **k):
        st = admit(req, *a, **k)
        live[:] = [s for s in live if not s.done] + [st]
        in_flight.append(len(live))
        return st

    engine.admit = counting_admit
    reqs = [r.model_copy(update={"max_tokens": 4 + 3 * i}) for i, r in enumerate(_reqs() * 3)]
    batch = backend.generate_batch(reqs)
    engine.admit = admit
    assert max(in_flight) == SLOTS and in_flight[0] == 1 and in_flight[1] > 1
    assert [r.tokens for r in batch] == [backend.generate(q).tokens for q in reqs]


def test_concurrent_needs_generate_batch():
    from pydantic import ValidationError

    from mtpcheck.contracts import Capabilities

    with pytest.raises(ValidationError, match="concurrent=True needs generate_batch=True"):
        Capabilities(name="x", version="0", vocab_size=4, concurrent=True)


class _TogetherIsPlain:
    """FakeTie whose batch serves every request without speculation: a greedy
    speculative request then differs from its solo run at the engineered tie."""

    def __init__(self, gap):
        from tests.faketie import FakeTie

        self.inner = FakeTie(gap=gap)

    def capabilities(self):
        return self.inner.capabilities().model_copy(update={"generate_batch": True, "concurrent": True})

    def generate(self, req):
        return self.inner.generate(req)

    def generate_batch(self, reqs):
        return [self.inner.generate(r.model_copy(update={"speculation": None})) for r in reqs]

    def target_distributions(self, prompt, continuation, sampling):
        return self.inner.target_distributions(prompt, continuation, sampling)


@pytest.mark.parametrize("gap, excused", [("1e-4", True), ("2", False)])
def test_a_greedy_divergence_together_is_triaged_as_a_near_tie_or_not(gap, excused):
    from mtpcheck.machinery.concurrency import divergence
    from tests.faketie import FIRST

    backend = _TogetherIsPlain(gap)
    req = GenerationRequest(prompt_tokens=list(range(1, FIRST + 1)), max_tokens=10,
                            sampling=SamplingParams(temperature=0.0), speculation={"mode": "native_mtp", "num_draft_tokens": 2})
    alone, together = backend.generate(req), backend.generate_batch([req])[0]
    d = divergence(backend, backend.capabilities(), req, alone, together)
    assert d is not None and d["excused"] is excused, d
    assert d["why"].startswith("near-tie") is excused


def test_shared_generator_when_concurrent_is_caught_together_not_alone():
    from mtpcheck.machinery.concurrency import concurrent_mix, divergence
    from mtpcheck.mutants import load_mutant

    backend = load_mutant("shared-generator-when-concurrent")
    caps = backend.capabilities()
    reqs = concurrent_mix(caps, [[3, 4, 5], [7, 1, 2]], base_seed=11)
    alone = [backend.generate(r) for r in reqs]
    assert [r.tokens for r in alone] == [backend.generate(r).tokens for r in reqs]  # exact alone
    together = backend.generate_batch(reqs)
    found = [d for r, a, t in zip(reqs, alone, together, strict=True) if (d := divergence(backend, caps, r, a, t))]
    assert any(not d["excused"] for d in found)
    # the output-only mask serves the batch one by one: the bug is invisible there
    seen = load_mutant("shared-generator-when-concurrent", black_box="1")
    assert not seen.capabilities().concurrent
    assert [r.tokens for r in seen.generate_batch(reqs)] == [r.tokens for r in alone]
