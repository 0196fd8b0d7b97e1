"""Commit-only publication checks (EVENTS-COMMIT-ONLY, STREAM-COMMIT-ONLY) on
the reference and on the mutants that publish too early, in process."""

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams, StreamChunk, TokenEvent
from mtpcheck.machinery.checks import events_problems, rollback_problems, stream_problems


def _req(seed=None, temperature=0.0, trace=False):
    return GenerationRequest(prompt_tokens=[5, 9, 2, 7], max_tokens=24, stop_token_ids=[], trace=trace,
                             speculation={"num_draft_tokens": 3}, sampling=SamplingParams(temperature=temperature, seed=seed))


@pytest.fixture(scope="module")
def toy():
    from mtpcheck.backends.toy import load_toy

    return load_toy()


def test_reference_events_and_stream_are_commit_only(toy):
    for req in (_req(), _req(seed=4, temperature=1.0)):
        res = toy.generate(req)
        assert res.speculation.corrections > 0  # rejections happened: the clause was exercised
        assert events_problems(res) == []
        chunks = list(toy.generate_stream(req))
        assert stream_problems(chunks, res.tokens) == []
        assert [t for c in chunks for t in c.tokens] == res.tokens


def test_events_at_draft_time_are_caught_from_events_and_from_the_trace_window():
    from mtpcheck.mutants import load_mutant

    backend = load_mutant("events-at-draft-time")
    req = _req(seed=1, temperature=1.0, trace=True)
    res = backend.generate(req)
    assert events_problems(res) and "published" in rollback_problems(res, req, "rejection")[-1]


def test_stream_publishing_proposals_is_caught_and_generate_is_not():
    from mtpcheck.mutants import load_mutant

    backend = load_mutant("stream-publishes-proposals")
    req = _req()
    res = backend.generate(req)
    assert events_problems(res) == []
    problems = stream_problems(list(backend.generate_stream(req)), res.tokens)
    assert problems and "rejected proposal" in problems[0]


def test_event_problems_name_the_first_wrong_event():
    res_ok = {"text": "", "finish_reason": "length", "speculation": {"requested": True, "used": True,
                                                                    "mode": "native_mtp", "runtime": "x"}}
    from mtpcheck.contracts import GenerationResult

    res = GenerationResult(tokens=[1, 2, 3], events=[TokenEvent(index=0, token=1), TokenEvent(index=1, token=9),
                                                     TokenEvent(index=1, token=2), TokenEvent(index=2, token=3)], **res_ok)
    (p,) = events_problems(res)
    assert p.startswith("event 1: token 9 at index 1") and "rejected proposal" in p
    missing = GenerationResult(tokens=[1, 2], events=[TokenEvent(index=0, token=1)], **res_ok)
    assert "without an event" in events_problems(missing)[0]
    assert stream_problems([StreamChunk(tokens=[1]), StreamChunk(tokens=[2], finish_reason="length")], [1, 2]) == []
    assert "finish_reason" in stream_problems([StreamChunk(tokens=[1, 2])], [1, 2])[0]


def test_drive_chunks_chunks_a_library_token_stream():
    from mtpcheck.backends._library import drive_chunks

    req = GenerationRequest(prompt_tokens=[1], max_tokens=5, stop_token_ids=[7])
    chunks = [StreamChunk(**c) for c in drive_chunks(iter([(3, None), (4, None), (7, None), (9, None)]), req, [7], None)]
    assert [c.tokens for c in chunks] == [[3], [4], [7]] and chunks[-1].finish_reason == "stop"
    short = [StreamChunk(**c) for c in drive_chunks(iter([5]), req, [7], None)]
    assert [c.tokens for c in short] == [[5], []] and short[-1].finish_reason == "length"


# -- STREAM-DISCONNECT: a client that goes away mid-stream ------------------------------------


def _probes(backend, kind):
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery.disconnect import disconnect_probes, run_probe
    from mtpcheck.machinery.harness import Guarded

    guarded, caps = Guarded(backend), backend.capabilities()
    pairs = disconnect_probes(caps, list(fixture_prompts(backend).values())[:2], 1234, kind)
    return [run_probe(guarded, caps, r, a) for r, a in pairs]


def test_reference_is_unchanged_by_a_client_going_away(toy):
    for kind in ("greedy", "seeded"):
        probes = _probes(toy, kind)
        assert all(p.abandoned and not p.unsteady for p in probes)  # judged, not skipped
        assert [x for p in probes for x in p.problems + p.changed] == []


@pytest.mark.parametrize(("mutant", "kind", "says"), [
    ("abandoned-sampler-reused", "seeded", "after a client went away, position"),
    ("abandoned-rounds-counted", "greedy", "statistics after a client went away"),
])
def test_a_slot_left_dirty_by_a_client_going_away_is_caught(mutant, kind, says):
    from mtpcheck.mutants import load_mutant

    problems = [x for p in _probes(load_mutant(mutant), kind) for x in p.problems + p.changed]
    assert any(says in x for x in problems), problems


def test_a_sampler_reused_after_a_disconnect_spares_greedy_and_complete_streams():
    """The mutant's bug is the disconnect's alone: greedy probes and requests after complete streams are exact."""
    from mtpcheck.mutants import load_mutant

    assert [x for p in _probes(load_mutant("abandoned-sampler-reused"), "greedy") for x in p.problems + p.changed] == []
    backend = load_mutant("abandoned-sampler-reused")
    req = _req(seed=4, temperature=1.0)
    first = backend.generate(req).tokens
    list(backend.generate_stream(_req(seed=5, temperature=1.0)))
    assert backend.generate(req).tokens == first


def test_abandon_stream_closes_the_generator_in_the_reading_thread_and_names_failures():
    import threading
    import time

    from mtpcheck.machinery.harness import BackendGarbage, BackendTimeout, Guarded

    class Streams:
        def __init__(self, mode):
            self.mode, self.closed_in = mode, None

        def capabilities(self):
            from mtpcheck.contracts import Capabilities

            return Capabilities(name="s", version="0", vocab_size=16, max_depth=1, streaming=True)

        def generate_stream(self, req):
            try:
                for i in range(100):
                    if self.mode == "hang" and i == 1:
                        time.sleep(30)
                    yield {"tokens": [99] if self.mode == "garbage" else [i % 16]}
            finally:
                self.closed_in = threading.current_thread().name

    b = Streams("ok")
    chunks, ended = Guarded(b, timeout=10).abandon_stream(_req(), after=3)
    assert [c.tokens for c in chunks] == [[0], [1], [2]] and not ended
    assert b.closed_in.startswith("mtpcheck:")  # closed where it was read, not left to the garbage collector
    with pytest.raises(BackendTimeout):
        Guarded(Streams("hang"), timeout=0.5).abandon_stream(_req(), after=3)
    with pytest.raises(BackendGarbage, match="outside the vocabulary"):
        Guarded(Streams("garbage"), timeout=10).abandon_stream(_req(), after=3)


def test_drive_chunks_closes_its_source_when_the_caller_goes_away():
    from mtpcheck.backends._library import drive_chunks

    closed = []

    def source():
        try:
            yield from range(1, 50)
        finally:
            closed.append(True)

    req = GenerationRequest(prompt_tokens=[1], max_tokens=40, stop_token_ids=[])
    gen = drive_chunks(source(), req, [], None)
    next(gen), next(gen)
    gen.close()
    assert closed == [True]


def test_a_runtime_that_does_not_repeat_itself_is_not_blamed_for_a_change_after_a_disconnect():
    """judge(): statistics and prefix problems fail on their own; a probe that changed after a disconnect
    fails only when every probe repeated itself after identical complete streams, else the test skips."""
    from mtpcheck.machinery.disconnect import Probe, judge

    change = "seed 2: after a client went away, position 3"
    assert judge([Probe(1), Probe(2, changed=[change])])[1].startswith("every stream ended")
    failure, skip, ev = judge([Probe(1, abandoned=True), Probe(2, abandoned=True, changed=[change])])
    assert change in failure and skip is None and ev["changed"] == [change]
    failure, skip, ev = judge([Probe(1, abandoned=True, unsteady=True), Probe(2, abandoned=True, changed=[change])])
    assert failure is None and "seeds [1]" in skip and change in skip and ev["unsteady"] == [1]
    failure, _, _ = judge([Probe(1, abandoned=True, unsteady=True), Probe(2, abandoned=True, problems=["stats"])])
    assert "stats" in failure
    assert judge([Probe(1, abandoned=True)]) == (None, None, judge([Probe(1, abandoned=True)])[2])
