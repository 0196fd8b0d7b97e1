"""The run as CI sees it (issue 14): xdist, interrupted and partial runs, the
report as an interface (schema, Markdown, JUnit), bad settings as one-line
usage errors, backend factories that raise or hang, node ids under
`--mtp-json PATH`. Cheap: a fake backend and small downstream-style test
files in pytester, no model (one suite run of the toy backend under xdist)."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from mtpcheck.machinery.report import RunReport, check_report

pytest_plugins = ["pytester"]

FAKE = '''
import time
from mtpcheck.contracts import Capabilities


class Fake:
    def capabilities(self):
        return Capabilities(name="fake", version="1.0", vocab_size=8, mtp_kinds=["embedded"], max_depth=2)

    def open_scheduler(self, **options):
        time.sleep(30)


def make(flavour: str = "ok", depth: str = "2"):
    return Fake()


def crash():
    raise RuntimeError("no device here")  # the line the report names


def hang():
    time.sleep(30)


def typo():
    return Fake(1)  # a bug inside the factory, not a rejected option
'''

DOWN = '''
import numpy as np
import pytest


@pytest.mark.contract("REQ-BLOCK")
@pytest.mark.parametrize("i", range(3))
def test_block(mtp_backend, mtp_record, i):
    mtp_record(law=np.float64(0.5) * i, ids=np.arange(3),
               gtest={"name": "rank_gtest", "alpha": np.float64(1e-7), "n": np.int64(100),
                      "p_value": np.float64(0.25), "detectable_tv": np.float32(0.125)})


@pytest.mark.contract("STATS-CONSISTENT")
def test_stats_fails(mtp_backend):
    assert 1 == 2, "stats disagree"


@pytest.mark.contract("STATS-CONSISTENT")
def test_stats_passes(mtp_backend):
    pass


@pytest.mark.contract("GREEDY-EQUIV")
def test_greedy(mtp_backend):
    pass
'''

BACKEND = "--mtp-backend=fakebackend:make"


@pytest.fixture
def tree(pytester, monkeypatch):
    pytester.makepyfile(fakebackend=FAKE, test_down=DOWN)
    pytester.syspathinsert()  # in-process runs import the factory
    # subprocess runs and xdist workers too
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return pytester


def run(pytester, *args, subprocess=False):
    """In-process where it can (seconds saved per run on a busy machine); xdist and Ctrl-C in a subprocess."""
    report = pytester.path / "report.json"
    runner = pytester.runpytest_subprocess if subprocess or "-n" in args else pytester.runpytest_inprocess
    result = runner("-p", "no:cacheprovider", f"--mtp-json={report}", *args)
    data = json.loads(report.read_text()) if report.exists() else None
    if data is not None:
        check_report(report)  # every report written validates against the published model
    return result, data


def slow(request):
    if not request.config.getoption("--run-slow", default=False):
        pytest.skip("another xdist run, about a minute: --run-slow")


def outcomes(data):
    return {cid: row["outcome"] for cid, row in data["clauses"].items()}


# -- 1. xdist ------------------------------------------------------------------------


def test_a_parallel_run_equals_the_serial_run(tree):
    serial, s = run(tree, BACKEND, "test_down.py", subprocess=True)
    parallel, p = run(tree, BACKEND, "test_down.py", "-n", "2")
    assert parallel.ret == serial.ret == 1, parallel.stdout.str()[-2000:]
    assert outcomes(p) == outcomes(s) == {"REQ-BLOCK": "passed", "STATS-CONSISTENT": "failed", "GREEDY-EQUIV": "passed"}
    assert {n: t["outcome"] for n, t in p["tests"].items()} == {n: t["outcome"] for n, t in s["tests"].items()}
    # numpy evidence crossed the process boundary as plain JSON
    assert sorted(e["law"] for e in p["clauses"]["REQ-BLOCK"]["evidence"]) == [0.0, 0.5, 1.0]
    same = [sorted(map(json.dumps, d["clauses"]["REQ-BLOCK"]["evidence"])) for d in (p, s)]
    assert same[0] == same[1]
    # one report by the controller: header, capabilities, every clause
    assert p["backend"]["capabilities"]["name"] == "fake" and p["complete"] and p["exit_status"] == 1
    parallel.stdout.fnmatch_lines(["*mtpcheck clauses*", "mtpcheck: backend fakebackend:make (1.0)*",
                                   "STATS-CONSISTENT*FAILED*stats disagree*", "clauses: 1 failed, 2 passed (one row per clause, from 6 suite tests; *"])


def test_the_suite_under_xdist_writes_one_merged_report(pytester, request):
    """The shipped suite on the toy backend, -n 2: the controller's report holds every selected clause.
    A minute of a busy CI machine, so --run-slow; .ci/run runs the suite under -n 2 and validates its report."""
    slow(request)
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "-n", "2",
                                           "--mtp-backend=toy", "--mtp-clauses=REQ-BLOCK,DRAFT-FRESH",
                                           f"--mtp-json={report}")
    assert result.ret == 0, result.stdout.str()[-3000:]
    data = check_report(report)
    assert {c: r.outcome for c, r in data.clauses.items()} == {"REQ-BLOCK": "passed", "DRAFT-FRESH": "passed"}
    assert data.backend.capabilities is not None and data.incomplete_reasons == ["subset"]
    assert all(isinstance(e["max_law_difference"], float) for e in data.clauses["DRAFT-FRESH"].evidence)


# -- 2. interrupted and partial runs ----------------------------------------------------


def test_ctrl_c_prints_the_table_and_writes_an_incomplete_report(tree):
    tree.makepyfile(test_down=DOWN.replace("    pass\n", "    raise KeyboardInterrupt\n", 1))
    result, data = run(tree, BACKEND, "test_down.py", subprocess=True)
    assert result.ret == 2
    assert "ValueError" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*mtpcheck clauses*", "GREEDY-EQUIV*NOT RUN*not reached: interrupted*",
                                 "mtpcheck: INCOMPLETE run (interrupted)*"])
    assert not data["complete"] and data["incomplete_reasons"] == ["interrupted"] and data["exit_status"] == 2
    assert data["not_run"]["clauses"] == {"GREEDY-EQUIV": "not reached: interrupted"}
    assert [n.split("::")[1] for n in data["not_run"]["tests"]] == ["test_greedy", "test_stats_passes"]


def test_ctrl_c_in_mtpcheck_run(tmp_path):
    (tmp_path / "interrupting.py").write_text(
        "from mtpcheck.backends.toy import load_toy\n\n\ndef make():\n    backend = load_toy()\n\n"
        "    def generate(req):\n        raise KeyboardInterrupt\n\n    backend.generate = generate\n    return backend\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, "-m", "mtpcheck.cli", "run", "--backend", "interrupting:make",
                           "--json", "out/r.json", "--", "--mtp-clauses=SEED-DETERMINISM,REQ-BLOCK"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "None is not in list" not in proc.stdout + proc.stderr
    assert "mtpcheck: INCOMPLETE run (" in proc.stdout and "mtpcheck clauses" in proc.stdout
    data = check_report(tmp_path / "out" / "r.json")
    assert not data.complete and "interrupted" in data.incomplete_reasons


@pytest.mark.parametrize("stop", [["--maxfail=1"], ["-n", "2", "-x"]])
def test_x_and_maxfail_make_an_incomplete_report(tree, stop, request):
    if "-n" in stop:
        slow(request)
    tree.makepyfile(test_down=DOWN.replace("def test_block", "def test_z_block"))  # the failure comes first
    result, data = run(tree, BACKEND, "test_down.py", "-p", "no:randomly", *stop)
    assert result.ret in (1, 2)
    assert not data["complete"] and data["incomplete_reasons"] == ["maxfail"], data["incomplete_reasons"]
    assert data["clauses"]["STATS-CONSISTENT"]["outcome"] == "failed"
    if "-n" not in stop:  # under xdist the other worker may have run them all before the stop
        assert data["not_run"]["tests"], "the tests after the stop are listed as not run"
    result.stdout.fnmatch_lines(["mtpcheck: INCOMPLETE run (maxfail)*"])


def test_a_subset_of_clauses_is_incomplete_and_names_what_was_left_out(tree):
    result, data = run(tree, BACKEND, "test_down.py", "--mtp-clauses=REQ-BLOCK")
    assert result.ret == 0
    assert not data["complete"] and data["incomplete_reasons"] == ["subset"]
    assert data["not_run"]["clauses"] == {"GREEDY-EQUIV": "deselected", "STATS-CONSISTENT": "deselected"}
    result.stdout.fnmatch_lines(["clauses: 1 passed, 2 deselected (*"])


def test_a_full_run_is_complete(tree):
    tree.makepyfile(test_down=DOWN.replace('assert 1 == 2, "stats disagree"', "pass"))
    result, data = run(tree, BACKEND, "test_down.py")
    assert result.ret == 0 and data["complete"] and data["incomplete_reasons"] == [] and data["exit_status"] == 0
    assert data["not_run"] == {"clauses": {}, "tests": []}
    assert data["schema_version"] == 6 and data["seed"] == 1234 and data["profile"] == "ci"
    assert data["versions"]["mtpcheck"] and data["versions"]["python"]


def test_a_collection_error_is_incomplete(tree):
    tree.makepyfile(test_broken="import nosuchmodule_xyz\n")
    result, data = run(tree, BACKEND, "test_down.py", "test_broken.py")
    assert result.ret == 2
    assert not data["complete"] and "collection error" in data["incomplete_reasons"]


def test_a_crashing_backend_factory_names_its_exception_and_line(tree):
    result, data = run(tree, "--mtp-backend=fakebackend:crash", "test_down.py")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*factory crash() raised RuntimeError: no device here (at *fakebackend.py:*)*"])
    assert "rejected its options" not in result.stdout.str()
    assert not data["complete"] and data["incomplete_reasons"] == ["backend failed to load"]
    assert data["backend"]["capabilities"] is None
    assert set(outcomes(data).values()) == {"error"}
    result.stdout.fnmatch_lines(["*mtpcheck clauses*", "REQ-BLOCK*ERROR*"])


def test_a_bug_inside_a_factory_is_not_called_a_rejected_option(tree):
    result, _ = run(tree, "--mtp-backend=fakebackend:typo", "test_down.py")
    result.stdout.fnmatch_lines(["*factory typo() raised TypeError: Fake() takes no arguments (at *)*"])
    assert "rejected its options" not in result.stdout.str()


def test_a_hanging_factory_hits_the_timeout(tree):
    result, data = run(tree, "--mtp-backend=fakebackend:hang", "--mtp-load-timeout=1", "test_down.py")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*BackendTimeout: the factory of backend 'fakebackend:hang' did not return within 1 s*"])
    assert data["incomplete_reasons"] == ["backend failed to load"]


def test_a_hanging_scheduler_opener_hits_the_timeout():
    from mtpcheck.contracts import Capabilities
    from mtpcheck.machinery.harness import BackendTimeout, Guarded
    from mtpcheck.machinery.scheduling import open_session

    class Hangs:
        def capabilities(self):
            return Capabilities(name="h", version="1", vocab_size=8)

        def open_scheduler(self, lookahead=True, adaptive_after=8):
            import time

            time.sleep(30)

    with pytest.raises(BackendTimeout, match=r"open_scheduler\(\) did not return within 0.5 s"):
        open_session(Guarded(Hangs(), timeout=0.5))


# -- 3. the report as an interface ----------------------------------------------------------


def test_markdown_junit_and_the_report_model(tree):
    md, junit = tree.path / "out" / "pr.md", tree.path / "junit.xml"
    result, data = run(tree, BACKEND, "test_down.py", f"--mtp-markdown={md}", f"--junitxml={junit}")
    text = md.read_text()
    assert "| clause | outcome | exercised | note | evidence |" in text
    assert "| STATS-CONSISTENT | FAILED |  | AssertionError: stats disagree" in text
    assert "rank_gtest: alpha 1e-07, n 100, p 0.25, detectable TV 0.125 (lowest p of 3)" in text
    assert "base seed `1234`, exit status 1, complete" in text
    props = {(c.get("name"), p.get("name"), p.get("value"))
             for c in ET.parse(junit).iter("testcase") for p in c.iter("property")}
    assert ("test_greedy", "clause", "GREEDY-EQUIV") in props
    assert not any(name == "clause" and value.startswith("[") for _, name, value in props)
    RunReport.model_validate(data)


def test_mtp_record_without_a_contract_marker_is_recorded(tree):
    tree.makepyfile(test_plain="def test_plain(mtp_record):\n    mtp_record(speedup=1.5)\n")
    _, data = run(tree, BACKEND, "test_down.py", "test_plain.py")
    assert data["tests"]["test_plain.py::test_plain"] == {
        "clauses": [], "outcome": "passed", "message": "", "evidence": [{"speedup": 1.5}], "exercise": None,
        "exercise_margin": None, "exercise_redraw": None,
        "deviating_side": None, "found_in": None, "broken_rules": [], "broken_count": 0,
        "duration_s": data["tests"]["test_plain.py::test_plain"]["duration_s"]}


def test_report_validate_command(tmp_path):
    from mtpcheck.machinery.report import main

    good = tmp_path / "r.json"
    good.write_text(RunReport.model_validate({
        "complete": False, "incomplete_reasons": ["subset"], "exit_status": 0,
        "backend": {"name": "x", "options": {}, "capabilities": None}, "versions": {}, "profile": "ci", "seed": 1,
        "duration_s": 0.1, "clauses": {}, "not_run": {}, "tests": {}, "summary": {}}).model_dump_json())
    assert main(["validate", str(good)]) == 0
    assert main(["validate", str(good), "--complete"]) == 1
    (tmp_path / "bad.json").write_text('{"passed": 1}')
    assert main(["validate", str(tmp_path / "bad.json")]) == 1


# -- 4. bad settings are the user's error, said once ----------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--mtp-timeout=-1"], "ERROR: --mtp-timeout: '-1' is not allowed; give seconds > 0, or 0 for no timeout"),
    (["--mtp-load-timeout=nan"], "ERROR: --mtp-load-timeout: 'nan' is not allowed*"),
    (["--mtp-seed=9223372036854775808"], "ERROR: --mtp-seed: 9223372036854775808 is outside [[]0, 2**63)*"),
    (["--mtp-seed=-3"], "ERROR: --mtp-seed: -3 is outside*"),
    (["--mtp-backend-option=flavor=x"],
     "ERROR: --mtp-backend-option: backend 'fakebackend:make' has no option 'flavor'; it accepts: flavour, depth"),
    (["--mtp-json=test_down.py/r.json"], "ERROR: --mtp-json: cannot create 'test_down.py/r.json': *is not a folder"),
    (["--mtp-markdown=."], "ERROR: --mtp-markdown: '.' is a folder; give a file path"),
    (["--mtp-xfails-file=nosuch.txt"], "ERROR: --mtp-xfails-file: 'nosuch.txt' does not exist (relative to *); shipped lists: *mlx_lm, *mlx_vlm*"),
    (["--mtp-skips-file=sub"], "ERROR: --mtp-skips-file: 'sub' is a folder*"),
    (["--mtp-xfails-file=latin1.txt"], "ERROR: --mtp-xfails-file: 'latin1.txt' is not UTF-8 text*"),
    (["--mtp-clauses=NOPE"], "ERROR: --mtp-clauses: unknown clause ids ?'NOPE'?; see `mtpcheck contracts list`"),
])
def test_bad_settings_are_one_line_usage_errors(tree, args, message):
    (tree.path / "sub").mkdir()
    (tree.path / "latin1.txt").write_bytes("REQ-BLOCK  # caf\xe9\n".encode("latin-1"))
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", BACKEND, "test_down.py", *args)
    assert result.ret == 4, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str() and len(result.stderr.lines) <= 3


@pytest.mark.parametrize("name", ["mlx-vlm", "mlx_vlm", "mlx_vlm.txt"])
def test_shipped_xfails_lists_resolve_by_name_from_any_folder(tmp_path, monkeypatch, name):
    from mtpcheck.machinery.report import read_id_file, resolve_id_file

    monkeypatch.chdir(tmp_path)
    assert resolve_id_file(name).name == "mlx_vlm.txt"
    assert read_id_file(name)


@pytest.mark.parametrize("argv, message", [
    (["--seed", str(2**63)], "mtpcheck: error: --mtp-seed: 9223372036854775808 is outside [0, 2**63)"),
    (["--backend-option", "nosuch=1"], "mtpcheck: error: backend 'toy' has no option 'nosuch'; it accepts: seed, vocab,"),
    (["--json", "."], "mtpcheck: error: --json: '.' is a folder; give a file path"),
    (["--xfails-file", "nosuch"], "mtpcheck: error: --xfails-file: 'nosuch' does not exist"),
])
def test_mtpcheck_run_bad_settings_exit_2(capsys, argv, message):
    from mtpcheck.cli import main

    assert main(["run", "--backend", "toy", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


# -- the report's path and pytest's rootdir ---------------------------------------------------


def _project_and_reports(tree, monkeypatch):
    project, elsewhere = tree.path / "project", tree.path / "reports"
    project.mkdir(), elsewhere.mkdir()
    (tree.path / "test_down.py").rename(project / "test_down.py")
    (elsewhere / "r.json").write_text("{}")  # an earlier run's report: an existing path
    monkeypatch.chdir(project)
    return elsewhere / "r.json"


def test_report_path_outside_the_project_keeps_node_ids(tree, monkeypatch):
    """`--mtp-json=PATH`: pytest chooses the rootdir from the test paths alone."""
    report = _project_and_reports(tree, monkeypatch)
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", BACKEND, "-rA", f"--mtp-json={report}")
    result.stdout.fnmatch_lines(["PASSED test_down.py::test_greedy"])
    assert "test_down.py::test_greedy" in json.loads(report.read_text())["tests"]
    result.stdout.no_fnmatch_line("*PytestConfigWarning*")


def test_space_separated_report_path_that_moved_the_rootdir_is_named(tree, monkeypatch):
    """pytest chooses the rootdir before it loads plugins, so the PATH of a space-separated
    `--mtp-json PATH` that exists counts as a test path: a report outside the project moves the
    rootdir up to a common ancestor. pytest has no public way to undo that; the run says which
    form keeps it."""
    report = _project_and_reports(tree, monkeypatch)
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", BACKEND, "--mtp-json", str(report))
    result.stdout.fnmatch_lines([f"*PytestConfigWarning: pytest chose the rootdir {tree.path} counting {report} "
                                 f"as a test path*write --mtp-json={report} to keep the rootdir*"])
    assert "project/test_down.py::test_greedy" in json.loads(report.read_text())["tests"]


def test_space_separated_report_path_inside_the_folder_is_quiet(tree, monkeypatch):
    """A PATH below the invocation folder, with test paths given: the rootdir is the same."""
    (tree.path / "out").mkdir()
    (tree.path / "out" / "r.json").write_text("{}")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", BACKEND, "test_down.py", "--mtp-json", "out/r.json")
    result.stdout.no_fnmatch_line("*PytestConfigWarning*")
    assert "test_down.py::test_greedy" in json.loads((tree.path / "out" / "r.json").read_text())["tests"]
