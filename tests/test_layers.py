"""The package's import graph keeps the layers of docs/architecture.md.

Read statically (ast over mtpcheck/**/*.py, nothing imported), with one rule
for every ``import``: module level, inside a function, under TYPE_CHECKING -
all count, because a function-level import still ties the two modules (it
only defers the failure to the first call). An edge goes to the module named,
or to the submodule a ``from package import name`` names; importing a
submodule does not add an edge to its parent package (every package would
otherwise be in a cycle with its own ``__init__``).

Rules: the graph has no cycle; no adapter of mtpcheck/backends imports another
(they share mtpcheck/backends/_library.py); every layer but the top ones
(suite, plugin, cli) imports only what is below it (LOWER) - in particular the
engine does not know the suite's machinery (the scheduling protocol it
implements is a contract), the machinery knows no fixture and no concrete
backend, the fixture no backend; nothing imports the suite; and the
package's top level holds no alias modules (the old mtpcheck.checks & co. are
gone: the canonical paths are mtpcheck.machinery.*).

The research programs (research/ in the checkout, not shipped) sit above the
package: they may import any of it but the suite's test modules, and nothing
in the package imports them (an installed mtpcheck has no research/).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mtpcheck"
RESEARCH = ROOT / "research"

# layer -> the top-level parts of mtpcheck it may import (besides itself);
# "__init__" is the package mtpcheck itself, "backend" the Backend protocol
# (mtpcheck/backend.py). The top layers - suite, plugin, cli - may import any
# layer but the suite (test_nothing_imports_the_suite); the plugin is two
# modules, the inert entry point (plugin) and the hooks it registers when a
# session uses mtpcheck (_plugin_impl).
LOWER = {
    "contracts": set(),
    "catalogue": set(),
    "laws": {"contracts"},
    "inspect": {"contracts"},
    # the executable specification: it implements the contracts (the
    # scheduling protocol is one: mtpcheck/contracts/scheduling.py) and knows
    # nothing of the suite
    "engine": {"contracts"},
    # the judge: it re-derives laws with the engine's pure functions (sampling,
    # acceptance rules, constraint automata) and reaches backends only through
    # the registry (test_the_machinery_knows_no_concrete_backend); the prompts
    # it judges on are handed to it (mtpcheck.fixture.fixture_prompts)
    "machinery": {"contracts", "catalogue", "laws", "engine", "backends", "backend"},
    "backends": {"contracts", "engine", "fixture", "inspect", "backend", "__init__"},
    # data the adapters read: it loads its models with the engine, and does
    # not measure itself through the adapters (research.real_acceptance does)
    "fixture": {"contracts", "engine"},
    "mutants": {"contracts", "catalogue", "laws", "inspect", "engine", "machinery", "backends", "backend",
                "fixture", "__init__"},
    # what `mtpcheck bench` runs: a loaded backend timed on the fixture's prompts
    "measurement": {"contracts", "laws", "machinery", "backends", "backend", "fixture"},
}
TOP = {"suite", "plugin", "_plugin_impl", "cli"}
# the package's own top-level modules: no alias of a moved module among them
TOP_LEVEL_MODULES = {"mtpcheck", "mtpcheck.backend", "mtpcheck.cli", "mtpcheck.plugin", "mtpcheck._plugin_impl"}


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


def test_every_layer_is_placed():
    """A new top-level part of the package must be given its place in LOWER
    (or be a top layer): an unplaced one would escape every rule below."""
    found = {layer(m) for m in graph()}
    assert found <= set(LOWER) | TOP | {"__init__", "backend"}, sorted(found - set(LOWER) - TOP)


def test_nothing_imports_the_suite():
    """The suite's modules are collected by pytest, not imported: what a
    research program or a mutant needs of it lives in mtpcheck.machinery.configs."""
    edges = graph()
    bad = sorted(f"{m} -> {t}" for m, ts in edges.items() if layer(m) != "suite"
                 for t in ts if layer(t) == "suite")
    assert not bad, f"the suite is imported from outside it: {bad}"


def test_the_machinery_knows_no_concrete_backend():
    """Of mtpcheck/backends the machinery imports only the registry package
    (load_backend, the option checks), never an adapter or the library layer."""
    edges = graph()
    bad = sorted(f"{m} -> {t}" for m, ts in edges.items() if layer(m) == "machinery"
                 for t in ts if layer(t) == "backends" and t != "mtpcheck.backends")
    assert not bad, f"the machinery imports a concrete backend: {bad}"


def test_no_alias_modules_at_the_top_level():
    """mtpcheck.assertions, .checks, .scheduling and .strategies were aliases of
    the mtpcheck.machinery modules (issue 15); they are gone, and nothing else
    may appear beside the package's own top-level modules."""
    top = {m for m in modules() if m.count(".") <= 1 and not modules()[m][1]} | {"mtpcheck"}
    assert top == TOP_LEVEL_MODULES, f"unexpected top-level modules: {sorted(top - TOP_LEVEL_MODULES)}"


def named(path: Path) -> set[str]:
    """Every dotted name the imports of one file name, relative ones made
    absolute, whether or not it is a module of the package: the graph above
    keeps only the package's own modules, so it cannot see an import of research."""
    current, is_package = module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = current.split(".") if is_package else current.split(".")[:-1]
                source = ".".join(base[: len(base) - node.level + 1] + ([source] if source else []))
            found |= {source} | {f"{source}.{a.name}" for a in node.names}
    return found


def research_programs() -> list[Path]:
    return sorted(RESEARCH.glob("*.py"))


def test_the_research_walker_sees_the_imports_it_must():
    assert "research.power.pool" in named(RESEARCH / "profile_power.py")
    assert "mtpcheck.machinery.configs" in named(RESEARCH / "power.py")  # inside a function
    assert "research.write_section" in named(RESEARCH / "context_exact.py")


def test_the_package_never_imports_research():
    """research/ is not shipped: an import of it from the package would work
    from a checkout and fail in every installed copy."""
    bad = sorted(f"{name} -> {n}" for name, (path, _) in modules().items()
                 for n in named(path) if n.split(".")[0] == "research")
    assert not bad, f"the package imports the research programs: {bad}"


def test_research_imports_no_test_module():
    """The statistical plan the research programs measure is
    mtpcheck.machinery.configs, which the suite's modules import too."""
    programs = research_programs()
    assert len(programs) > 1, f"no research programs under {RESEARCH}"
    bad = sorted(f"{module_name(p)[0]} -> {n}" for p in programs for n in named(p)
                 if n == "mtpcheck.suite" or n.startswith("mtpcheck.suite."))
    assert not bad, f"a research program imports the suite: {bad}"
