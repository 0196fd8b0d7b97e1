"""The plugin end to end (pytester): mutants fail on the right clauses, broken
backends give named failures, selection and report files behave."""

import json

import pytest

pytest_plugins = ["pytester"]

MUTANT = "--mtp-backend=mtpcheck.mutants:load_mutant"
BROKEN = "--mtp-backend=mtpcheck.mutants.broken:load_broken"


def run_suite(pytester, *args):
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider",
                                           f"--mtp-json={report}", *args)
    data = json.loads(report.read_text()) if report.exists() else None
    return result, data


@pytest.mark.parametrize("name", ["one-sided-temperature", "unnormalised-residual", "recurrent-state-not-restored"])
def test_mutants_fail_on_their_declared_clauses(pytester, name):
    from mtpcheck.mutants import MUTANTS

    declared = MUTANTS[name].clauses
    probe = ["REQ-BLOCK", "STATS-CONSISTENT"]  # clauses the mutant does not break
    result, data = run_suite(pytester, MUTANT, f"--mtp-backend-option=name={name}",
                             f"--mtp-clauses={','.join(declared + tuple(probe))}")
    outcomes = {cid: row["outcome"] for cid, row in data["clauses"].items()}
    for cid in declared:
        assert outcomes[cid] == "failed", (cid, outcomes, result.stdout.str()[-3000:])
    for cid in probe:
        assert outcomes[cid] == "passed", (cid, outcomes)
    assert result.ret == 1


def test_correct_backend_passes_the_same_clauses(pytester):
    result, data = run_suite(pytester, "--mtp-backend=toy",
                             "--mtp-clauses=TRACE-ACCEPT,TRACE-RESIDUAL-BONUS,GREEDY-EQUIV,REQ-BLOCK")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert {row["outcome"] for row in data["clauses"].values()} == {"passed"}
    assert data["backend"]["name"] == "toy" and data["profile"] == "ci" and data["seed"] == 1234
    assert data["summary"]["passed"] == 4
    result.stdout.fnmatch_lines(["mtpcheck: backend toy (mtpcheck-reference *), profile ci, base seed 1234",
                                 "*capabilities: drafters ?'embedded', 'assistant'?*"])


@pytest.mark.parametrize("kind, error", [
    ("raising", "BackendRaised: generate() raised RuntimeError: device lost"),
    ("out-of-vocab", "BackendGarbage: generate() returned token ids outside the vocabulary"),
    ("wrong-type", "BackendGarbage: generate() returned an invalid GenerationResult"),
])
def test_broken_backends_give_named_failures_and_the_run_goes_on(pytester, kind, error):
    result, data = run_suite(pytester, BROKEN, f"--mtp-backend-option=kind={kind}",
                             "--mtp-clauses=REQ-BLOCK,STOP-IN-BLOCK,SEED-DETERMINISM")
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"*{error}*"])
    outcomes = {cid: row["outcome"] for cid, row in data["clauses"].items()}
    assert outcomes["STOP-IN-BLOCK"] == "failed" and outcomes["SEED-DETERMINISM"] == "failed"
    # a clause that needs no generate() call still passes: the run went on
    block = [t for n, t in data["tests"].items() if n.endswith("test_malformed_block_raises_naming_the_field[block0-mode]")]
    assert block and block[0]["outcome"] == "passed"


def test_bad_target_laws_are_garbage(pytester):
    result, _ = run_suite(pytester, BROKEN, "--mtp-backend-option=kind=bad-laws", "--mtp-clauses=DIST-ZERO")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*BackendGarbage: target_distributions() shape*"])


def test_a_hanging_backend_times_out(pytester):
    result, _ = run_suite(pytester, BROKEN, "--mtp-backend-option=kind=hanging", "--mtp-timeout=1",
                          "--mtp-clauses=SEED-DETERMINISM", "-k", "plain")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*BackendTimeout: generate() did not return within 1 s*"])


def test_missing_capability_skips_naming_it(pytester):
    result, data = run_suite(pytester, BROKEN, "--mtp-backend-option=kind=no-traces", "--mtp-clauses=TRACE-ROLLBACK")
    assert result.ret == 0
    row = data["clauses"]["TRACE-ROLLBACK"]
    assert row["outcome"] == "skipped" and row["notes"] == ["backend lacks capability: traces"]


def test_unknown_backend_fails_at_start_up_in_one_line(pytester):
    result = pytester.runpytest_subprocess("--pyargs", "mtpcheck.suite", "--mtp-backend=nosuch")
    assert result.ret == 4  # usage error
    result.stderr.fnmatch_lines(["ERROR: unknown backend 'nosuch'; known: *mlx*toy*"])


def test_xfails_and_skips_files(pytester):
    xfails = pytester.makefile(".txt", xfails="# known deviations\nTRACE-ACCEPT  # fixed in 2.0\nmtpcheck/suite/test_nothing.py\n")
    skips = pytester.makefile(".txt", skips="test_request.py::test_shorthands  # slow here\n")
    result, data = run_suite(pytester, MUTANT, "--mtp-backend-option=name=unnormalised-residual",
                             "--mtp-clauses=TRACE-ACCEPT,TRACE-RESIDUAL-BONUS,REQ-BLOCK",
                             f"--mtp-xfails-file={xfails}", f"--mtp-skips-file={skips}", "-W", "default")
    outcomes = {cid: row["outcome"] for cid, row in data["clauses"].items()}
    assert outcomes["TRACE-ACCEPT"] == "xpassed"  # listed, but this mutant keeps acceptance right
    assert outcomes["TRACE-RESIDUAL-BONUS"] == "failed"
    shorthand = [n for n in data["tests"] if "test_shorthands" in n]
    assert shorthand and data["tests"][shorthand[0]]["outcome"] == "skipped"
    result.stdout.fnmatch_lines(["*line 'mtpcheck/suite/test_nothing.py' matches no collected test*"])
