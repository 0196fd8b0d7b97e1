"""The run's alpha budget is derived from a registry of the suite's statistical
tests (mtpcheck.machinery.configs.STATISTICAL), and the registry is held to
what pytest collects: a suite test that runs a statistical routine without an
entry, or an entry collected under other parametrisations than it declares,
fails here instead of silently spending alpha the union bound does not hold."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mtpcheck
from mtpcheck.laws.stats import SUITE_ALPHA
from mtpcheck.machinery import configs as C

SUITE = Path(mtpcheck.__file__).resolve().parent / "suite"
DOCS = Path(__file__).resolve().parents[1] / "docs"
# the budget's pools: a suite test takes its own share by name, never a pool
POOLS = {"SUITE_ALPHA", "DIST_ALPHA", "INDEPENDENCE_ALPHA", "alpha_for", "bonferroni"}
LOOKUPS = {"subtest_alpha", "statistical"}


def routines() -> set[str]:
    """The statistical routines a suite test can run: public functions of
    mtpcheck.laws and mtpcheck.machinery that take an `alpha` and return a
    verdict (not a number, as detectable_tv and samples_for_tv do)."""
    out = set()
    for pkg in ("mtpcheck.laws", "mtpcheck.machinery"):
        for info in pkgutil.iter_modules(importlib.import_module(pkg).__path__):
            mod = importlib.import_module(f"{pkg}.{info.name}")
            for name, f in vars(mod).items():
                if not inspect.isfunction(f) or f.__module__ != mod.__name__ or name.startswith("_"):
                    continue
                sig = inspect.signature(f)
                if "alpha" in sig.parameters and sig.return_annotation not in (float, int, "float", "int"):
                    out.add(name)
    return out


def statistical_functions(source: str, names: set[str]) -> set[str]:
    """Test functions of a module's source that call one of `names`, directly,
    in a nested function, or through the module's own helpers and fixtures."""
    tree = ast.parse(source)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    def runs(node, seen: set[str]) -> bool:
        follow = [a.arg for a in node.args.args if a.arg in defs]  # module-level fixtures it takes
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                f = sub.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in names:
                    return True
                if name in defs:
                    follow.append(name)
        for name in follow:
            if name not in seen:
                seen.add(name)
                if runs(defs[name], seen):
                    return True
        return False

    return {n for n, d in defs.items() if n.startswith("test") and runs(d, {n})}


def budget_problems(collected: set[str], found: set[tuple[str, str]], registry) -> list[str]:
    """Disagreements between the collected node ids ("file.py::name[param]"),
    the (file, function) pairs that run a statistical routine, and the registry."""
    registered = {tuple(s.test.split("::")) for s in registry}
    problems = [f"{f}::{fn} runs a statistical test but is not in configs.STATISTICAL: its alpha is not budgeted"
                for f, fn in sorted(found - registered)]
    problems += [f"{f}::{fn} is in configs.STATISTICAL but runs no statistical routine" for f, fn in sorted(registered - found)]
    want = {i for s in registry for i in s.items}
    got = {i for i in collected if tuple(i.split("[")[0].split("::")) in registered}
    problems += [f"{i} is collected but configs.STATISTICAL does not declare it" for i in sorted(got - want)]
    problems += [f"{i} is declared in configs.STATISTICAL but not collected" for i in sorted(want - got)]
    return problems


def suite_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(SUITE.glob("test_*.py"))}


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> set[str]:
    """The suite's node ids as a user's `pytest --pyargs mtpcheck.suite` collects them."""
    env = {**os.environ, "MLX_DISABLE_COMPILE": "1",
           "PYTHONPATH": os.pathsep.join([str(SUITE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "mtpcheck.suite", "--mtp-backend=toy",
                          "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=tmp_path_factory.mktemp("collect"), env=env, capture_output=True, text=True, timeout=600)
    ids = {Path(m.group(1)).name + "::" + m.group(2)
           for m in re.finditer(r"^(\S+\.py)::(\S+)$", out.stdout, re.M)}
    assert ids, f"collection failed (rc {out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return ids


def test_the_collected_statistical_tests_are_the_registry(collected):
    names = routines()
    assert {"rank_gtest", "pit_ks", "series_test", "coincidence_test", "context_gtest", "staged_test"} <= names
    found = {(f, fn) for f, src in suite_sources().items() for fn in statistical_functions(src, names)}
    assert budget_problems(collected, found, C.STATISTICAL) == []


def test_a_statistical_test_added_without_the_registry_fails(collected):
    """What the test above catches, shown on a suite with one test more:
    a new statistical function, and a registered one collected once more."""
    names = routines()
    found = {(f, fn) for f, src in suite_sources().items() for fn in statistical_functions(src, names)}
    extra = suite_sources()["test_grammar.py"] + (
        "\n\ndef _judge(obs):\n    return rank_gtest(obs, alpha=1e-8)\n\n\n"
        "def test_a_new_law(mtp_backend):\n    assert _judge([]).passed\n")
    grown = found | {("test_grammar.py", fn) for fn in statistical_functions(extra, names)}
    assert budget_problems(collected, grown, C.STATISTICAL) == [
        "test_grammar.py::test_a_new_law runs a statistical test but is not in configs.STATISTICAL: its alpha is "
        "not budgeted"]
    item = "test_grammar.py::test_constrained_outputs_follow_the_exact_law[both]"
    assert budget_problems(collected | {item}, found, C.STATISTICAL) == [
        f"{item} is collected but configs.STATISTICAL does not declare it"]


def test_the_suite_takes_its_alpha_from_the_registry_by_name():
    """No suite module touches a pool of the budget, and each lookup names the
    test function it sits in: no test spends another's share."""
    registered = {s.function for s in C.STATISTICAL}
    assert len(registered) == len(C.STATISTICAL), "one entry per test function"
    for name, src in suite_sources().items():
        tree = ast.parse(src)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not used & POOLS, f"{name} uses {sorted(used & POOLS)}: take the test's alpha with subtest_alpha(name)"
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            for call in (c for c in ast.walk(fn) if isinstance(c, ast.Call)):
                if isinstance(call.func, ast.Name) and call.func.id in LOOKUPS:
                    assert [a.value for a in call.args if isinstance(a, ast.Constant)] == [fn.name], (
                        f"{name}::{fn.name} looks up another test's alpha")


def test_the_run_budget_adds_up_to_at_most_1e_6():
    """The union bound over every registered item, and each staged test's
    stages within its own alpha."""
    assert C.budget_total() <= SUITE_ALPHA * (1 + 1e-12)
    assert C.budget_total() == pytest.approx(SUITE_ALPHA)  # spent in full: no share is left unassigned
    assert C.STAT_SUBTESTS == sum(len(s.items) * s.subtests for s in C.STATISTICAL if s.share == "distribution")
    assert C.INDEPENDENCE_TESTS == len({s.clause for s in C.STATISTICAL if s.share == "independence"})
    assert C.DIST_STAGE1 + C.DIST_STAGE2 <= C.subtest_alpha("test_emitted_tokens_follow_the_target_law") * (1 + 1e-12)
    assert 3 * C.CONTEXT_STAGE_ALPHA <= C.subtest_alpha("test_tokens_follow_the_target_law_at_fixed_contexts") * (1 + 1e-12)
    for s in C.STATISTICAL:
        assert s.share in ("distribution", "independence") and s.subtests >= 1, s
    # the alphas spent only after a failure are declared, and outside the budget
    assert set(C.AFTER_FAILURE) == {"SIDE_ALPHA", "EMPIRICAL_ALPHA"}


def test_the_statistics_page_states_the_derived_budget():
    """docs/statistics.md gives the figures the registry derives: a test added
    to the registry changes DIST_ALPHA, and the page must say so."""
    text = (DOCS / "statistics.md").read_text()
    mantissa, exponent = f"{C.DIST_ALPHA:.2e}".split("e")
    assert f"/ {C.STAT_SUBTESTS} = {mantissa}e{int(exponent)}" in text
    assert "mtpcheck.machinery.configs.STATISTICAL" in text and "tests/test_budget.py" in text
