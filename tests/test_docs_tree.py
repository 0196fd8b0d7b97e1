"""The docs match the tree: docs/architecture.md names every module of the
package and nothing that is gone, docs/bug-classes.md lists every mutant under
its class, and the paths and `python -m` commands the docs cite exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mtpcheck"
DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def _has_code(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def package_modules() -> set[str]:
    """Every module, relative to mtpcheck/ (research/'s with their folder); a
    package's __init__.py only when it holds code."""
    found = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")}
    found |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "research").glob("*.py")}
    return {m for m in found if "__pycache__" not in m
            and (not m.endswith("__init__.py") or _has_code(PKG / m if (PKG / m).exists() else ROOT / m))}


def modules_section(text: str) -> str:
    match = re.search(r"^## Modules\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "docs/architecture.md has no '## Modules' section"
    return match.group(1)


def named_modules(section: str) -> set[str]:
    return set(re.findall(r"`([\w/]+\.py)`", section))


def test_architecture_names_every_module():
    named = named_modules(modules_section((ROOT / "docs/architecture.md").read_text()))
    modules = package_modules()
    assert not modules - named, f"modules docs/architecture.md does not name: {sorted(modules - named)}"
    gone = {m for m in named - modules if not (PKG / m).exists() and not (ROOT / m).exists()}
    assert not gone, f"docs/architecture.md names modules that do not exist: {sorted(gone)}"


def test_modules_check_sees_a_missing_and_a_stale_name():
    section = "| `engine/decode.py` | the round |\n| `engine/gone.py` | removed |\n"
    named = named_modules(modules_section(f"## Modules\n{section}## Next\n"))
    assert "engine/sampling.py" in package_modules() - named
    assert "engine/gone.py" in named and not (PKG / "engine/gone.py").exists()


def test_bug_classes_list_every_mutant_under_its_class():
    from mtpcheck.mutants import ZOO

    rows = {}
    for line in (ROOT / "docs/bug-classes.md").read_text().splitlines():
        if m := re.match(r"\| (B\d\d) \|", line):
            rows[m.group(1)] = set(re.findall(r"`([a-z0-9-]+)`", line.split("|")[4]))
    missing = [(m.name, m.bug_class) for m in ZOO if m.bug_class != "-" and m.name not in rows.get(m.bug_class, ())]
    assert not missing, f"mutants docs/bug-classes.md does not list under their class: {missing}"
    listed = set().union(*rows.values())
    assert listed <= {m.name for m in ZOO}, f"docs/bug-classes.md lists no-longer mutants: {listed - {m.name for m in ZOO}}"


def cited(text: str) -> set[str]:
    """Repository paths and `python -m` modules a page cites."""
    paths = set(re.findall(r"(?<![\w/.-])((?:mtpcheck|research|benchmarks|tests|golden)/[\w/.-]+\.(?:py|toml|md|json|jsonl|xz))(?![\w])",
                           text))
    modules = {m.replace(".", "/") for m in re.findall(r"python -m ((?:mtpcheck|research)(?:\.\w+)+)", text)}
    return paths | {m + ".py" if not (ROOT / m).is_dir() else m for m in modules}


def test_docs_cite_only_what_exists():
    dead = {f"{page.relative_to(ROOT)}: {p}" for page in DOCS for p in cited(page.read_text())
            if not (ROOT / p).exists() and "my_runtime" not in p}
    assert not dead, f"docs cite paths that do not exist: {sorted(dead)}"


def test_cited_sees_a_dead_path():
    assert cited("run `python -m mtpcheck.gone` and read mtpcheck/engine/gone.py") == {
        "mtpcheck/gone.py", "mtpcheck/engine/gone.py"}
