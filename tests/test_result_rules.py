"""Rules every result obeys, checked on every result the suite receives
(mtpcheck.machinery.invariants) and reported under the clause that owns the
rule, naming the call - not as a failure of the test that made the call. A
fake backend, no model."""

import json
import os

import pytest

from mtpcheck.contracts import Capabilities, GenerationRequest, StreamChunk
from mtpcheck.contracts.report import RunReport
from mtpcheck.machinery.invariants import result_violations, stream_violations

pytest_plugins = ["pytester"]

FAKE = '''
from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport


def _result(req, extra_rounds=0, extra_tokens=0):
    # one round of depth 2 fully accepted per 3 tokens after the prefill token: 1 + 3 r tokens
    rounds = (req.max_tokens - 1) // 3 + extra_rounds
    tokens = [1] * (1 + 3 * ((req.max_tokens - 1) // 3) + extra_tokens)
    s = SpeculationReport(requested=True, used=True, mode="native_mtp", num_draft_tokens=2, runtime="fake",
                          rounds=rounds, drafted=2 * rounds, accepted=2 * rounds, accept_lens=[2] * rounds,
                          draft_lens=[2] * rounds, acceptance_rate=1.0, bonus_tokens=rounds)
    finish = "length" if len(tokens) == req.max_tokens else "stop"
    return GenerationResult(tokens=tokens, text="", finish_reason=finish, speculation=s)


class Fake:
    def __init__(self, batch_rounds=1, overshoot=0):
        self.batch_rounds, self.overshoot = batch_rounds, overshoot

    def capabilities(self):
        return Capabilities(name="fake", version="1.0", vocab_size=8, eos_token_ids=[1], mtp_kinds=["embedded"],
                            max_depth=2, generate_batch=True)

    def generate(self, req):
        return _result(req, extra_tokens=self.overshoot)

    def generate_batch(self, reqs):
        # the slot keeps its counters: every result after the first carries extra rounds
        return [_result(r, extra_rounds=self.batch_rounds if i else 0) for i, r in enumerate(reqs)]


def make(batch_rounds="1", overshoot="0"):
    return Fake(int(batch_rounds), int(overshoot))
'''

DOWN = '''
import pytest

from mtpcheck.contracts import GenerationRequest

REQ = GenerationRequest(prompt_tokens=[3, 4], max_tokens=7, stop_token_ids=[])


@pytest.mark.contract("REQ-BLOCK")
def test_batch_caller(mtp_backend):
    assert len(mtp_backend.generate_batch([REQ, REQ, REQ])) == 3


@pytest.mark.contract("REQ-BLOCK")
def test_one_caller(mtp_backend):
    assert mtp_backend.generate(REQ).tokens


@pytest.mark.contract("STATS-CONSISTENT")
def test_own_check(mtp_backend):
    mtp_backend.generate_batch([REQ, REQ])  # its own clause's rules are this test's to judge: not filed
'''


@pytest.fixture
def tree(pytester, monkeypatch):
    pytester.makepyfile(fakerules=FAKE, test_down=DOWN)
    pytester.syspathinsert()
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return pytester


def run(pytester, *args):
    report = pytester.path / "report.json"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--mtp-backend=fakerules:make",
                                          f"--mtp-json={report}", *args)
    data = json.loads(report.read_text())
    RunReport.model_validate(data)
    return result, data


def test_a_batch_result_with_wrong_statistics_fails_stats_consistent_deselected(tree):
    result, data = run(tree, "--mtp-clauses=REQ-BLOCK")
    assert result.ret == 1  # every test passed its own check; the run fails on the clause
    result.assert_outcomes(passed=2, deselected=1)
    row = data["clauses"]["STATS-CONSISTENT"]
    assert row["outcome"] == "failed"
    assert row["notes"][0].startswith("2 result(s) broke it, first: generate_batch() request 1 in test_batch_caller: "
                                      "7 tokens emitted but statistics imply 10")
    record = data["tests"][next(iter(row["tests"]))]
    assert record["found_in"].endswith("test_down.py::test_batch_caller")
    assert [(b["call"], b["request"]) for b in record["broken_rules"]] == [("generate_batch()", 1),
                                                                          ("generate_batch()", 2)]
    assert row["evidence"][0]["broken_rule"]["call"] == "generate_batch()"
    assert data["clauses"]["REQ-BLOCK"]["outcome"] == "passed"  # the calling clause is judged on its own check
    assert "STATS-CONSISTENT" not in data["not_run"]["clauses"]  # its own test deselected, its rule not
    result.stdout.fnmatch_lines(["STATS-CONSISTENT*FAILED*generate_batch() request 1*"])


def test_the_clause_own_test_judges_its_rules(tree):
    result, data = run(tree, "--mtp-clauses=STATS-CONSISTENT")
    assert result.ret == 0 and data["clauses"]["STATS-CONSISTENT"]["outcome"] == "passed"


def test_a_clause_listed_whole_in_the_xfails_file_covers_its_broken_rules(tree):
    (tree.path / "known.txt").write_text("STATS-CONSISTENT  # slot counters carried\n")
    result, data = run(tree, "--mtp-clauses=REQ-BLOCK", "--mtp-xfails-file=known.txt")
    assert result.ret == 0
    row = data["clauses"]["STATS-CONSISTENT"]
    assert row["outcome"] == "xfailed" and row["notes"] == ["slot counters carried"]


def test_a_rules_line_covers_only_the_broken_rules_found_in_the_tests_it_names(tree):
    """`<prefix> rules=CLAUSE`: the clause's broken rules found in the named
    tests are xfailed; the same rule broken in another test still fails, and
    the named test's own check is not covered."""
    (tree.path / "known.txt").write_text("test_down.py::test_batch_caller rules=STATS-CONSISTENT  # slot counters\n")
    result, data = run(tree, "--mtp-clauses=REQ-BLOCK", "--mtp-xfails-file=known.txt")
    assert result.ret == 0
    records = {k: t for k, t in data["tests"].items() if t.get("found_in")}
    assert [t["outcome"] for t in records.values()] == ["xfailed"] and data["clauses"]["STATS-CONSISTENT"][
        "outcome"] == "xfailed"
    assert data["tests"][next(k for k in data["tests"] if k.endswith("test_batch_caller"))]["outcome"] == "passed"
    (tree.path / "known.txt").write_text("test_down.py::test_one_caller rules=STATS-CONSISTENT  # elsewhere\n")
    result, data = run(tree, "--mtp-clauses=REQ-BLOCK", "--mtp-xfails-file=known.txt")
    assert result.ret == 1 and data["clauses"]["STATS-CONSISTENT"]["outcome"] == "failed"
    (tree.path / "known.txt").write_text("test_down.py rules=NO-SUCH-CLAUSE\n")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "--mtp-backend=fakerules:make",
                                      "--mtp-xfails-file=known.txt")
    assert result.ret == 4 and "rules= names unknown clause ids ['NO-SUCH-CLAUSE']" in str(result.stderr)


def test_a_budget_overshoot_fails_stop_in_block_not_the_caller(tree):
    result, data = run(tree, "--mtp-clauses=REQ-BLOCK", "--mtp-backend-option=batch_rounds=0",
                       "--mtp-backend-option=overshoot=1", "-k", "one_caller")
    assert result.ret == 1
    assert data["clauses"]["REQ-BLOCK"]["outcome"] == "passed"
    assert data["clauses"]["STOP-IN-BLOCK"]["outcome"] == "failed"
    assert "generate() in test_one_caller: 8 tokens emitted, max_tokens was 7" in data["clauses"]["STOP-IN-BLOCK"][
        "notes"][0]


# -- the rules themselves ---------------------------------------------------------------

CAPS = Capabilities(name="c", version="1", vocab_size=8, eos_token_ids=[7], mtp_kinds=["embedded"], max_depth=2)


def _req(**kw):
    return GenerationRequest(prompt_tokens=[1], **{"max_tokens": 6, **kw})


def test_output_rules_of_one_result():
    from mtpcheck.contracts import GenerationResult, SpeculationReport

    off = SpeculationReport(requested=False, used=False, mode="off", runtime="c", reason="not_requested", message="off")
    res = GenerationResult(tokens=[2, 7, 3], text="ab.c", finish_reason="stop", speculation=off)
    found = result_violations(res, _req(stop=["."]), CAPS)
    assert [v.clause for v in found] == ["STOP-IN-BLOCK", "STOP-IN-BLOCK"]
    assert "stop token 7 at index 1, then 1 more tokens" in found[0].problem
    assert "the stop string '.'" in found[1].problem
    # a finish 'length' short of the budget is STATS-CONSISTENT's finish rule
    short = res.model_copy(update={"tokens": [2, 3], "finish_reason": "length"})
    assert [v.clause for v in result_violations(short, _req(), CAPS)] == ["STATS-CONSISTENT"]


def test_stream_rules():
    def chunks(*spec):
        return [StreamChunk(tokens=t, finish_reason=f) for t, f in spec]

    assert stream_violations(chunks(([2], None), ([3], "length")), _req(max_tokens=2), CAPS) == []
    ended_twice = stream_violations(chunks(([2], "stop"), ([3], "length")), _req(max_tokens=2), CAPS)
    assert ended_twice[0].clause == "STREAM-COMMIT-ONLY"
    assert [v.clause for v in stream_violations(chunks(([2, 3, 4], None)), _req(max_tokens=2), CAPS)] == [
        "STREAM-COMMIT-ONLY", "STOP-IN-BLOCK"]  # never ended, and past the budget
    # abandoned before the end: no finish reason owed
    assert stream_violations(chunks(([2], None)), _req(max_tokens=2), CAPS, complete=False) == []


def test_unobserved_statistics_are_not_judged_but_finish_rules_are():
    """A result reported used with no round statistics at all (a runtime that
    counts per response, not per sample) is not a statistics violation; its
    finish rules still hold."""
    from mtpcheck.contracts import GenerationResult, SpeculationReport

    used = SpeculationReport(requested=True, used=True, mode="native_mtp", runtime="c", num_draft_tokens=3)
    res = GenerationResult(tokens=[2, 3, 4], text="abc", finish_reason="length", speculation=used)
    req = _req()
    assert result_violations(res.model_copy(update={"tokens": [2] * req.max_tokens}), req, CAPS) == []
    short = res.model_copy(update={"tokens": [2, 3]})
    assert [v.clause for v in result_violations(short, req, CAPS)] == ["STATS-CONSISTENT"]


def test_a_one_token_result_has_a_round_where_round_0_emits_the_first_token():
    """One token, reported used with no statistics: where the first token is
    the prefill's there was no round (observed, and consistent); where round
    0 emits it (first_token_from_prefill False, mlx-lm) a round ran and no
    statistics say what it drafted: unobserved, as a longer result is, and
    not a statistics violation; with a round reported it is observed."""
    from mtpcheck.contracts import GenerationResult, SpeculationReport
    from mtpcheck.machinery.exercise import unobserved

    used = SpeculationReport(requested=True, used=True, mode="native_mtp", runtime="c", num_draft_tokens=3)
    one = GenerationResult(tokens=[2], text="ab", finish_reason="length", speculation=used)
    req, round0 = _req(max_tokens=1), CAPS.model_copy(update={"first_token_from_prefill": False})
    assert not unobserved(one, CAPS) and unobserved(one, round0)
    assert result_violations(one, req, CAPS) == [] and result_violations(one, req, round0) == []
    counted = used.model_copy(update={"rounds": 1, "drafted": 3, "accept_lens": [0], "draft_lens": [3]})
    assert not unobserved(one.model_copy(update={"speculation": counted}), round0)


def test_text_is_the_tokens_decoded():
    """With the backend's decode(), a result's text is its tokens decoded, stop
    tokens left out, cut before the first stop string; a runtime that also
    leaves out the model's EOS or holds back an incomplete UTF-8 sequence
    conforms; text built from part of the tokens does not."""
    from mtpcheck.contracts import GenerationResult, SpeculationReport

    letters = {2: "ab", 3: "c.d", 4: "e", 7: "<eos>", 5: "\ufffd"}

    def decode(tokens):
        return "".join(letters[t] for t in tokens)

    off = SpeculationReport(requested=False, used=False, mode="off", runtime="c", reason="not_requested", message="off")

    def text_rules(tokens, text, **kw):
        res = GenerationResult(tokens=tokens, text=text, finish_reason="length", speculation=off)
        return [v.problem for v in result_violations(res, _req(max_tokens=len(tokens), **kw), CAPS, decode)]

    assert text_rules([2, 4], "abe") == []
    assert text_rules([2, 4, 5], "abe") == []  # an incomplete UTF-8 sequence held back at the end
    assert text_rules([2, 3, 4], "abc", stop=["."]) == []  # cut before the stop string
    assert text_rules([2, 7, 4], "abe", stop_token_ids=[]) == []  # the model's EOS left out, not a stop here
    assert text_rules([2, 7, 4], "ab<eos>e", stop_token_ids=[]) == []  # or kept
    wrong = text_rules([2, 4], "e")  # a block's earlier token missing from the text
    assert len(wrong) == 1 and "first difference at character 0" in wrong[0]
    # streams: the finished stream's text is judged under STREAM-COMMIT-ONLY
    chunks = [StreamChunk(tokens=[2, 4], text="e", finish_reason="length")]
    found = stream_violations(chunks, _req(max_tokens=2), CAPS, decode=decode)
    assert [v.clause for v in found] == ["STREAM-COMMIT-ONLY"] and "streamed text" in found[0].problem
