"""The tutorial's sample output is generated from a main-job report
(`python -m mtpcheck.machinery.report sample`), and this test fails when it
drifts: a clause added or removed, a capability of the reference changed, a
skip reason reworded, the count line inconsistent with the rows."""

import re
from pathlib import Path

import pytest

from mtpcheck.catalogue import load_catalogue
from mtpcheck.machinery.checks import missing_capabilities, skip_reason
from mtpcheck.machinery.report import (
    SAMPLE_BEGIN,
    SAMPLE_END,
    SUITE_DIR,
    RunRecorder,
    RunReport,
    sample_block,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"


def sample_lines() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    block = text.split(SAMPLE_BEGIN, 1)[1].split(SAMPLE_END, 1)[0]
    return [line for line in block.strip().strip("`").strip().splitlines()]


def suite_clauses() -> set[str]:
    """Clause ids the suite's tests carry (their contract markers)."""
    ids = set()
    for path in SUITE_DIR.glob("test_*.py"):
        ids |= set(re.findall(r'contract\("([A-Z0-9-]+)"\)', path.read_text(encoding="utf-8")))
    return ids


@pytest.fixture(scope="module")
def reference_caps():
    from mtpcheck.backends import load_backend

    return load_backend("mlx", {}).capabilities()


def test_the_sample_header_is_the_reference_as_it_declares_itself(reference_caps):
    rec = RunRecorder(backend="mlx", options={}, profile="ci", seed=1234,
                      capabilities=reference_caps.model_dump(mode="json"))
    assert sample_lines()[:2] == rec.header_lines()


def test_the_sample_table_has_every_suite_clause_with_its_reference_outcome(reference_caps):
    lines = sample_lines()
    rows = {}
    for line in lines[3:]:
        m = re.match(r"^([A-Z][A-Z0-9-]+)\s+(PASSED|SKIPPED|FAILED|XFAILED|ERROR|NOT RUN)\s*(.*)$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    catalogue = load_catalogue()
    expected = [c.id for c in catalogue.clause if c.id in suite_clauses()]
    assert list(rows) == expected, "regenerate the sample: python -m mtpcheck.machinery.report sample ..."
    for clause in catalogue.clause:
        if clause.id not in rows:
            continue
        missing = missing_capabilities(reference_caps, clause.requires)
        if missing:
            assert rows[clause.id] == ("SKIPPED", skip_reason(reference_caps, missing)), clause.id
        else:
            assert rows[clause.id][0] == "PASSED", (clause.id, rows[clause.id])
    counts = next(line for line in lines if line.startswith("clauses: "))
    passed = sum(o == "PASSED" for o, _ in rows.values())
    skipped = sum(o == "SKIPPED" for o, _ in rows.values())
    assert counts.startswith(f"clauses: {passed} passed" + (f", {skipped} skipped" if skipped else "") + " ("), counts


def test_the_sample_is_what_the_generator_writes(tmp_path):
    """The block round-trips through sample_block: a hand edit of the sample fails."""
    text = DOC.read_text(encoding="utf-8")
    assert text.count(SAMPLE_BEGIN) == 1 and text.count(SAMPLE_END) == 1
    lines = sample_lines()
    assert lines[2] == "..." and lines[-1].startswith("(this run: ")
    assert any(line.startswith("mtpcheck: JSON report: out/report.json (complete)") for line in lines)
    # the generator itself: a minimal report renders the same header and a consistent count line
    rep = RunReport.model_validate({
        "complete": True, "exit_status": 0, "versions": {"mtpcheck": "0", "mlx": "0"}, "profile": "ci", "seed": 1,
        "backend": {"name": "x", "options": {}, "capabilities": None}, "duration_s": 1.0, "clauses": {},
        "not_run": {}, "tests": {}, "summary": {}})
    block = sample_block(rep)
    assert block.startswith(SAMPLE_BEGIN) and block.endswith(SAMPLE_END)
    assert "mtpcheck: backend x (?), profile ci, base seed 1" in block
