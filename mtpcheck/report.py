"""The run's record: per-test reports rolled up per clause, the header, the
table, the JSON report, and the xfails/skips files."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

# worst first: a clause with any xfailed test shows XFAILED, not PASSED (a
# clause with passed and skipped tests shows PASSED: see RunRecorder.clauses)
OUTCOME_ORDER = ["failed", "error", "xpassed", "xfailed", "passed", "skipped"]


def read_id_file(path: str | Path) -> list[tuple[str, str]]:
    """Lines of node-id prefixes or clause ids; '#' starts a comment that
    becomes the reason. Returns (entry, reason) pairs."""
    entries = []
    for raw in Path(path).read_text().splitlines():
        entry, _, comment = raw.partition("#")
        entry = entry.strip()
        if entry:
            entries.append((entry, comment.strip() or f"listed in {Path(path).name}"))
    return entries


def _candidates(nodeid: str) -> list[str]:
    """A node id as written in this repo, installed (site-packages/...) and bare."""
    out = [nodeid]
    if "mtpcheck/suite/" in nodeid:
        out.append(nodeid[nodeid.index("mtpcheck/suite/") :])
    out.append(nodeid.rsplit("/", 1)[-1])
    return out


def match_lines(entries, items, clause_ids) -> dict:
    """Which items each entry selects (by node-id prefix or clause id)."""
    matches, used = [], set()
    for item in items:
        for entry, reason in entries:
            if entry in clause_ids(item) or any(c.startswith(entry) for c in _candidates(item.nodeid)):
                matches.append((item, reason))
                used.add(entry)
                break
    return {"__matches__": matches, "__unused__": [e for e, _ in entries if e not in used]}


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
        return _clip((crash.message if crash else str(report.longrepr)).splitlines()[0], 300)
    return ""


@dataclass(eq=False)  # registered as a pytest plugin: must stay hashable
class RunRecorder:
    backend: str
    options: dict
    profile: str
    seed: int
    capabilities: dict | None = None
    tests: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    # pytest hook (the recorder is registered as a plugin)
    def pytest_runtest_logreport(self, report):
        props = dict(report.user_properties)
        if "mtp_clauses" not in props:
            return
        entry = self.tests.setdefault(report.nodeid, {"clauses": props["mtp_clauses"], "outcome": None,
                                                      "message": "", "duration_s": 0.0, "evidence": []})
        entry["duration_s"] += report.duration
        outcome = _outcome(report)
        # the worst phase wins; a passing setup/teardown says nothing on its own
        if (report.when == "call" or outcome != "passed") and (
            entry["outcome"] is None or OUTCOME_ORDER.index(outcome) < OUTCOME_ORDER.index(entry["outcome"])
        ):
            entry["outcome"], entry["message"] = outcome, _message(report)
        entry["evidence"] = [v for k, v in report.user_properties if k == "mtp_evidence"]

    def has_clauses(self) -> bool:
        return bool(self.tests)

    def clauses(self) -> dict:
        from mtpcheck.catalogue import load_catalogue

        out = {}
        for clause in load_catalogue().clause:
            tests = {n: t for n, t in self.tests.items() if clause.id in t["clauses"]}
            if not tests:
                continue
            worst = min((t["outcome"] for t in tests.values()), key=OUTCOME_ORDER.index)
            if worst == "skipped" and any(t["outcome"] == "passed" for t in tests.values()):
                worst = "passed"
            notes = sorted({t["message"] for t in tests.values() if t["outcome"] == worst and t["message"]})
            out[clause.id] = {"title": clause.title, "kind": clause.kind, "outcome": worst,
                              "tests": {n: t["outcome"] for n, t in tests.items()}, "notes": notes,
                              "evidence": [e for t in tests.values() for e in t["evidence"]]}
        return out

    def header_lines(self) -> list[str]:
        caps = self.capabilities or {}
        flags = [k for k, v in caps.items() if v is True]
        return [
            f"mtpcheck: backend {self.backend} ({caps.get('version', '?')}), profile {self.profile}, base seed {self.seed}",
            f"mtpcheck: capabilities: drafters {caps.get('mtp_kinds')}, max depth {caps.get('max_depth')}, "
            f"acceptance {caps.get('acceptance_rule')}, vocab {caps.get('vocab_size')}; {', '.join(flags)}",
        ]

    def table_lines(self) -> list[str]:
        rows = self.clauses()
        width = max((len(c) for c in rows), default=10)
        lines = []
        for cid, row in rows.items():
            note = row["notes"][0] if row["notes"] else ""
            lines.append(f"{cid:<{width}}  {row['outcome'].upper():<8}  {_clip(note, 110)}")
        counts = self.summary()
        lines.append("clauses: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
        return lines

    def summary(self) -> dict:
        counts = dict.fromkeys(OUTCOME_ORDER, 0)
        for row in self.clauses().values():
            counts[row["outcome"]] += 1
        return counts

    def as_dict(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        def ver(name):
            try:
                return version(name)
            except PackageNotFoundError:
                return None

        return {
            "backend": {"name": self.backend, "options": self.options, "capabilities": self.capabilities},
            "versions": {n: ver(n) for n in ("mtpcheck", "mlx", "numpy", "pytest", "hypothesis", "mlx-lm", "mlx-vlm")}
            | {"python": platform.python_version()},
            "profile": self.profile,
            "seed": self.seed,
            "duration_s": round(time.time() - self.started, 3),
            "clauses": self.clauses(),
            "tests": self.tests,
            "summary": self.summary(),
        }

    def write_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.as_dict(), indent=2, default=str) + "\n")
