"""The clause catalogue: load, export, and tie clauses to suite tests."""

from __future__ import annotations

import ast
import json
import tomllib
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent / "suite"

Capability = Literal[
    "speculation", "target_distributions", "traces", "logprobs", "text", "seeded_determinism",
    "position_addressed_target_sampling", "exact_match", "rejection", "scheduler", "lookahead",
    "constraints", "inspection",
]


class Clause(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Z][A-Z0-9-]+$")
    title: str
    statement: str
    rationale: str
    seed: str
    requires: list[Capability] = Field(default_factory=list)
    kind: Literal["black-box", "white-box", "exact", "statistical"]
    bug_classes: list[str] = Field(default_factory=list)


class Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clause: list[Clause]

    def by_id(self) -> dict[str, Clause]:
        return {c.id: c for c in self.clause}


@cache
def load_catalogue(folder: Path = HERE) -> Catalogue:
    """All clauses of every *.toml in the folder (one file per area), core first."""
    files = sorted(folder.glob("*.toml"), key=lambda p: (p.name != "clauses.toml", p.name))
    clauses = [c for path in files for c in tomllib.loads(path.read_text()).get("clause", [])]
    cat = Catalogue.model_validate({"clause": clauses})
    ids = [c.id for c in cat.clause]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate clause ids in {folder}: {dupes}")
    return cat


def export_json() -> str:
    return json.dumps(load_catalogue().model_dump(), indent=2) + "\n"


def _contract_ids(node: ast.AST) -> list[str]:
    """Clause ids named by `contract("ID")` calls anywhere under node."""
    ids = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == "contract" and sub.args and isinstance(sub.args[0], ast.Constant):
                ids.append(sub.args[0].value)
    return ids


def suite_tests(folder: Path = SUITE) -> dict[str, list[str]]:
    """'file::test' -> clause ids from its decorators, its class's, or the module's pytestmark."""
    out: dict[str, list[str]] = {}
    for path in sorted(folder.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_ids = [i for n in tree.body if isinstance(n, ast.Assign)
                      and any(getattr(t, "id", "") == "pytestmark" for t in n.targets) for i in _contract_ids(n)]

        def visit(body, prefix, inherited, path=path):
            for n in body:
                if isinstance(n, ast.ClassDef) and n.name.startswith("Test"):
                    visit(n.body, f"{prefix}{n.name}::", inherited + [i for d in n.decorator_list for i in _contract_ids(d)], path)
                elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test"):
                    out[f"{path.name}::{prefix}{n.name}"] = inherited + [i for d in n.decorator_list for i in _contract_ids(d)]

        visit(tree.body, "", module_ids)
    return out


def check(folder: Path = SUITE) -> list[str]:
    """Problems: clauses without tests, tests without clauses, unknown ids."""
    known = load_catalogue().by_id()
    tests = suite_tests(folder)
    problems = [f"{t}: names no clause (add @pytest.mark.contract('ID'))" for t, ids in tests.items() if not ids]
    problems += [f"{t}: unknown clause {i!r}" for t, ids in tests.items() for i in ids if i not in known]
    covered = {i for ids in tests.values() for i in ids}
    problems += [f"clause {c}: no suite test names it" for c in known if c not in covered]
    return problems
