"""RunRecorder: per-test phases merged into one outcome, tests rolled up per
clause (worst first), without running pytest."""

from types import SimpleNamespace

import pytest

from mtpcheck.machinery.report import RunRecorder


def report(nodeid, when, outcome, clauses=("STATS-CONSISTENT",), xfail_reason=None, message="boom"):
    rep = SimpleNamespace(nodeid=nodeid, when=when, duration=0.01, longrepr=None,
                          user_properties=[("clause", c) for c in clauses],
                          passed=outcome == "passed", failed=outcome == "failed", skipped=outcome == "skipped")
    if xfail_reason is not None:
        rep.wasxfail = xfail_reason
    if outcome == "skipped" and xfail_reason is None:
        rep.longrepr = ("file.py", 1, f"Skipped: {message}")
    if outcome == "failed":
        rep.longrepr = message
    return rep


def run_test(recorder, nodeid, call, clauses=("STATS-CONSISTENT",), setup="passed", **kw):
    """One test's setup, call and teardown reports, as pytest sends them."""
    recorder.pytest_runtest_logreport(report(nodeid, "setup", setup, clauses))
    if call is not None:
        recorder.pytest_runtest_logreport(report(nodeid, "call", call, clauses, **kw))
    recorder.pytest_runtest_logreport(report(nodeid, "teardown", "passed", clauses))


@pytest.fixture
def recorder():
    return RunRecorder(backend="toy", options={}, profile="ci", seed=1234)


def test_a_passing_setup_then_an_xfailed_call_is_xfailed(recorder):
    run_test(recorder, "t::a", "skipped", xfail_reason="known deviation L2")
    assert recorder.tests["t::a"]["outcome"] == "xfailed"
    assert recorder.tests["t::a"]["message"] == "known deviation L2"


def test_a_failing_teardown_after_a_passed_call_is_an_error(recorder):
    recorder.pytest_runtest_logreport(report("t::a", "setup", "passed"))
    recorder.pytest_runtest_logreport(report("t::a", "call", "passed"))
    recorder.pytest_runtest_logreport(report("t::a", "teardown", "failed"))
    assert recorder.tests["t::a"]["outcome"] == "error"


def test_a_clause_with_passed_and_xfailed_tests_is_xfailed(recorder):
    run_test(recorder, "t::a", "passed")
    run_test(recorder, "t::b", "skipped", xfail_reason="known deviation L2")
    row = recorder.clauses()["STATS-CONSISTENT"]
    assert row["outcome"] == "xfailed"
    assert row["notes"] == ["known deviation L2"]
    assert row["tests"] == {"t::a": "passed", "t::b": "xfailed"}
    assert recorder.summary()["xfailed"] == 1 and recorder.summary()["passed"] == 0
    assert any(line.split()[:2] == ["STATS-CONSISTENT", "XFAILED"] for line in recorder.table_lines())


def test_a_clause_with_passed_and_skipped_tests_is_passed(recorder):
    run_test(recorder, "t::a", "passed")
    run_test(recorder, "t::b", None, setup="skipped")
    assert recorder.tests["t::b"]["outcome"] == "skipped"
    assert recorder.clauses()["STATS-CONSISTENT"]["outcome"] == "passed"


@pytest.mark.parametrize("outcomes, expected", [
    (["passed", "failed", "xfailed"], "failed"),
    (["xpassed", "xfailed", "passed"], "xpassed"),
    (["xfailed", "skipped"], "xfailed"),
    (["skipped", "skipped"], "skipped"),
])
def test_the_worst_test_outcome_is_the_clause_outcome(recorder, outcomes, expected):
    for i, outcome in enumerate(outcomes):
        call = {"xfailed": "skipped", "xpassed": "passed"}.get(outcome, outcome)
        reason = "listed" if outcome in ("xfailed", "xpassed") else None
        if outcome == "skipped":
            run_test(recorder, f"t::{i}", None, setup="skipped")
        else:
            run_test(recorder, f"t::{i}", call, xfail_reason=reason)
    assert [t["outcome"] for t in recorder.tests.values()] == outcomes
    assert recorder.clauses()["STATS-CONSISTENT"]["outcome"] == expected


def test_a_test_cut_by_an_interrupt_is_not_run_not_a_crash(recorder):
    """Ctrl-C between setup and call: no call report (was ValueError: None is not in list)."""
    run_test(recorder, "t::a", "passed")
    recorder.pytest_runtest_logreport(report("t::b", "setup", "passed"))
    recorder.finish(2)
    assert recorder.clauses()["STATS-CONSISTENT"]["tests"] == {"t::a": "passed"}
    assert recorder.not_run()["tests"] == [] and recorder.reasons == ["interrupted"]
    assert not recorder.report().complete and "t::b" not in recorder.report().tests


def test_numpy_evidence_becomes_plain_json():
    import numpy as np

    from mtpcheck.machinery.report import to_plain

    plain = to_plain({"p": np.float64(0.5), "n": np.int64(3), "a": np.arange(2), "t": (1, np.float32(2.5)),
                      "bad": float("nan")})
    assert plain == {"p": 0.5, "n": 3, "a": [0, 1], "t": [1, 2.5], "bad": "nan"}
    assert type(plain["p"]) is float and type(plain["n"]) is int


def test_a_workers_capabilities_arrive_with_its_first_report_and_the_header_says_when_none_did(recorder):
    """Under xdist an interrupted worker never sends its session-end output: the backend's
    declaration rides on the first test report, and a header without one says so."""
    import json

    assert "not known" in recorder.header_lines()[1]
    rep = report("t::a", "setup", "passed")
    rep.user_properties.append(("mtp_capabilities", json.dumps({"version": "x 1.0", "mtp_kinds": ["embedded"],
                                                                "max_depth": 3, "streaming": True})))
    recorder.pytest_runtest_logreport(rep)
    assert recorder.capabilities["version"] == "x 1.0"
    assert "(x 1.0)" in recorder.header_lines()[0] and "streaming" in recorder.header_lines()[1]
