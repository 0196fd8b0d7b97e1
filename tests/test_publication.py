"""Commit-only publication checks (EVENTS-COMMIT-ONLY, STREAM-COMMIT-ONLY) on
the reference and on the mutants that publish too early, in process."""

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams, StreamChunk, TokenEvent
from mtpcheck.machinery.checks import events_problems, stream_problems, trace_problems


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
    res = backend.generate(_req(seed=1, temperature=1.0, trace=True))
    assert events_problems(res) and "published" in trace_problems(res, _req(seed=1, temperature=1.0, trace=True),
                                                                  "rejection")["TRACE-ROLLBACK"][-1]


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
