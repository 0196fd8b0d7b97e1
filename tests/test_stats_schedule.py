"""STATS-CONSISTENT counts emitted tokens by the schedule the backend declares
(`Capabilities.first_token_from_prefill`), never by guessing: the same report
holds under one schedule and fails under the other."""

import pytest

from mtpcheck.contracts import Capabilities, GenerationRequest, GenerationResult, SpeculationReport
from mtpcheck.machinery.checks import stats_problems

PREFILL = Capabilities(name="b", version="0", vocab_size=16, mtp_kinds=["assistant"], max_depth=3)
NO_PREFILL = PREFILL.model_copy(update={"first_token_from_prefill": False})


def result(n_tokens, accept_lens, depth=3, max_tokens=8, finish="length"):
    draft_lens = [depth] * len(accept_lens)
    spec = SpeculationReport(requested=True, used=True, mode="native_mtp", num_draft_tokens=depth, runtime="t",
                             rounds=len(accept_lens), drafted=sum(draft_lens), accepted=sum(accept_lens),
                             accept_lens=accept_lens, draft_lens=draft_lens,
                             acceptance_rate=sum(accept_lens) / sum(draft_lens) if draft_lens else None)
    req = GenerationRequest(prompt_tokens=[1, 2], max_tokens=max_tokens, speculation=True)
    return GenerationResult(tokens=[3] * n_tokens, text="", finish_reason=finish, speculation=spec), req


def test_the_default_is_the_prefill_schedule():
    assert Capabilities(name="b", version="0", vocab_size=16).first_token_from_prefill is True


@pytest.mark.parametrize("n_tokens, accept_lens, max_tokens", [
    (1, [0], 1),  # mlx-lm's minimal example: greedy, depth 1, max_tokens 1
    (3, [1, 0], 3),  # two rounds, nothing cut
    (3, [1, 1], 3),  # the budget cut the last round by one
])
def test_a_round_0_first_token_holds_only_when_declared(n_tokens, accept_lens, max_tokens):
    res, req = result(n_tokens, accept_lens, max_tokens=max_tokens)
    assert stats_problems(res, req, NO_PREFILL) == []
    problems = stats_problems(res, req, PREFILL)
    assert problems and "statistics imply" in problems[0], problems


@pytest.mark.parametrize("n_tokens, accept_lens, max_tokens", [
    (1, [], 1),  # the prefill token only: no round ran (not counted)
    (6, [2, 1], 6),
    (3, [0, 0], 3),
])
def test_a_prefill_first_token_holds_only_when_declared(n_tokens, accept_lens, max_tokens):
    res, req = result(n_tokens, accept_lens, max_tokens=max_tokens)
    assert stats_problems(res, req, PREFILL) == []
    problems = stats_problems(res, req, NO_PREFILL)
    assert problems and "first_token_from_prefill=False" in problems[0], problems


@pytest.mark.parametrize("n_tokens", [2, 5])
def test_tokens_without_rounds_are_unaccounted_for(n_tokens):
    """used=True but no round: at most the prefill token may have been emitted."""
    res, req = result(n_tokens, [], max_tokens=n_tokens)
    for caps in (PREFILL, NO_PREFILL):
        problems = stats_problems(res, req, caps)
        assert problems and "no round reported" in problems[0], problems
