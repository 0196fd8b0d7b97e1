"""The run's record: per-test reports rolled up per clause, the header, the
table, the JSON and Markdown reports, and the xfails/skips files.

The JSON report is an interface: its shape is the pydantic model RunReport,
exported to contracts/schemas/RunReport.schema.json (docs/report.md)."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel

from mtpcheck.contracts.report import (  # noqa: F401 - the models live in the contract layer; re-exported
    REPORT_MODELS,
    SCHEMA_VERSION,
    BackendRecord,
    ClauseRecord,
    NotRun,
    Outcome,
    Reason,
    RunReport,
    TestRecord,
)
from mtpcheck.machinery.exercise import merge as merge_exercise
from mtpcheck.machinery.exercise import summary as exercise_summary

# worst first: a clause with any xfailed test shows XFAILED, not PASSED (a
# clause with passed and skipped tests shows PASSED: see RunRecorder.clauses)
OUTCOME_ORDER = ["failed", "error", "xpassed", "xfailed", "passed", "skipped"]
# the user_properties keys a suite test carries; plain strings, so JUnit XML shows them as they are
CLAUSE_PROPERTY, EVIDENCE_PROPERTY = "clause", "mtp_evidence"
EXERCISE_PROPERTY = "mtp_exercise"  # what the test's speculative results drafted and accepted (machinery.exercise)
REDRAW_PROPERTY = "mtp_exercise_redraw"  # a seeded test drawn again: the first sample's seed, counts and evidence
MARGIN_PROPERTY = "mtp_exercise_margin"  # a passing test's fewest accepted (or rejected) proposals of those it needs
CAPABILITIES_PROPERTY = "mtp_capabilities"  # an xdist worker's backend declaration, on its first report
BROKEN_PROPERTY = "mtp_broken_rule"  # a result that broke a rule every result obeys (machinery.invariants)
XPASS_PIN_PROPERTY = "mtp_xpass_pin"  # an XPASSED test's line documents what happens on some samples only
KEPT_BROKEN = 10  # broken results a record keeps as evidence; it counts them all
# a passing test's sample with fewer accepted (or rejected) proposals than this is named thin:
# exp(-14) = 8e-7, the chance that a rerun at the same rate holds none
THIN = 14


def to_plain(value: Any) -> Any:
    """Evidence as plain JSON values: numpy scalars and arrays, pydantic models,
    tuples and non-finite floats (xdist cannot send numpy; strict JSON has no NaN)."""
    if isinstance(value, BaseModel):
        return to_plain(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy scalar or array
        return to_plain(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


# -- xfails / skips files --------------------------------------------------------


class IdFileError(ValueError):
    """A missing, unreadable or non-UTF-8 xfails/skips file."""


def resolve_id_file(name: str | Path) -> Path:
    """A path relative to the current folder, else a shipped list by name
    (`mlx-vlm`, `mlx_vlm` or `mlx_vlm.txt` -> mtpcheck/backends/xfails/mlx_vlm.txt)."""
    path = Path(name)
    if path.exists():
        return path
    shipped = Path(__file__).parents[1] / "backends" / "xfails"
    stem = path.name.removesuffix(".txt").replace("-", "_")
    if (shipped / f"{stem}.txt").is_file() and len(path.parts) <= 1 or (shipped / path.name).is_file():
        return shipped / f"{stem}.txt"
    known = ", ".join(sorted(p.stem for p in shipped.glob("*.txt")))
    raise IdFileError(f"{str(name)!r} does not exist (relative to {Path.cwd()}); shipped lists: {known}")


SIDES = ("speculative", "plain", "both")
SIDE_PROPERTY = "deviating_side"  # the evidence key a failing test names its side with (mtp_record)
# how a failure message opens, by the side its plain twin showed
SIDE_WORDS = {"speculative": "speculative path deviates",
              "both": "both paths deviate (not speculative: the plain path fails the same test)"}


def side_of(evidence: list[dict]) -> str | None:
    """The side a test's evidence names last (mtp_record(deviating_side=...)), or None."""
    return next((e[SIDE_PROPERTY] for e in reversed(evidence) if e.get(SIDE_PROPERTY) in SIDES), None)


class IdLine(NamedTuple):
    """One xfails/skips line: a node-id prefix or clause id, the reason (its
    comment) and, optionally, the side of the deviation it documents (`side=`),
    or that it documents a sample with no accepted proposal (`exercise=none`):
    only such a line covers a "speculation not exercised" failure, and it
    covers nothing else; or that it documents the backend raising (`raises=`
    an exception class name: the harness's BackendRaised / BackendTimeout /
    BackendGarbage, or the runtime's own exception it wraps), and nothing else."""

    entry: str
    reason: str
    side: str | None = None
    unexercised: bool = False
    rules: str | None = None  # a node-id prefix line pinned `rules=CLAUSE`: only that clause's broken result rules
    raises: str | None = None


def _pins(path: Path, number: int, words: list[str]) -> dict:
    pins = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not (key == "side" and value in SIDES or key == "exercise" and value == "none"
                          or key == "rules" and re.fullmatch(r"[A-Z][A-Z0-9-]+", value)
                          or key == "raises" and re.fullmatch(r"[A-Za-z_]\w*", value)):
            raise IdFileError(f"{str(path)!r} line {number}: {word!r} is not a pin; a line is an id, then optionally "
                              f"side={'|'.join(SIDES)}, exercise=none, raises=ExceptionName or rules=CLAUSE-ID, then "
                              f"'# reason'")
        pins[key] = value
    if "raises" in pins and len(pins) > 1:
        raise IdFileError(f"{str(path)!r} line {number}: raises= documents the backend raising and nothing else: "
                          f"it takes no other pin ({' '.join(words)})")
    return pins


def read_id_file(path: str | Path) -> list[IdLine]:
    """Lines of node-id prefixes or clause ids, each optionally pinned to the
    side of the deviation it documents (`side=speculative|plain|both`); '#'
    starts a comment that becomes the reason."""
    path = resolve_id_file(path)
    if path.is_dir():
        raise IdFileError(f"{str(path)!r} is a folder, not a file of node ids or clause ids")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise IdFileError(f"{str(path)!r} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise IdFileError(f"{str(path)!r} cannot be read: {exc.strerror}") from None
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        entry, _, comment = raw.partition("#")
        words = entry.split()
        if words:
            pins = _pins(path, number, words[1:])
            entries.append(IdLine(words[0], comment.strip() or f"listed in {path.name}", pins.get("side"),
                                  pins.get("exercise") == "none", pins.get("rules"), pins.get("raises")))
    return entries


SUITE_DIR = Path(__file__).parents[1] / "suite"
SUITE_PREFIX = "mtpcheck/suite/"  # how the shipped files write a suite test's node id


def suite_id(nodeid: str, path: str | Path | None = None) -> str:
    """A node id in the shipped files' form, ``mtpcheck/suite/<module>::<name>``,
    whatever the rootdir made of it: ``test_report.py::...`` under ``--pyargs``
    from another folder, ``mtpcheck/suite/...`` in the checkout, a site-packages
    path for an installed wheel. Tests outside the suite keep their node id."""
    nodeid = nodeid.replace("\\", "/")
    if path is not None:
        try:
            rel = Path(path).resolve().relative_to(SUITE_DIR.resolve())
        except ValueError:
            rel = None
        if rel is not None:
            _, sep, rest = nodeid.partition("::")
            return SUITE_PREFIX + rel.as_posix() + sep + rest
    return nodeid[nodeid.index(SUITE_PREFIX):] if SUITE_PREFIX in nodeid else nodeid


def entry_id(entry: str) -> str:
    """An xfails/skips line in the same form: ``mtpcheck/suite/x.py::t``,
    ``.../site-packages/mtpcheck/suite/x.py::t`` and a bare ``x.py::t`` of a
    suite module name the same tests."""
    entry = entry.replace("\\", "/")
    if SUITE_PREFIX in entry:
        return entry[entry.index(SUITE_PREFIX):]
    module = entry.split("::", 1)[0]
    if "/" not in module and module.endswith(".py") and (SUITE_DIR / module).is_file():
        return SUITE_PREFIX + entry
    return entry


def match_lines(entries, items, clause_ids, every: bool = False) -> dict:
    """Which items each entry (an IdLine, or any (entry, reason, ...) tuple)
    selects, by clause id or by node-id prefix in either the item's own form
    or the shipped form: (item, line) pairs, the first matching line per item
    (`every`: each matching line)."""
    matches, used = [], set()
    for item in items:
        ids = (item.nodeid, suite_id(item.nodeid, getattr(item, "path", None)))
        for n, line in enumerate(entries):
            entry = line[0]
            if entry in clause_ids(item) or any(i.startswith(p) for i in ids for p in {entry, entry_id(entry)}):
                matches.append((item, line))
                used.add(n)
                if not every:
                    break
    return {"__matches__": matches, "__unused__": [line[0] for n, line in enumerate(entries) if n not in used]}


def is_clause_failure(exc: BaseException) -> bool:
    """The clause's own check failed (an assert, pytest.fail, or a group of
    those from hypothesis) - what an xfails line documents. A backend that
    raised, hung or returned garbage (BackendError), or any other exception,
    is not that deviation."""
    import pytest

    if isinstance(exc, BaseExceptionGroup):
        return all(is_clause_failure(e) for e in exc.exceptions)
    return isinstance(exc, (AssertionError, pytest.fail.Exception))


NOT_EXERCISED = "mtpcheck.machinery.exercise.NotExercised: "  # the message says what it is
XFAIL_SECTION = "mtpcheck xfails"  # a report section: the xfails line that did not cover a failure


# -- the recorder -------------------------------------------------------------------


def _outcome(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return "skipped" if report.skipped else "passed"


def _clip(text: str, n: int) -> str:
    """At most n characters, cut at a word boundary: a cut word reads as another value."""
    return text if len(text) <= n else text[: n - 4].rsplit(" ", 1)[0] + " ..."


def _message(report) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if hasattr(report, "wasxfail"):
        return report.wasxfail
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = (crash.message if crash else str(report.longrepr)).splitlines()[0].removeprefix(NOT_EXERCISED)
        unmatched = [body for title, body in getattr(report, "sections", ()) if title == XFAIL_SECTION]
        return _clip((unmatched[0] + " " if unmatched else "") + text, 300)
    return ""


def evidence_summary(evidence: list[dict]) -> str:
    """The statistical tests found in a clause's evidence, one phrase each:
    name, alpha, n, p-value, detectable TV where present."""
    found: list[dict] = []

    def walk(value):
        if isinstance(value, dict):
            if "alpha" in value and "p_value" in value:
                found.append(value)
                return
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(evidence)
    parts = []
    for name in dict.fromkeys(t.get("name", "test") for t in found):  # per test kind, its lowest p-value
        same = [t for t in found if t.get("name", "test") == name]
        t = min(same, key=lambda t: t["p_value"])
        text = f"{name}: alpha {t['alpha']:.2g}, n {t.get('n', '?')}, p {t['p_value']:.3g}"
        if isinstance(t.get("detectable_tv"), (int, float)):
            text += f", detectable TV {t['detectable_tv']:.3f}"
        parts.append(text + (f" (lowest p of {len(same)})" if len(same) > 1 else ""))
    return "; ".join(parts)


@dataclass(eq=False)  # registered as a pytest plugin: must stay hashable
class RunRecorder:
    backend: str
    options: dict
    profile: str
    seed: int
    capabilities: dict | None = None
    tests: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    collected: dict = field(default_factory=dict)  # node id -> clauses, the tests selected to run
    deselected: dict = field(default_factory=dict)  # node id -> clauses, deselected (-k, --mtp-clauses)
    reasons: list = field(default_factory=list)  # why the run is incomplete
    exit_status: int | None = None
    backend_error: str | None = None
    # the JSON report's path: rewritten (as 'unfinished') before each suite test,
    # so a process that dies in native code leaves a report naming the test
    sink: Path | None = None
    running: dict = field(default_factory=dict)  # node id -> None, in start order
    crashed: list = field(default_factory=list)  # node ids an xdist worker died under
    xpassed_pinned: set = field(default_factory=set)  # XPASSED under an exercise=none or raises= line
    # clause ids listed whole in the xfails file (-> its reason) and the skips file: a broken result rule
    # of such a clause is recorded xfailed, or not at all
    xfailed_clauses: dict = field(default_factory=dict)
    xfailed_rules: list = field(default_factory=list)  # (node-id prefix, clause, reason) of rules= lines
    skipped_clauses: set = field(default_factory=set)

    # pytest hooks (the recorder is registered as a plugin; under xdist the
    # controller receives the workers' logstart/logreport/logfinish)
    def pytest_runtest_logstart(self, nodeid, location):
        if self.sink is None or (self.collected and nodeid not in self.collected):
            return
        self.running[nodeid] = None
        self.write_json(self.sink, provisional=True)

    def pytest_runtest_logfinish(self, nodeid, location):
        self.running.pop(nodeid, None)

    def note_crash(self, nodeid: str) -> None:
        """An xdist worker died running `nodeid` (its replacement runs the rest)."""
        self.running.pop(nodeid, None)
        if nodeid not in self.crashed:
            self.crashed.append(nodeid)
        if "crashed" not in self.reasons:
            self.reasons.append("crashed")

    def pytest_runtest_logreport(self, report):
        if not self.capabilities:
            self.capabilities = next((json.loads(v) for k, v in report.user_properties if k == CAPABILITIES_PROPERTY),
                                     None)
        clauses = [v for k, v in report.user_properties if k == CLAUSE_PROPERTY]
        evidence = [json.loads(v) for k, v in report.user_properties if k == EVIDENCE_PROPERTY]
        exercise = next((json.loads(v) for k, v in reversed(report.user_properties) if k == EXERCISE_PROPERTY), None)
        for broken in (json.loads(v) for k, v in report.user_properties if k == BROKEN_PROPERTY):
            self.note_broken(report.nodeid, broken)
        if any(k == XPASS_PIN_PROPERTY for k, _ in report.user_properties):
            self.xpassed_pinned.add(report.nodeid)
        if not clauses and not evidence and report.nodeid not in self.collected and report.nodeid not in self.crashed:
            return
        entry = self.tests.setdefault(report.nodeid, {"clauses": clauses, "outcome": None,
                                                      "message": "", "duration_s": 0.0, "evidence": []})
        entry["duration_s"] += report.duration
        outcome = _outcome(report)
        # the worst phase wins; a passing setup/teardown says nothing on its own
        if (report.when == "call" or outcome != "passed") and (
            entry["outcome"] is None or OUTCOME_ORDER.index(outcome) < OUTCOME_ORDER.index(entry["outcome"])
        ):
            entry["outcome"], entry["message"] = outcome, _message(report)
        entry["evidence"] = evidence
        if exercise is not None:
            entry["exercise"] = exercise
        margin = next((json.loads(v) for k, v in report.user_properties if k == MARGIN_PROPERTY), None)
        if margin is not None:
            entry["exercise_margin"] = margin
        redraw = next((json.loads(v) for k, v in report.user_properties if k == REDRAW_PROPERTY), None)
        if redraw is not None:
            entry["exercise_redraw"] = redraw
        side = side_of(evidence)
        if side:
            entry["deviating_side"] = side

    def note_broken(self, nodeid: str, broken: dict) -> None:
        """A result of a call made in test `nodeid` broke a rule of clause
        broken["clause"]: a record of its own, '<nodeid> => <clause>', that
        fails the clause (xfailed where the xfails file lists the clause, or
        a line pinned rules=<clause> names a prefix of the test)."""
        clause = broken["clause"]
        if clause in self.skipped_clauses:
            return
        entry = self.tests.setdefault(f"{nodeid} => {clause}", {
            "clauses": [clause], "outcome": "failed", "message": "", "duration_s": 0.0, "evidence": [],
            "found_in": nodeid, "broken_rules": [], "broken_count": 0})
        entry["broken_count"] += 1
        if len(entry["broken_rules"]) < KEPT_BROKEN:
            entry["broken_rules"].append(broken)
        first = entry["broken_rules"][0]
        where = first["call"] + (f" request {first['request']}" if first["request"] is not None else "")
        entry["message"] = _clip(f"{entry['broken_count']} result(s) broke it, first: {where} in "
                                 f"{nodeid.rsplit('::', 1)[-1]}: {'; '.join(first['problems'])}", 300)
        if clause in self.xfailed_clauses:
            entry["outcome"], entry["message"] = "xfailed", self.xfailed_clauses[clause]
        ids = {nodeid, suite_id(nodeid), entry_id(nodeid)}
        for prefix, rules, reason in self.xfailed_rules:
            if rules == clause and any(i.startswith(p) for i in ids for p in {prefix, entry_id(prefix)}):
                entry["outcome"], entry["message"] = "xfailed", reason
                break

    def broken_failures(self) -> list[str]:
        """Records of broken result rules that fail the run (not xfailed)."""
        return [n for n, t in self.tests.items() if t.get("found_in") and t["outcome"] == "failed"]

    def pytest_collectreport(self, report):
        if report.failed and "collection error" not in self.reasons:
            self.reasons.append("collection error")

    def pytest_deselected(self, items):
        self.deselected.update({i.nodeid: _marked(i) for i in items if _marked(i)})

    def pytest_keyboard_interrupt(self, excinfo):
        # xdist's controller stops -x/--maxfail runs by raising a KeyboardInterrupt subclass
        reason = "maxfail" if str(excinfo.value).startswith("stopping after") else "interrupted"
        if reason not in self.reasons:
            self.reasons.append(reason)

    def note_collected(self, items) -> None:
        self.collected.update({i.nodeid: _marked(i) for i in items if _marked(i)})

    def merge_worker(self, data: dict) -> None:
        """What an xdist worker collected and loaded (its tests' reports reach
        the controller as pytest_runtest_logreport)."""
        self.collected.update(data.get("collected", {}))
        self.deselected.update(data.get("deselected", {}))
        self.capabilities = self.capabilities or data.get("capabilities")
        self.backend_error = self.backend_error or data.get("backend_error")
        for reason in data.get("reasons", []):
            if reason not in self.reasons:
                self.reasons.append(reason)

    def worker_output(self) -> dict:
        return {"collected": self.collected, "deselected": self.deselected, "capabilities": self.capabilities,
                "backend_error": self.backend_error, "reasons": self.reasons}

    def finish(self, exit_status: int, stopped: str | bool = False) -> None:
        """Called at session finish: the exit status and why the run stopped early."""
        self.exit_status = int(exit_status)
        why = []
        if stopped and "interrupt" not in str(stopped).lower() and "during collection" not in str(stopped):
            why.append("maxfail")
        if exit_status == 2 and not {"collection error", "maxfail", "interrupted"} & {*self.reasons, *why}:
            why.append("interrupted")
        if exit_status == 3:
            why.append("internal error")
        if self.deselected:
            why.append("subset")
        if self.backend_error:
            why.append("backend failed to load")
        for reason in why:
            if reason not in self.reasons:
                self.reasons.append(reason)

    def has_clauses(self) -> bool:
        return bool(self.tests) or bool(self.collected)

    def _ran(self) -> dict:
        out = {n: t for n, t in self.tests.items() if t["outcome"] is not None}
        for nodeid in self.crashed:  # the controller learns a crashed test's clauses from the workers' collection
            if nodeid in out and not out[nodeid]["clauses"]:
                out[nodeid]["clauses"] = list(self.collected.get(nodeid, []))
        return out

    def clauses(self) -> dict:
        from mtpcheck.catalogue import load_catalogue

        out, ran = {}, self._ran()
        for clause in load_catalogue().clause:
            tests = {n: t for n, t in ran.items() if clause.id in t["clauses"]}
            if not tests:
                continue
            worst = min((t["outcome"] for t in tests.values()), key=OUTCOME_ORDER.index)
            if worst == "skipped" and any(t["outcome"] == "passed" for t in tests.values()):
                worst = "passed"
            notes = sorted({t["message"] for t in tests.values() if t["outcome"] == worst and t["message"]})
            out[clause.id] = {"title": clause.title, "kind": clause.kind, "outcome": worst,
                              "tests": {n: t["outcome"] for n, t in tests.items()}, "notes": notes,
                              "evidence": [e for t in tests.values() for e in t["evidence"]]
                              + [{"broken_rule": b} for t in tests.values() for b in t.get("broken_rules", ())],
                              "exercise": merge_exercise([t.get("exercise") for t in tests.values()]),
                              "deviating_sides": sorted({t["deviating_side"] for t in tests.values()
                                                         if t.get("deviating_side")})}
        return out

    def not_run(self) -> dict:
        """Clauses none of whose tests ran, and the tests that did not run."""
        ran = self._ran()
        tests = sorted(n for n in {**self.collected, **self.deselected} if n not in ran)
        done = {c for t in ran.values() for c in t["clauses"]}
        clauses = {}
        for nodeid in tests:
            for cid in self.collected.get(nodeid) or self.deselected.get(nodeid, []):
                if cid in done or cid in clauses:
                    continue
                if nodeid in self.collected:
                    clauses[cid] = "not reached: " + (", ".join(r for r in self.reasons if r != "subset") or "not run")
                else:
                    clauses[cid] = "deselected"
        return {"clauses": dict(sorted(clauses.items())), "tests": tests}

    def complete(self) -> bool:
        return not self.reasons and not self.not_run()["tests"] and self.exit_status in (0, 1)

    @classmethod
    def from_report(cls, rep: RunReport) -> RunRecorder:
        """A recorder holding what a written report says: its header and table
        print as the run printed them (the tutorial's sample is made this way)."""
        caps = rep.backend.capabilities.model_dump(mode="json") if rep.backend.capabilities else None
        tests = {n: t.model_dump(mode="json") for n, t in rep.tests.items()}
        rec = cls(backend=rep.backend.name, options=dict(rep.backend.options), profile=rep.profile, seed=rep.seed,
                  capabilities=caps, tests=tests, reasons=list(rep.incomplete_reasons), exit_status=rep.exit_status,
                  crashed=list(rep.crashed))
        rec.collected = {n: t["clauses"] for n, t in tests.items()} | {n: [] for n in rep.not_run.tests}
        return rec

    def header_lines(self) -> list[str]:
        caps = self.capabilities or {}
        flags = [k for k, v in caps.items() if v is True]
        head = f"mtpcheck: backend {self.backend} ({caps.get('version', '?')}), profile {self.profile}, base seed {self.seed}"
        if not caps:  # e.g. interrupted under xdist before a worker loaded the backend and said what it declares
            return [head, "mtpcheck: capabilities: not known (the backend's declaration never reached this report)"]
        return [
            head,
            f"mtpcheck: capabilities: drafters {caps.get('mtp_kinds')}, max depth {caps.get('max_depth')}, "
            f"acceptance {caps.get('acceptance_rule')}, vocab {caps.get('vocab_size')}, round statistics "
            f"{caps.get('round_statistics', 'observed')}; {', '.join(flags)}",
        ]

    def table_lines(self) -> list[str]:
        rows = self.clauses()
        missing = self.not_run()["clauses"]
        width = max((len(c) for c in [*rows, *missing]), default=10)
        cells = {cid: exercise_summary(row["exercise"]) for cid, row in rows.items()}
        ex_width = max((len(c) for c in cells.values()), default=0)
        lines = []
        for cid, row in rows.items():
            note = row["notes"][0] if row["notes"] else ""
            # a skip reason names the capability or setting: never cut (failure messages can run long)
            ex = f"{cells[cid]:<{ex_width}}  " if ex_width else ""
            lines.append(f"{cid:<{width}}  {row['outcome'].upper():<8}  {ex}"
                         f"{note if row['outcome'] == 'skipped' else _clip(note, 110)}".rstrip())
        for cid, why in missing.items():
            if why != "deselected":
                lines.append(f"{cid:<{width}}  {'NOT RUN':<8}  {why}")
        counts = self.summary()
        deselected = sum(why == "deselected" for why in missing.values())
        lines.append("clauses: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                     + (f", {len(missing) - deselected} not run" if len(missing) > deselected else "")
                     + (f", {deselected} deselected" if deselected else "")
                     + f" (one row per clause, from {sum(not t.get('found_in') for t in self._ran().values())} suite tests; pytest's line counts tests)")
        for nodeid in self.crashed:
            lines.append(f"mtpcheck: CRASHED: the process died in {nodeid} (no verdict); the rest of the run "
                         "went on in a fresh worker")
        if self.exit_status is not None and not self.complete():
            lines.append(f"mtpcheck: INCOMPLETE run ({', '.join(self.reasons) or 'tests not run'}): "
                         "the report says complete: false")
        return lines

    def closing_lines(self, json_path: str | None, markdown_path: str | None) -> list[str]:
        """Where the reports went and what to do next, for someone reading the run for the first time."""
        counts, state = self.summary(), "complete" if self.complete() else "complete: false"
        lines = []
        if json_path:
            lines.append(f"mtpcheck: JSON report: {json_path} ({state}); check it in CI with "
                         f"`python -m mtpcheck.machinery.report validate {json_path} --complete`")
        else:
            lines.append("mtpcheck: no JSON report written (--mtp-json PATH, or `mtpcheck run --json PATH`)")
        if markdown_path:
            lines.append(f"mtpcheck: Markdown table: {markdown_path}")
        lines += self.thin_lines()
        if counts["failed"] or counts["error"] or counts["xpassed"]:
            lines.append("mtpcheck: next: a FAILED row's evidence is under clauses.<ID>.evidence in the JSON report; "
                         "a greedy divergence: `mtpcheck explain-divergence`; a documented deviation of your runtime "
                         "goes in an xfails file (docs/adapters.md, 'Known deviations')"
                         + self._xpassed_hint(counts["xpassed"]))
        elif counts["passed"] or counts["xfailed"]:
            lines.append("mtpcheck: next: judge your own runtime with --mtp-backend=package.module:factory "
                         "(docs/adapters.md); SKIPPED rows name the capability a clause needs")
        return lines

    def _xpassed_hint(self, xpassed: int) -> str:
        """An XPASSED deviation line is stale; an exercise=none or raises= line
        documents what the runtime does on some samples, so its pass is no fix."""
        if not xpassed:
            return ""
        pinned = sum(self.tests.get(n, {}).get("outcome") == "xpassed" for n in self.xpassed_pinned)
        hint = "; an XPASSED deviation line is fixed: remove it" if xpassed > pinned else ""
        if pinned:
            hint += (f"; {pinned} XPASSED under an exercise=none or raises= line, which documents what the runtime "
                     "does on some samples: keep it while the runtime still does it")
        return hint

    def thin_lines(self) -> list[str]:
        """Tests that passed on a thin sample of speculation: k accepted (or
        rejected) proposals where the clause needs some. At that rate a sample
        drawn afresh (another seed, a runtime whose output varies run to run)
        holds none with probability about exp(-k) and fails `speculation not
        exercised`: a green run that may not repeat, said before it happens."""
        redrawn = [n.split("::", 1)[-1] for n, e in self.tests.items()
                   if e.get("exercise_redraw") and e["outcome"] != "failed"]
        out = [f"mtpcheck: redrawn: {len(redrawn)} seeded test(s) held nothing of what they need at the run's seed "
               f"and were judged on a second sample, a sign of thin exercise (tests.<id>.exercise_redraw): "
               f"{'; '.join(redrawn[:4])}{'; ...' if len(redrawn) > 4 else ''}"] if redrawn else []
        thin = sorted((m["count"], nodeid, m) for nodeid, e in self.tests.items() if (m := e.get("exercise_margin"))
                      and e["outcome"] == "passed" and m["count"] < THIN)  # xpassed: its line documents it
        if not thin:
            return out
        listed = "; ".join(f"{n.split('::', 1)[-1]} ({m['count']} {m['what']} of {m['drafted']})" for _, n, m in thin[:4])
        many = f"{len(thin)} passing tests rest" if len(thin) > 1 else "1 passing test rests"
        return out + [f"mtpcheck: thin exercise: {many} on fewer than {THIN} proposals of what they "
                f"need (drawn afresh, such a sample holds none with probability about exp(-k), up to "
                f"{math.exp(-thin[0][0]):.2g}, and fails 'speculation not exercised'): {listed}{'; ...' if len(thin) > 4 else ''} (docs/report.md, "
                f"'Exercise')"]

    def summary(self) -> dict:
        counts = dict.fromkeys(OUTCOME_ORDER, 0)
        for row in self.clauses().values():
            counts[row["outcome"]] += 1
        return counts

    def report(self, provisional: bool = False) -> RunReport:
        """The run's report; `provisional`: the one written before each test,
        which reads complete: false (reason 'unfinished') and names the running tests."""
        from importlib.metadata import PackageNotFoundError, version

        def ver(name):
            try:
                return version(name)
            except PackageNotFoundError:
                return None

        return RunReport.model_validate({
            "complete": self.complete() and not provisional,
            "incomplete_reasons": list(self.reasons) + (["unfinished"] if provisional else []),
            "exit_status": self.exit_status if self.exit_status is not None and not provisional else -1,
            "backend": {"name": self.backend, "options": self.options, "capabilities": self.capabilities},
            "versions": {n: ver(n) for n in ("mtpcheck", "mlx", "numpy", "pytest", "hypothesis", "mlx-lm", "mlx-vlm")}
            | {"python": platform.python_version()},
            "profile": self.profile,
            "seed": self.seed,
            "duration_s": round(time.time() - self.started, 3),
            "clauses": self.clauses(),
            "not_run": self.not_run(),
            "tests": self._ran(),
            "summary": self.summary(),
            "running": list(self.running) if provisional else [],
            "crashed": list(self.crashed),
        })

    def as_dict(self) -> dict:
        return self.report().model_dump(mode="json")

    def write_json(self, path: str | Path, provisional: bool = False) -> None:
        """Write the report whole or not at all (a temporary file renamed over
        it): a reader never sees half a file, a killed run leaves the last one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.report(provisional).model_dump_json(indent=2) + "\n")
        os.replace(tmp, path)

    def markdown(self) -> str:
        """The clause table with the evidence summary, for a pull request."""
        rep = self.report()
        caps = rep.backend.capabilities
        state = "complete" if rep.complete else f"**incomplete** ({', '.join(rep.incomplete_reasons) or 'tests not run'})"
        lines = [f"### mtpcheck: {rep.backend.name} ({caps.version if caps else 'not loaded'})", "",
                 f"profile `{rep.profile}`, base seed `{rep.seed}`, exit status {rep.exit_status}, {state}; "
                 + ", ".join(f"{v} {k}" for k, v in rep.summary.items() if v), "",
                 "| clause | outcome | exercised | note | evidence |", "|---|---|---|---|---|"]

        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        for cid, row in rep.clauses.items():
            ex = exercise_summary(row.exercise.model_dump() if row.exercise else None)
            lines.append(f"| {cid} | {row.outcome.upper()} | {ex} | {cell(row.notes[0] if row.notes else '')} "
                         f"| {cell(evidence_summary(row.evidence))} |")
        for cid, why in rep.not_run.clauses.items():
            if why != "deselected":
                lines.append(f"| {cid} | NOT RUN | | {cell(why)} | |")
        deselected = [cid for cid, why in rep.not_run.clauses.items() if why == "deselected"]
        if deselected:
            lines += ["", f"Deselected, not run: {', '.join(deselected)}."]
        return "\n".join(lines) + "\n"

    def write_markdown(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(self.markdown())


def _marked(item) -> list[str]:
    """The clause ids of a collected item's contract markers."""
    return [m.args[0] for m in item.iter_markers("contract") if m.args]


def check_report(path: str | Path) -> RunReport:
    """Read a JSON report and validate it against RunReport (raises on a bad one)."""
    return RunReport.model_validate_json(Path(path).read_text(encoding="utf-8"))


SAMPLE_BEGIN, SAMPLE_END = "<!-- sample run: generated by `python -m mtpcheck.machinery.report sample` -->", \
    "<!-- end of sample run -->"


def sample_block(rep: RunReport, json_path: str = "out/report.json") -> str:
    """A run's terminal output as the tutorial shows it: header, clause table,
    count line, closing lines, and what the run took."""
    rec = RunRecorder.from_report(rep)
    lines = [*rec.header_lines(), "...", *rec.table_lines(), *rec.closing_lines(json_path, None), f"(this run: {rep.duration_s:.0f} s, "
             f"{sum(t.outcome == 'passed' for t in rep.tests.values())} suite tests passed, "
             f"mtpcheck {rep.versions.get('mtpcheck')}, mlx {rep.versions.get('mlx')})"]
    return "\n".join([SAMPLE_BEGIN, "```", *lines, "```", SAMPLE_END])


def write_sample(rep: RunReport, doc: str | Path) -> None:
    """Replace the sample block of `doc` (between its markers) with this report's."""
    path = Path(doc)
    text = path.read_text(encoding="utf-8")
    if SAMPLE_BEGIN not in text or SAMPLE_END not in text:
        raise ValueError(f"{path}: no sample markers ({SAMPLE_BEGIN!r} ... {SAMPLE_END!r})")
    head, rest = text.split(SAMPLE_BEGIN, 1)
    path.write_text(head + sample_block(rep) + rest.split(SAMPLE_END, 1)[1], encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """`python -m mtpcheck.machinery.report validate PATH [--complete]`: a CI check of a report file;
    `... sample PATH --write docs/tutorial.md`: the tutorial's sample output from a main-job report."""
    import argparse
    import sys

    import pydantic

    p = argparse.ArgumentParser(prog="python -m mtpcheck.machinery.report")
    p.add_argument("action", choices=["validate", "sample"])
    p.add_argument("path")
    p.add_argument("--complete", action="store_true", help="also require complete: true")
    p.add_argument("--write", metavar="DOC", help="sample: replace the sample block of DOC (else print it)")
    args = p.parse_args(argv)
    try:
        rep = check_report(args.path)
    except (OSError, pydantic.ValidationError) as exc:
        sys.stderr.write(f"mtpcheck.machinery.report: {args.path}: not a valid report: {str(exc).splitlines()[0]}\n")
        return 1
    if args.action == "sample":
        if not args.write:
            print(sample_block(rep))
            return 0
        try:
            write_sample(rep, args.write)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"mtpcheck.machinery.report: {exc}\n")
            return 1
        return 0
    if args.complete and not rep.complete:
        sys.stderr.write(f"mtpcheck.machinery.report: {args.path}: incomplete run: {', '.join(rep.incomplete_reasons)}\n")
        return 1
    print(f"{args.path}: schema_version {rep.schema_version}, {len(rep.clauses)} clauses, "
          f"complete {rep.complete}, exit status {rep.exit_status}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
