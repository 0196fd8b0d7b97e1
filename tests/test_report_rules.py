"""Issue 24, items 3 and 4 on synthetic results: STATS-CONSISTENT's finish
rules (a "length" finish spent the budget, a "stop" finish ends on a stop
token) and REPORT-HONEST's (used=True means every round with room drafted)."""

from mtpcheck.contracts import Capabilities, GenerationRequest, GenerationResult, SpeculationReport
from mtpcheck.machinery.checks import finish_problems, honesty_problems, stats_problems

CAPS = Capabilities(name="t", version="0", vocab_size=16, eos_token_ids=[0], mtp_kinds=["embedded"], max_depth=3,
                    first_token_from_prefill=True)


def result(tokens, finish, draft_lens=(), accept_lens=(), **report):
    s = SpeculationReport(requested=True, used=bool(draft_lens), mode="native_mtp", num_draft_tokens=3, runtime="t",
                          rounds=len(draft_lens), drafted=sum(draft_lens), accepted=sum(accept_lens),
                          draft_lens=list(draft_lens), accept_lens=list(accept_lens),
                          acceptance_rate=sum(accept_lens) / sum(draft_lens) if sum(draft_lens) else None, **report)
    return GenerationResult(tokens=list(tokens), text="", finish_reason=finish, speculation=s)


def test_a_length_finish_spent_the_budget():
    req = GenerationRequest(prompt_tokens=[1], max_tokens=8)
    assert finish_problems(result([5] * 8, "length"), req, CAPS) == []
    short = finish_problems(result([5] * 6, "length"), req, CAPS)
    assert short and "finish_reason='length' with 6 tokens, max_tokens 8" in short[0]
    # and STATS-CONSISTENT reports it, with or without speculation
    assert stats_problems(result([5] * 6, "length"), req, CAPS) == short
    spec = result([5] * 6, "length", draft_lens=[3, 3], accept_lens=[1, 2])  # 1 + 3 accepted + 2 rounds = 6
    assert any("finish_reason='length'" in p for p in stats_problems(spec, req, CAPS))


def test_a_stop_finish_ends_on_a_stop_token():
    req = GenerationRequest(prompt_tokens=[1], max_tokens=8)
    assert finish_problems(result([5, 5, 0], "stop"), req, CAPS) == []  # the backend's EOS
    wrong = finish_problems(result([5, 5, 4], "stop"), req, CAPS)
    assert wrong and "last token 4 is no stop token ([0])" in wrong[0]
    own = req.model_copy(update={"stop_token_ids": [4]})
    assert finish_problems(result([5, 5, 4], "stop"), own, CAPS) == []
    strings = req.model_copy(update={"stop": ["\n"]})  # a stop string ends wherever its text does
    assert finish_problems(result([5, 5, 4], "stop"), strings, CAPS) == []


def test_a_stop_token_at_the_budget_is_a_stop_not_a_length_finish():
    req = GenerationRequest(prompt_tokens=[1], max_tokens=3)
    assert finish_problems(result([5, 5, 0], "stop"), req, CAPS) == []
    wrong = finish_problems(result([5, 5, 0], "length"), req, CAPS)
    assert wrong and "finish_reason='length' but the last token 0 is a stop token" in wrong[0]
    ignored = req.model_copy(update={"stop_token_ids": []})  # the request stops on nothing: length is right
    assert finish_problems(result([5, 5, 0], "length"), ignored, CAPS) == []


def test_used_means_every_round_with_room_drafted():
    req = GenerationRequest(prompt_tokens=[1], max_tokens=12)
    honest = result([5] * 12, "length", draft_lens=[3, 3, 3], accept_lens=[3, 1, 2])
    assert honesty_problems(honest, req, CAPS) == []
    # speculation in round 0, then plain decoding reported as 0-draft rounds
    fallback = result([5] * 8, "length", draft_lens=[3, 0, 0, 0], accept_lens=[3, 0, 0, 0])
    req8 = GenerationRequest(prompt_tokens=[1], max_tokens=8)
    problems = honesty_problems(fallback, req8, CAPS)
    assert [p.split(":")[0] for p in problems] == ["round 1", "round 2"], problems  # round 3: no room (7 of 8)
    # the report that says so is honest
    said = result([5] * 8, "length", draft_lens=[3, 0, 0, 0], accept_lens=[3, 0, 0, 0], adaptive_disabled=True,
                  message="acceptance fell below 0.1: speculation off after round 0")
    assert honesty_problems(said, req8, CAPS) == []
    # a drafter that may find nothing (n-gram) is not held to it
    assert honesty_problems(fallback, req8, CAPS.model_copy(update={"drafting": "up_to_k"})) == []
    # the last round has no room: drafting nothing there is no fallback
    end = result([5] * 5, "length", draft_lens=[3, 0], accept_lens=[3, 0])
    assert honesty_problems(end, GenerationRequest(prompt_tokens=[1], max_tokens=5), CAPS) == []


def test_history_dependence_is_named_by_seed_history_not_blamed_on_the_stream(tmp_path):
    """Issue 24, item 6: a runtime whose output depends on the request before
    it (zoo: previous-seed-mixed). STREAM-COMMIT-ONLY used to compare a stream
    served after another request with a generate() served after the same one,
    and blamed the stream; now the stream and the call it is held to follow
    the same request, and SEED-HISTORY names the bug."""
    import json
    import os
    import subprocess
    import sys

    report = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "-q",
                    "--mtp-backend=mtpcheck.mutants:load_mutant", "--mtp-backend-option", "name=previous-seed-mixed",
                    "--mtp-clauses=STREAM-COMMIT-ONLY,SEED-HISTORY", f"--mtp-json={report}"],
                   cwd=tmp_path, env={**os.environ, "MLX_DISABLE_COMPILE": "1"}, capture_output=True, timeout=600)
    clauses = json.loads(report.read_text())["clauses"]
    assert clauses["SEED-HISTORY"]["outcome"] == "failed"
    assert clauses["STREAM-COMMIT-ONLY"]["outcome"] in ("passed", "skipped"), clauses["STREAM-COMMIT-ONLY"]["notes"]
