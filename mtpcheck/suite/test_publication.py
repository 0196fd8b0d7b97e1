"""Commit-only publication (seed 000: event state is transactional; rejected
proposals never reach the caller), black-box: from the result's events and,
where the backend streams, from the stream itself."""

import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.machinery.checks import events_problems, stream_problems
from mtpcheck.machinery.configs import request, spec_for

GREEDY = SamplingParams(temperature=0.0)


def _requests(caps, prompts, seed, tokens=40):
    """Greedy and seeded sampled requests at depths 1..3 (rejections happen at both)."""
    out = []
    for i, prompt in enumerate(prompts):
        depth = 1 + i % min(3, caps.max_depth)
        for sp in (GREEDY, SamplingParams(temperature=1.0, seed=seed + i)):
            out.append(request(prompt, tokens, sp, spec_for(caps, depth), stop_token_ids=[]))
    return out


@pytest.mark.contract("EVENTS-COMMIT-ONLY")
def test_token_events_are_the_emitted_tokens(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    problems, rejected, published = [], 0, 0
    for req in _requests(mtp_capabilities, list(mtp_fixture.values()), mtp_seed):
        res = mtp_backend.generate(req)
        published += len(res.events)
        s = res.speculation
        rejected += sum(a < d for a, d in zip(s.accept_lens, s.draft_lens, strict=False))
        problems += [f"seed {req.sampling.seed}, T={req.sampling.temperature}: {p}" for p in events_problems(res)]
    if not published:
        pytest.skip("the backend publishes no events (GenerationResult.events is empty)")
    assert not problems, f"{len(problems)} problems, first: {problems[:3]}"
    if not rejected:  # the report's word (a report that hides rejections is STATS-CONSISTENT's business)
        pytest.skip("the report shows no rejected proposal: commit-only publication was not exercised")


@pytest.mark.contract("STREAM-COMMIT-ONLY")
def test_stream_carries_committed_tokens_only(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    problems, unsteady = [], []
    for req in _requests(mtp_capabilities, list(mtp_fixture.values()), mtp_seed):
        if req.sampling.temperature and not mtp_capabilities.seeded_determinism:
            continue  # the final output to compare with is that of the same seed
        chunks = mtp_backend.generate_stream(req)
        final = mtp_backend.generate(req).tokens
        found = stream_problems(chunks, final)
        if found and mtp_backend.generate(req).tokens != final:
            unsteady.append(req.sampling.seed)  # generate() does not repeat itself: not the stream's doing
            continue
        problems += [f"seed {req.sampling.seed}, T={req.sampling.temperature}: {p}" for p in found]
    assert not problems, f"{len(problems)} problems, first: {problems[:3]}"
    if unsteady:
        pytest.skip(f"generate() gave two outputs for the same request (seeds {unsteady}; greedy: None): the "
                    f"stream has no final output to be held to (SEED-DETERMINISM / GREEDY-EQUIV judge that)")
