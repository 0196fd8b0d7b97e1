"""Issue 22, items 1-3: known-deviation files that apply wherever the suite
runs, an xfail that documents its clause's failure and nothing else, and a
backend that kills the process still leaving a report that names the test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpcheck.machinery.report import SUITE_DIR, check_report, entry_id, match_lines, suite_id

pytest_plugins = ["pytester"]

# a backend whose generate() answers, raises or aborts the process by the prompt's first token
FAKE = '''
import os
from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport


class Fake:
    def capabilities(self):
        return Capabilities(name="fake", version="1.0", vocab_size=8, mtp_kinds=["embedded"], max_depth=2)

    def generate(self, req):
        what = req.prompt_tokens[0]
        if what == 6:
            raise RuntimeError("the runtime fell over")
        if what == 7:
            os.abort()  # native code dying: no Python handler runs
        return GenerationResult(tokens=[1], text="", finish_reason="length",
                                speculation=SpeculationReport(requested=False, used=False, mode="off",
                                                              runtime="fake"))


def make():
    return Fake()
'''

DOWN = '''
import pytest
from mtpcheck.contracts import GenerationRequest


def ask(backend, token):
    return backend.generate(GenerationRequest(prompt_tokens=[token], max_tokens=1))


@pytest.mark.contract("STATS-CONSISTENT")
def test_check_fails(mtp_backend):
    assert ask(mtp_backend, 1).tokens == [2], "the clause's own check"


@pytest.mark.contract("STATS-CONSISTENT")
def test_backend_raises(mtp_backend):
    assert ask(mtp_backend, 6).tokens == [2]


@pytest.mark.contract("GREEDY-EQUIV")
def test_passes(mtp_backend):
    assert ask(mtp_backend, 1).tokens == [1]


@pytest.mark.contract("REQ-BLOCK")
@pytest.mark.parametrize("token", [pytest.param(1, id="before"), pytest.param(7, id="abort"),
                                   pytest.param(1, id="after")])
def test_z_aborts(mtp_backend, token):
    assert ask(mtp_backend, token).tokens == [1]
'''

XFAILS = """\
test_down.py::test_check_fails  # D1: documented
test_down.py::test_backend_raises  # D2: documented as a failure of the check, but the backend raises
test_down.py::test_passes  # D3: fixed upstream
"""


@pytest.fixture
def tree(pytester, monkeypatch):
    pytester.makepyfile(fakebackend=FAKE, test_down=DOWN)
    (pytester.path / "xfails.txt").write_text(XFAILS)
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return pytester


def run(pytester, *args):
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--mtp-backend=fakebackend:make",
                                           f"--mtp-json={report}", *args)
    data = json.loads(report.read_text()) if report.exists() else None
    if data is not None:
        check_report(report)  # every file left behind validates against the published model
    return result, data


# -- 1. the files match wherever the suite runs ------------------------------------------


class Item:
    def __init__(self, nodeid, path, clauses=()):
        self.nodeid, self.path, self.clauses = nodeid, Path(path), list(clauses)


def test_node_ids_of_every_rootdir_normalise_to_the_shipped_form():
    path = SUITE_DIR / "test_report.py"
    name = "test_report.py::test_unsupported_controls_are_never_silently_ignored[logit_bias]"
    shipped = "mtpcheck/suite/" + name
    for nodeid in (name,  # --pyargs from another folder: rootdir is the suite's folder
                   shipped,  # the checkout's root
                   "lib/python3.11/site-packages/mtpcheck/suite/" + name,  # an installed wheel, rootdir above it
                   "suite/" + name):  # rootdir at the package
        assert suite_id(nodeid, path) == shipped, nodeid
    assert suite_id("tests/test_mine.py::test_a", "/elsewhere/tests/test_mine.py") == "tests/test_mine.py::test_a"
    for line in (shipped, "/opt/venv/lib/python3.12/site-packages/" + shipped, name, shipped.replace("/", "\\")):
        assert entry_id(line) == shipped, line
    assert entry_id("test_mine.py::test_a") == "test_mine.py::test_a"  # not a suite module: as written
    items = [Item(name, path, ["REPORT-NO-SILENT-FALLBACK"]), Item("test_x.py::t", "/elsewhere/test_x.py")]
    out = match_lines([("mtpcheck/suite/test_report.py::test_unsupported", "why"), ("test_x.py", "mine"),
                       ("mtpcheck/suite/test_gone.py", "stale")], items, lambda i: i.clauses)
    assert [(i.nodeid, line[0]) for i, line in out["__matches__"]] == [
        (name, "mtpcheck/suite/test_report.py::test_unsupported"), ("test_x.py::t", "test_x.py")]
    assert out["__unused__"] == ["mtpcheck/suite/test_gone.py"]


def test_a_shipped_file_applies_from_a_folder_outside_the_checkout(tmp_path):
    """As README tells users: --pyargs from any folder, the shipped list by name."""
    pytest.importorskip("mlx_lm")
    report = tmp_path / "r.json"
    env = {**os.environ, "MLX_DISABLE_COMPILE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider",
                           "-q", "--mtp-backend=mlx-lm", "--mtp-xfails-file=mlx-lm",
                           "--mtp-clauses=REPORT-NO-SILENT-FALLBACK", f"--mtp-json={report}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert "matches no collected test" not in out, out[-3000:]
    data = json.loads(report.read_text())
    tests = data["tests"]
    penalties = [n for n in tests if "never_silently_ignored[" in n and "logit_bias" not in n]
    assert len(penalties) == 3 and all(tests[n]["outcome"] == "xfailed" for n in penalties), tests
    assert all(tests[n]["message"].startswith("L1") for n in penalties)
    assert proc.returncode == 0, out[-3000:]


# -- 2. an xfail documents its clause's failure, nothing else -------------------------------------


def test_an_xfailed_test_that_raises_is_reported_as_what_it_is(tree):
    result, data = run(tree, "test_down.py", "-k", "not aborts", "--mtp-xfails-file=xfails.txt")
    tests = {n.split("::")[-1]: t for n, t in data["tests"].items()}
    assert tests["test_check_fails"]["outcome"] == "xfailed"
    assert tests["test_passes"]["outcome"] == "xpassed"
    raised = tests["test_backend_raises"]
    assert raised["outcome"] == "failed", raised
    assert raised["message"].startswith("not the documented deviation: xfails line "
                                        "'test_down.py::test_backend_raises' covers a failure of the clause's check, "
                                        "this test raised BackendRaised:"), raised["message"]
    assert "RuntimeError: the runtime fell over" in raised["message"]
    result.stdout.fnmatch_lines(["*mtpcheck xfails*", "*not the documented deviation*"])
    assert result.ret == 1


def test_strict_mode_fails_an_unexpected_pass(tree):
    lenient, data = run(tree, "test_down.py::test_passes", "test_down.py::test_check_fails",
                        "--mtp-xfails-file=xfails.txt")
    assert lenient.ret == 0 and data["clauses"]["GREEDY-EQUIV"]["outcome"] == "xpassed"
    strict, data = run(tree, "test_down.py::test_passes", "test_down.py::test_check_fails",
                       "--mtp-xfails-file=xfails.txt", "--mtp-xfails-strict")
    assert strict.ret == 1
    assert data["clauses"]["GREEDY-EQUIV"]["outcome"] == "failed"
    assert "XPASS(strict)" in data["clauses"]["GREEDY-EQUIV"]["notes"][0]
    assert data["clauses"]["STATS-CONSISTENT"]["outcome"] == "xfailed"


# -- 3. a backend that kills the process ------------------------------------------------------------


def test_a_backend_that_aborts_leaves_a_report_naming_the_test(tree):
    result, data = run(tree, "test_down.py::test_z_aborts")
    assert result.ret not in (0, 1)  # the process died (SIGABRT)
    assert data is not None, "no report left behind"
    assert data["complete"] is False and data["incomplete_reasons"] == ["unfinished"]
    assert data["running"] == ["test_down.py::test_z_aborts[abort]"]
    assert data["exit_status"] == -1
    assert data["tests"]["test_down.py::test_z_aborts[before]"]["outcome"] == "passed"  # what ran before is kept
    assert "test_down.py::test_z_aborts[after]" in data["not_run"]["tests"]


def test_under_xdist_the_rest_of_the_run_is_judged_on_a_fresh_process(tree):
    result, data = run(tree, "test_down.py::test_z_aborts", "-n", "1")
    assert data["complete"] is False and data["incomplete_reasons"] == ["crashed"]
    assert data["crashed"] == ["test_down.py::test_z_aborts[abort]"] and data["running"] == []
    assert data["tests"]["test_down.py::test_z_aborts[abort]"]["outcome"] == "error"  # no verdict
    assert data["tests"]["test_down.py::test_z_aborts[abort]"]["clauses"] == ["REQ-BLOCK"]
    assert "crashed while running" in data["tests"]["test_down.py::test_z_aborts[abort]"]["message"]
    # the test after the crash ran in the replacement worker, on a freshly loaded backend
    assert data["tests"]["test_down.py::test_z_aborts[after]"]["outcome"] == "passed"
    assert len(data["tests"]) == 3, data["tests"]
    result.stdout.fnmatch_lines(["*CRASHED*test_down.py::test_z_aborts[[]abort[]]*"])
    assert result.ret == 1
