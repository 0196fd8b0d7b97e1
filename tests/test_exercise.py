"""Evidence of exercise (issue 32, item 1): a suite test that passes on
speculative results holding no accepted proposal judged nothing of
speculation and fails, named; an xfails line does not cover it; a request
the backend declared unaccelerated makes a skip naming the control; the
report and the table carry the counts. A fake backend, no model."""

import json
import os

import pytest

from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculationReport,
)
from mtpcheck.machinery.exercise import Tally, controls_of, merge, summary, verdict

pytest_plugins = ["pytester"]

FAKE = '''
from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport


class Fake:
    """Greedy 'speculation' over an 8-token vocabulary; `accepted` proposals of 3 per round are accepted."""

    def __init__(self, accepted):
        self.accepted = accepted

    def capabilities(self):
        return Capabilities(name="fake", version="1.0", vocab_size=8, mtp_kinds=["embedded"], max_depth=3,
                            speculative_sampling_controls=["temperature"])

    def generate(self, req):
        spec = req.speculation is None or req.speculation.mode != "off"
        n = req.max_tokens
        # rounds of `accepted` proposals and one more token each, after the prefill's: consistent statistics
        lens, left = [], n - 1
        while left > 0:
            lens.append(min(self.accepted, left - 1))
            left -= lens[-1] + 1
        s = (SpeculationReport(requested=True, used=True, mode="native_mtp", runtime="fake", num_draft_tokens=3,
                               rounds=len(lens), drafted=3 * len(lens), accepted=sum(lens), accept_lens=lens,
                               draft_lens=[3] * len(lens), acceptance_rate=sum(lens) / (3 * len(lens)))
             if spec and not req.sampling.top_k else
             SpeculationReport(requested=spec, used=False, mode="native_mtp" if spec else "off", runtime="fake",
                               reason="sampling_control_unsupported" if spec else "not_requested", message="no"))
        return GenerationResult(tokens=[1] * n, text="", finish_reason="length", speculation=s)


def dead():
    return Fake(0)


def live():
    return Fake(1)


class Raising(Fake):
    def generate(self, req):
        raise ConnectionError("the server went away")


def raising():
    return Raising(1)


class Seeded(Fake):
    """Accepts on odd request seeds only: a live drafter whose acceptance is low enough that a sample holds none."""

    def generate(self, req):
        self.accepted = 1 if (req.sampling.seed or 0) % 2 else 0
        return super().generate(req)


def seeded():
    return Seeded(0)
'''

SEEDED = '''
import pytest
from mtpcheck.contracts import GenerationRequest, SamplingParams


@pytest.mark.contract("GREEDY-EQUIV")
def test_seeded(mtp_backend, mtp_seed, mtp_record):
    mtp_record(seed=mtp_seed)
    assert mtp_backend.generate(GenerationRequest(
        prompt_tokens=[1], max_tokens=8, sampling=SamplingParams(temperature=1.0, seed=mtp_seed),
        speculation={"mode": "native_mtp", "num_draft_tokens": 3})).tokens
'''

DOWN = '''
import pytest
from mtpcheck.contracts import GenerationRequest, SamplingParams


def ask(backend, **sp):
    return backend.generate(GenerationRequest(prompt_tokens=[1], max_tokens=8, sampling=SamplingParams(**sp),
                                              speculation={"mode": "native_mtp", "num_draft_tokens": 3}))


@pytest.mark.contract("GREEDY-EQUIV")
def test_greedy(mtp_backend):
    assert ask(mtp_backend, temperature=0.0).tokens


@pytest.mark.contract("GREEDY-EQUIV")
def test_plain_only(mtp_backend):
    mtp_backend.generate(GenerationRequest(prompt_tokens=[1], max_tokens=4, speculation=False))


@pytest.mark.contract("STATS-CONSISTENT")
def test_top_k(mtp_backend):
    assert ask(mtp_backend, temperature=1.0, top_k=2).tokens


@pytest.mark.contract("REQ-OVERRIDE")
def test_needs_nothing(mtp_backend):
    assert ask(mtp_backend, temperature=0.0).tokens


@pytest.mark.contract("GREEDY-EQUIV")
@pytest.mark.exercise(reason="a short request")
def test_exempt(mtp_backend):
    assert ask(mtp_backend, temperature=0.0).tokens
'''


@pytest.fixture
def tree(pytester, monkeypatch):
    pytester.makepyfile(fakeexercise=FAKE, test_down=DOWN)
    pytester.syspathinsert()
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return pytester


def run(pytester, factory, *args):
    report = pytester.path / "report.json"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", f"--mtp-backend=fakeexercise:{factory}",
                                          f"--mtp-json={report}", *args)
    return result, json.loads(report.read_text())


def test_dead_speculation_cannot_read_green(tree):
    result, data = run(tree, "dead")
    assert result.ret == 1
    tests = {n.split("::")[1]: t for n, t in data["tests"].items()}
    assert tests["test_greedy"]["outcome"] == "failed"
    assert "speculation not exercised: 0 of 21 proposals accepted over 1 speculative requests" in \
        tests["test_greedy"]["message"]
    assert tests["test_greedy"]["exercise"]["accepted"] == 0 and tests["test_greedy"]["exercise"]["drafted"] == 21
    assert tests["test_plain_only"]["outcome"] == "passed"  # no speculative request: nothing owed
    assert tests["test_plain_only"].get("exercise") is None
    assert tests["test_needs_nothing"]["outcome"] == "passed"  # REQ-OVERRIDE judges the request, not acceptance
    assert tests["test_exempt"]["outcome"] == "passed"  # the marker exempts it
    # declared unaccelerated (top_k outside speculative_sampling_controls, used False): a skip naming it
    assert tests["test_top_k"]["outcome"] == "skipped"
    assert "declares top_k unaccelerated" in tests["test_top_k"]["message"]
    assert data["clauses"]["GREEDY-EQUIV"]["outcome"] == "failed"
    assert data["clauses"]["GREEDY-EQUIV"]["exercise"]["requests"] == 2
    result.stdout.fnmatch_lines(["STATS-CONSISTENT*SKIPPED*unaccelerated (1 req)*",
                                 "GREEDY-EQUIV*FAILED*acc 0/42, rej 42, 2 req  speculation not exercised*"])


MOVED = 1234 + 0x9E3779B9  # the redraw's base seed for --mtp-seed=1234 (odd: the seeded fake accepts there)


def test_a_seeded_sample_that_held_none_is_drawn_once_more(tree):
    """A live drafter whose seed-1234 sample holds no accepted proposal is not
    failed on that chance: the seeded test is drawn again at a moved seed and
    judged on that sample, and the first sample stays in the report."""
    tree.makepyfile(test_seeded=SEEDED)
    result, data = run(tree, "seeded", "test_seeded.py")
    assert result.ret == 0, result.stdout.str()[-2000:]
    t = next(iter(data["tests"].values()))
    assert t["outcome"] == "passed" and t["evidence"] == [{"seed": MOVED}]
    assert t["exercise"]["accepted"] == 3 and t["exercise_margin"]["count"] == 3
    first = t["exercise_redraw"]
    assert (first["seed"], first["redraw_seed"]) == (1234, MOVED) and first["evidence"] == [{"seed": 1234}]
    assert first["exercise"]["accepted"] == 0 and first["message"].startswith("speculation not exercised: 0 of 21")
    result.stdout.fnmatch_lines(["mtpcheck: redrawn: 1 seeded test(s) held nothing of what they need at the run's "
                                 "seed and were judged on a second sample*: test_seeded"])
    # a first sample that exercised is judged as it is: no redraw
    result, data = run(tree, "seeded", "test_seeded.py", "--mtp-seed=1235")
    t = next(iter(data["tests"].values()))
    assert t["outcome"] == "passed" and t["exercise_redraw"] is None and t["evidence"] == [{"seed": 1235}]


def test_a_dead_drafter_fails_at_both_seeds(tree):
    tree.makepyfile(test_seeded=SEEDED)
    result, data = run(tree, "dead", "test_seeded.py", "test_down.py")
    tests = {n.split("::")[1]: t for n, t in data["tests"].items()}
    t = tests["test_seeded"]
    assert t["outcome"] == "failed" and t["exercise_redraw"]["seed"] == 1234
    assert (f"speculation not exercised: 0 of 21 proposals accepted over 1 speculative requests (1 reported used, "
            f"7 rounds), drawn again at base seed {MOVED}; at seed 1234: speculation not exercised: 0 of 21") in \
        t["message"]
    # a test that does not take the seed would draw the same sample: not redrawn
    assert tests["test_greedy"]["outcome"] == "failed" and tests["test_greedy"]["exercise_redraw"] is None
    # a fixture built on the seed is not drawn again: the test does not take the seed itself
    tree.makepyfile(test_built='''
import pytest
from mtpcheck.contracts import GenerationRequest, SamplingParams


@pytest.fixture
def sample(mtp_backend, mtp_seed):
    return mtp_backend.generate(GenerationRequest(
        prompt_tokens=[1], max_tokens=8, sampling=SamplingParams(temperature=1.0, seed=mtp_seed),
        speculation={"mode": "native_mtp", "num_draft_tokens": 3}))


@pytest.mark.contract("GREEDY-EQUIV")
def test_built(sample):
    assert sample.tokens
''')
    _, data = run(tree, "seeded", "test_built.py")
    t = next(iter(data["tests"].values()))
    assert t["outcome"] == "failed" and t["exercise_redraw"] is None, t
    # a line pinned exercise=none documents the unexercised sample: not redrawn, xfailed
    (tree.path / "pinned.txt").write_text("test_seeded.py::test_seeded  exercise=none  # acceptance collapsed\n")
    result, data = run(tree, "seeded", "test_seeded.py", f"--mtp-xfails-file={tree.path / 'pinned.txt'}")
    t = next(iter(data["tests"].values()))
    assert t["outcome"] == "xfailed" and t["exercise_redraw"] is None


def test_live_speculation_passes_with_its_counts(tree):
    result, data = run(tree, "live")
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert data["clauses"]["GREEDY-EQUIV"]["outcome"] == "passed"
    assert data["clauses"]["GREEDY-EQUIV"]["exercise"]["accepted"] == 6
    result.stdout.fnmatch_lines(["GREEDY-EQUIV*PASSED*acc 6/24, rej 18, 2 req*"])


def test_a_thin_pass_is_named(tree):
    """3 accepted of 12 proposals pass, and the run says that a rerun at that
    rate holds none with probability about exp(-3): the flake named before CI
    meets it. A test that needs nothing (REQ-OVERRIDE) or is exempt has no margin."""
    result, data = run(tree, "live")
    tests = {n.split("::")[1]: t for n, t in data["tests"].items()}
    assert tests["test_greedy"]["exercise_margin"] == {"count": 3, "what": "accepted", "drafted": 12}
    assert tests["test_needs_nothing"]["exercise_margin"] is None and tests["test_exempt"]["exercise_margin"] is None
    result.stdout.fnmatch_lines(["mtpcheck: thin exercise: 1 passing test rests on fewer than 14 proposals*up to "
                                 "0.05*test_greedy (3 accepted of 12)*"])


def test_an_xfails_line_does_not_cover_not_exercised(tree):
    (tree.path / "known.txt").write_text("test_down.py::test_greedy  # a documented law deviation\n")
    result, data = run(tree, "dead", "--mtp-xfails-file=known.txt")
    t = next(t for n, t in data["tests"].items() if n.endswith("::test_greedy"))
    assert t["outcome"] == "failed"
    assert "not the documented deviation" in t["message"] and "speculation not exercised" in t["message"]


# -- the rule itself ------------------------------------------------------------------


def _pair(sp: SamplingParams, used=True, drafted=6, accepted=0, spec=True):
    req = GenerationRequest(prompt_tokens=[1], max_tokens=8, sampling=sp, speculation=spec)
    rep = SpeculationReport(requested=spec, used=used, mode="native_mtp" if spec else "off", runtime="t",
                            rounds=2 if used else 0, drafted=drafted, accepted=accepted,
                            accept_lens=[accepted, 0] if used else [], draft_lens=[drafted, 0] if used else [],
                            reason=None if used else "sampling_control_unsupported", message=None if used else "m")
    return req, GenerationResult(tokens=[1] * 8, text="", finish_reason="length", speculation=rep)


CAPS = Capabilities(name="t", version="1", vocab_size=8, speculative_sampling_controls=["temperature", "seed"])


def test_rejections_are_owed_where_the_clause_is_about_them():
    t = Tally()
    t.add(*_pair(SamplingParams(temperature=1.0), drafted=6, accepted=6), CAPS)
    assert verdict(t.as_dict(), ["accepted"]) is None
    kind, message = verdict(t.as_dict(), ["accepted", "rejected"])
    assert kind == "fail" and message.startswith("rejection not exercised: 0 of 6 proposals rejected")


def test_a_result_counts_once_and_a_used_request_counts_whatever_was_declared():
    t = Tally()
    pair = _pair(SamplingParams(temperature=1.0, top_k=3), used=True, drafted=6, accepted=2)
    t.add(*pair, CAPS)
    t.add(*pair, CAPS)  # the same result noted again (a shared sample)
    assert (t.requests, t.unaccelerated, t.accepted) == (1, 0, 2)  # speculated on top_k: judged
    t.add(*_pair(SamplingParams(temperature=0.0), spec=False, used=False, drafted=0), CAPS)
    assert t.requests == 1  # speculation off: not counted


def test_controls_and_the_table_cell():
    assert controls_of(SamplingParams(temperature=0.7, top_p=1.0, min_p=0.0, seed=3)) == ["temperature", "seed"]
    assert controls_of(SamplingParams(temperature=0.0, repetition_penalty=1.1, logit_bias={1: 2.0})) == [
        "temperature", "repetition_penalty", "logit_bias"]
    t = Tally()
    t.add(*_pair(SamplingParams(temperature=1.0), drafted=5, accepted=3), CAPS)
    assert summary(t.as_dict()) == "acc 3/5, rej 2, 1 req"
    assert summary(merge([t.as_dict(), None, t.as_dict()])) == "acc 6/10, rej 4, 2 req"
    assert summary(None) == ""


def test_results_without_round_statistics_are_not_observed_rather_than_dead():
    """vLLM's n > 1: its counters are per response, so each sample says used with no rounds."""
    t2 = Tally()
    req, res = _pair(SamplingParams(temperature=1.0), used=True, drafted=0, accepted=0)
    res = res.model_copy(update={"speculation": res.speculation.model_copy(update={"rounds": 0, "accept_lens": [],
                                                                                    "draft_lens": []})})
    t2.add(req, res, CAPS)
    assert t2.unobserved == 1
    kind, message = verdict(t2.as_dict(), ["accepted"])
    assert kind == "skip" and message.startswith("speculation not observed")
    t2.add(*_pair(SamplingParams(temperature=1.0), used=True, drafted=4, accepted=0), CAPS)  # one observed, dead
    assert verdict(t2.as_dict(), ["accepted"])[0] == "fail"


def test_only_a_line_pinned_exercise_none_documents_unexercised_speculation(tree):
    """A plain xfails line does not cover "not exercised"; one pinned exercise=none
    does, and covers nothing else (a failure of the clause's own check)."""
    (tree.path / "plain.txt").write_text("test_down.py::test_greedy  # a deviation of the check\n")
    result, data = run(tree, "dead", f"--mtp-xfails-file={tree.path / 'plain.txt'}")
    assert {n.split("::")[1]: t for n, t in data["tests"].items()}["test_greedy"]["outcome"] == "failed"
    (tree.path / "pinned.txt").write_text("test_down.py::test_greedy  exercise=none  # acceptance collapsed\n")
    result, data = run(tree, "dead", f"--mtp-xfails-file={tree.path / 'pinned.txt'}")
    assert {n.split("::")[1]: t for n, t in data["tests"].items()}["test_greedy"]["outcome"] == "xfailed"
    tree.makepyfile(test_check='''
import pytest


@pytest.mark.contract("GREEDY-EQUIV")
def test_check(mtp_backend):
    assert False, "the check itself"
''')
    (tree.path / "check.txt").write_text("test_check.py::test_check  exercise=none  # acceptance collapsed\n")
    result, data = run(tree, "live", f"--mtp-xfails-file={tree.path / 'check.txt'}")
    assert {n.split("::")[1]: t for n, t in data["tests"].items()}["test_check"]["outcome"] == "failed"


def test_an_xpassed_exercise_none_line_is_not_called_fixed(tree):
    """A runtime that accepts on some samples passes under its exercise=none line:
    the closing hint keeps that line and calls only a deviation line fixed."""
    (tree.path / "pinned.txt").write_text("test_down.py::test_greedy  exercise=none  # acceptance collapsed\n")
    result, data = run(tree, "live", f"--mtp-xfails-file={tree.path / 'pinned.txt'}")
    assert {n.split("::")[1]: t for n, t in data["tests"].items()}["test_greedy"]["outcome"] == "xpassed"
    out = result.stdout.str()
    assert "1 XPASSED under an exercise=none or raises= line" in out and "is fixed: remove it" not in out, out
    (tree.path / "plain.txt").write_text("test_down.py::test_greedy  # a deviation of the check\n")
    result, _ = run(tree, "live", f"--mtp-xfails-file={tree.path / 'plain.txt'}")
    out = result.stdout.str()
    assert "an XPASSED deviation line is fixed: remove it" in out and "exercise=none or raises=" not in out, out


def test_constraint_language_owes_accepted_proposals(pytester):
    """A runtime that rejects every proposal (lossless plain output reported as
    speculation) passed CONSTRAINT-LANGUAGE's own checks: it now fails as not
    exercised, on the reference fixture (the toy has no text)."""
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=mtpcheck.mutants:load_mutant",
        "--mtp-backend-option=name=accepts-nothing", "--mtp-backend-option=base=mlx",
        "--mtp-clauses=CONSTRAINT-LANGUAGE", f"--mtp-json={report}")
    row = json.loads(report.read_text())["clauses"]["CONSTRAINT-LANGUAGE"]
    assert row["outcome"] == "failed", result.stdout.str()[-2000:]
    assert row["notes"][0].startswith("speculation not exercised: 0 of ")
    assert row["exercise"]["accepted"] == 0 and row["exercise"]["drafted"] > 0


def test_a_line_pinned_raises_documents_that_raise_only(tree):
    """A runtime that crashes on a request (a documented deviation with a
    reproduction) is excused by a line pinned raises=<its exception> or
    raises=BackendRaised, and by nothing else: a plain line, another
    exception's name, or a failure of the clause's own check stay failed.
    raises= takes no other pin."""
    def outcome(factory, line, test="test_greedy"):
        (tree.path / "x.txt").write_text(line + "\n")
        result, data = run(tree, factory, f"--mtp-xfails-file={tree.path / 'x.txt'}")
        return {n.split("::")[1]: t for n, t in data["tests"].items()}[test], result

    assert outcome("raising", "test_down.py::test_greedy  # crashes")[0]["outcome"] == "failed"
    assert outcome("raising", "test_down.py::test_greedy  raises=ConnectionError  # R1")[0]["outcome"] == "xfailed"
    assert outcome("raising", "test_down.py::test_greedy  raises=BackendRaised  # R1")[0]["outcome"] == "xfailed"
    rec, result = outcome("raising", "test_down.py::test_greedy  raises=TimeoutError  # R1")
    assert rec["outcome"] == "failed"
    result.stdout.fnmatch_lines(["*not the documented deviation*raises=*raised BackendRaised from ConnectionError*"])
    tree.makepyfile(test_check='''
import pytest


@pytest.mark.contract("GREEDY-EQUIV")
def test_check(mtp_backend):
    assert False, "the check itself"
''')
    assert outcome("live", "test_check.py::test_check  raises=BackendRaised  # R1", "test_check")[0]["outcome"] \
        == "failed"
    # a raises= line applies beside a deviation line: either covers what it documents, nothing else does
    two = "test_check.py::test_check  # D1: the check\ntest_check.py::test_check  raises=ConnectionError  # R1\n"
    rec = outcome("live", two, "test_check")[0]
    assert rec["outcome"] == "xfailed" and rec["message"].startswith("D1"), rec
    rec = outcome("raising", two.replace("test_check.py::test_check", "test_down.py::test_greedy"))[0]
    assert rec["outcome"] == "xfailed" and rec["message"].startswith("R1"), rec
    rec, result = outcome("raising", two.replace("test_check.py::test_check", "test_down.py::test_greedy")
                          .replace("ConnectionError", "TimeoutError"))
    assert rec["outcome"] == "failed", rec
    result.stdout.fnmatch_lines(["*not the documented deviation*covers a failure of the clause's check*"])
    # several raises= lines for one test: each covers its own exception, the message is the covering line's
    many = "test_down.py::test_greedy  raises=TimeoutError  # R2\ntest_down.py::test_greedy  raises=ConnectionError  # R1\n"
    rec, result = outcome("raising", many)
    assert rec["outcome"] == "xfailed" and rec["message"].startswith("R1"), rec
    assert "matches no collected test" not in result.stdout.str()
    rec, result = outcome("raising", many.replace("ConnectionError", "KeyError"))
    assert rec["outcome"] == "failed", rec
    result.stdout.fnmatch_lines(["*documents the backend raising TimeoutError or KeyError (raises=)*"])
    # a second deviation line naming the same test never applies: the warning says why
    _, result = outcome("live", "test_down.py::test_greedy  # D1\ntest_down.py::test_greedy  side=plain  # D2\n")
    result.stdout.fnmatch_lines(["*line 'test_down.py::test_greedy' names only tests an earlier line names*"])
    (tree.path / "both.txt").write_text("test_down.py::test_greedy  raises=BackendRaised  side=both  # R1\n")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "--mtp-backend=fakeexercise:raising",
                                      f"--mtp-xfails-file={tree.path / 'both.txt'}")
    assert result.ret != 0
    assert "raises= documents the backend raising and nothing else" in result.stdout.str() + result.stderr.str()
