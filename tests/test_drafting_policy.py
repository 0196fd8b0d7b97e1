"""REPORT-DEPTH under a declared drafting policy (issue 21, item 3): a fixed-depth
drafter must draft min(depth, room) every round; a drafter that may find nothing
to propose (n-gram, prompt lookup) may draft 0..depth, never more."""

from mtpcheck.contracts import GenerationRequest, GenerationResult, SpeculationReport
from mtpcheck.machinery.checks import depth_problems


def result(draft_lens, accept_lens, depth=3):
    tokens = 1 + sum(accept_lens) + len(accept_lens)
    return GenerationResult(tokens=list(range(tokens)), text="", finish_reason="length", speculation=SpeculationReport(
        requested=True, used=True, mode="native_mtp", num_draft_tokens=depth, runtime="t", rounds=len(draft_lens),
        drafted=sum(draft_lens), accepted=sum(accept_lens), draft_lens=draft_lens, accept_lens=accept_lens))


REQ = GenerationRequest(prompt_tokens=[1], max_tokens=32)


def test_fixed_depth_rounds_must_draft_the_depth():
    ok = result([3, 3, 3], [3, 1, 0])
    assert depth_problems(ok, REQ, 3) == []
    short = result([3, 0, 2], [3, 0, 1])  # a round that drafts nothing with room left
    problems = depth_problems(short, REQ, 3)
    assert [p.split(":")[0] for p in problems] == ["round 1", "round 2"], problems
    assert "expected 3" in problems[0]


def test_a_variable_drafter_may_draft_fewer_never_more():
    variable = result([3, 0, 2, 1], [3, 0, 1, 1])
    assert depth_problems(variable, REQ, 3, drafting="up_to_k") == []
    over = result([3, 4, 1], [3, 4, 0])  # one round proposes more than the depth asked for
    problems = depth_problems(over, REQ, 3, drafting="up_to_k")
    assert len(problems) == 1 and problems[0].startswith("round 1: drafted 4 proposals, expected 0..3"), problems
    # the same over-drafting round fails the fixed policy as well
    assert any(p.startswith("round 1: drafted 4") for p in depth_problems(over, REQ, 3))
