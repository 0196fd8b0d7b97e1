"""A known deviation excuses only itself (issue 32, item 5): an xfails line
may pin the side it documents (`side=speculative|plain|both`); a failure of
that test naming another side, or none, is reported failed as not the
documented deviation. A fake backend, no model."""

import json
import os

import pytest

from mtpcheck.machinery.report import IdFileError, IdLine, read_id_file

pytest_plugins = ["pytester"]

FAKE = '''
from mtpcheck.contracts import Capabilities


def make():
    class Fake:
        def capabilities(self):
            return Capabilities(name="fake", version="1.0", vocab_size=8)
    return Fake()
'''

DOWN = '''
import pytest


@pytest.mark.contract("REQ-BLOCK")
@pytest.mark.parametrize("side", ["speculative", "both", "plain", None])
def test_side(mtp_backend, mtp_record, side):
    if side:
        mtp_record(deviating_side=side)
    pytest.fail(f"deviating path: {side}")
'''


@pytest.fixture
def tree(pytester, monkeypatch):
    pytester.makepyfile(fakesides=FAKE, test_down=DOWN)
    pytester.syspathinsert()
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return pytester


def run(pytester, xfails: str):
    (pytester.path / "known.txt").write_text(xfails)
    report = pytester.path / "report.json"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--mtp-backend=fakesides:make",
                                          "--mtp-xfails-file=known.txt", f"--mtp-json={report}")
    data = json.loads(report.read_text()) if report.exists() else None
    return result, {n.split("::")[1]: t for n, t in data["tests"].items()} if data else None


def test_a_pinned_line_covers_its_side_only(tree):
    result, tests = run(tree, "test_down.py::test_side  side=speculative  # L1: the speculative path deviates\n")
    assert result.ret == 1
    assert tests["test_side[speculative]"]["outcome"] == "xfailed"
    for side in ("both", "plain"):
        t = tests[f"test_side[{side}]"]
        assert t["outcome"] == "failed"
        assert t["message"].startswith(f"not the documented deviation: deviating side {side}, the xfails line "
                                       "documents side=speculative")
    assert "deviating side not named by the clause" in tests["test_side[None]"]["message"]
    assert [tests[f"test_side[{x}]"]["deviating_side"] for x in ("speculative", "both", "plain", "None")] == [
        "speculative", "both", "plain", None]  # the report keeps each test's side


def test_an_unpinned_line_covers_any_failure_of_the_check(tree):
    result, tests = run(tree, "test_down.py::test_side  # documented\n")
    assert result.ret == 0
    assert {t["outcome"] for t in tests.values()} == {"xfailed"}


def test_a_line_pinned_to_both_does_not_cover_one_side(tree):
    _, tests = run(tree, "test_down.py::test_side[both]  side=both\ntest_down.py::test_side[plain]  side=both\n")
    assert tests["test_side[both]"]["outcome"] == "xfailed"
    assert tests["test_side[plain]"]["outcome"] == "failed"


@pytest.mark.parametrize("line, word", [("test_down.py::test_side  side=spec", "side=spec"),
                                        ("test_down.py::test_side  first=3", "first=3"),
                                        ("test_down.py::test_side  speculative", "speculative")])
def test_a_bad_pin_is_a_one_line_usage_error(tree, line, word):
    result, tests = run(tree, line + "  # why\n")
    assert result.ret == 4 and tests is None
    result.stderr.fnmatch_lines([f"*--mtp-xfails-file: *line 1: {word!r} is not a pin*"])


def test_read_id_file_keeps_the_side(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("# header\nDIST-EQUIV\nmtpcheck/suite/a.py::t  side=plain  # the plain path\n")
    assert read_id_file(path) == [IdLine("DIST-EQUIV", "listed in x.txt", None),
                                  IdLine("mtpcheck/suite/a.py::t", "the plain path", "plain")]
    path.write_text("a b\n")
    with pytest.raises(IdFileError, match="line 1: 'b' is not a pin"):
        read_id_file(path)


def test_the_shipped_lines_that_pin_a_side_pin_one_the_clause_names():
    """Only clauses that record deviating_side can have pinned lines (else every failure is 'not named')."""
    from pathlib import Path

    import mtpcheck

    naming = ("test_controls.py::test_greedy_tokens_are_the_contracts_processed_argmax",
              "test_report.py::test_unsupported_controls_are_never_silently_ignored", "test_stops.py::",
              "test_greedy.py::", "test_distribution.py::test_no_token_outside_the_target_support",
              "test_distribution.py::test_emitted_tokens_follow_the_target_law",
              "test_context.py::test_tokens_follow_the_target_law_at_fixed_contexts")
    shipped = Path(mtpcheck.__file__).parent / "backends" / "xfails"
    pinned = [line for f in shipped.glob("*.txt") for line in read_id_file(f) if line.side]
    assert len(pinned) >= 20
    assert all(any(n in line.entry for n in naming) for line in pinned), [p.entry for p in pinned]


@pytest.mark.parametrize("mutant, side", [("penalty-history-without-prompt", "both"),
                                          ("plain-penalty-history-without-prompt", "plain")])
def test_mlx_lm_releases_bugs_are_not_its_documented_deviation(pytester, mutant, side):
    """mlx-lm 0.31.2 (both paths leave the prompt out of the penalty history) and 0.31.1 (the plain path
    alone), as zoo mutants of the reference, judged with the shipped mlx-lm file: its L1 lines document a
    speculative-only deviation, so CTRL-CONTRACT fails naming the side instead of reading xfailed."""
    report = pytester.path / "r.json"
    pytester.runpytest_subprocess(
        "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=mtpcheck.mutants:load_mutant",
        f"--mtp-backend-option=name={mutant}", "--mtp-backend-option=base=mlx", "--mtp-clauses=CTRL-CONTRACT",
        "-k", "presence_penalty", "--mtp-xfails-file=mlx-lm", f"--mtp-json={report}")
    data = json.loads(report.read_text())
    row = data["clauses"]["CTRL-CONTRACT"]
    assert row["outcome"] == "failed", row
    assert row["notes"][0].startswith(f"not the documented deviation: deviating side {side}, the xfails line "
                                      "documents side=speculative")
