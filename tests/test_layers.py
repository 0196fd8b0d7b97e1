"""The package's import graph keeps the layers of docs/architecture.md.

Read statically (ast over mtpcheck/**/*.py, nothing imported), with one rule
for every ``import``: module level, inside a function, under TYPE_CHECKING -
all count, because a function-level import still ties the two modules (it
only defers the failure to the first call). An edge goes to the module named,
or to the submodule a ``from package import name`` names; importing a
submodule does not add an edge to its parent package (every package would
otherwise be in a cycle with its own ``__init__``).

Rules: the graph has no cycle; no adapter of mtpcheck/backends imports another
(they share mtpcheck/backends/_library.py); the low layers import only what is
below them (LOWER).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mtpcheck"

# layer -> the top-level parts of mtpcheck it may import (besides itself)
LOWER = {
    "contracts": set(),
    "catalogue": set(),
    "laws": {"contracts"},
    "inspect": {"contracts"},
    "engine": {"contracts", "machinery"},  # engine.scheduler implements the scheduling protocol
    "backends": {"contracts", "engine", "fixture", "inspect", "backend", "__init__"},
}


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


@cache
def modules() -> dict[str, tuple[Path, bool]]:
    return {name: (p, pkg) for p in sorted(PACKAGE.rglob("*.py")) for name, pkg in [module_name(p)]}


def known(name: str) -> str | None:
    """The longest prefix of a dotted name that is a module of the package."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def targets(current: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {m for a in node.names if (m := known(a.name))}
    if node.level:  # relative: strip level-1 parts from the current package
        base = current.split(".") if is_package else current.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = set()
    for alias in node.names:
        full = f"{source}.{alias.name}"
        if full in modules():
            found.add(full)
        elif m := known(source):
            found.add(m)
    return found


@cache
def graph() -> dict[str, frozenset[str]]:
    edges = {}
    for name, (path, is_package) in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found |= targets(name, is_package, node)
        edges[name] = frozenset(found - {name})
    return edges


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_walker_sees_the_imports_it_must():
    edges = graph()
    assert "mtpcheck.backends._library" in edges["mtpcheck.backends.mlx_lm"]  # module level
    assert "mtpcheck.inspect" in edges["mtpcheck.backends.mlx_lm"]  # inside the loader
    assert "mtpcheck.fixture.corpus" in edges["mtpcheck.fixture"]  # relative, `from .corpus import`


def test_the_cycle_finder_can_fail():
    assert cycles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}) == [
        ["a", "b", "c"]]
    assert cycles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_the_package_has_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles (module level and function level alike): " + "; ".join(
        " <-> ".join(c) for c in found)


def adapters() -> set[str]:
    """The adapter modules: those BUILTINS (mtpcheck/backends/__init__.py) names."""
    tree = ast.parse((PACKAGE / "backends" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "BUILTINS":
            return {v.partition(":")[0] for v in ast.literal_eval(node.value).values()}
    raise AssertionError("no BUILTINS table in mtpcheck/backends/__init__.py")


# toy is the reference adapter over random models: a second loader of
# ReferenceBackend, not a second adapter; openai-http's llama.cpp dialect is
# llama-server's request mapping, and launch=llama-server starts its servers
SAME_ADAPTER = {("mtpcheck.backends.toy", "mtpcheck.backends.reference"),
                ("mtpcheck.backends.openai_http", "mtpcheck.backends.llama_server")}


def test_no_adapter_imports_another():
    edges, named = graph(), adapters()
    assert {"mtpcheck.backends.mlx_vlm", "mtpcheck.backends.mlx_lm", "mtpcheck.backends.reference"} <= named
    bad = sorted(f"{m} -> {t}" for m in edges if m.startswith("mtpcheck.backends")
                 for t in edges[m] if t in named and m in named | {"mtpcheck.backends._library"}
                 and (m, t) not in SAME_ADAPTER)
    assert not bad, f"adapters import each other (share mtpcheck/backends/_library.py instead): {bad}"
    assert not edges["mtpcheck.backends._library"] & named


@pytest.mark.parametrize("low", sorted(LOWER))
def test_low_layers_import_only_what_is_below_them(low):
    edges = graph()
    bad = sorted({f"{m} -> {t}" for m, ts in edges.items() if layer(m) == low
                  for t in ts if layer(t) != low and layer(t) not in LOWER[low]})
    assert not bad, f"{low} may import only {sorted(LOWER[low]) or 'nothing of mtpcheck'}: {bad}"


@pytest.mark.parametrize("old, new", [
    ("mtpcheck.assertions", "mtpcheck.machinery.assertions"),
    ("mtpcheck.checks", "mtpcheck.machinery.checks"),
    ("mtpcheck.strategies", "mtpcheck.machinery.strategies"),
    ("mtpcheck.scheduling", "mtpcheck.machinery.scheduling"),
])
def test_moved_public_paths_are_the_same_modules(old, new):
    """docs/downstream.md and docs/scheduler.md named the old paths: they stay
    importable as the very module objects (monkeypatching one patches both)."""
    import importlib

    assert importlib.import_module(old) is importlib.import_module(new)
