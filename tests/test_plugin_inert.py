"""The plugin is inert in a session that does not use mtpcheck: pytest loads
mtpcheck.plugin in every session of an environment where mtpcheck is
installed, and it registers its hooks (mtpcheck._plugin_impl) only when an
--mtp-* option is given, the suite is among the test paths, or a collected
test is marked `contract` or uses an mtp_* fixture."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtpcheck import plugin

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("mtpcheck.backends", "mtpcheck.machinery", "mtpcheck.contracts", "mtpcheck._plugin_impl", "mtpcheck.backend",
         "numpy", "pydantic")
PROBE = """
import json, sys

def test_one(request):
    loaded = sorted(m for m in sys.modules if m.startswith(("mtpcheck", "numpy", "pydantic")))
    hooks = request.config.pluginmanager.has_plugin("mtpcheck-hooks")
    with open({out!r}, "a") as f:
        f.write(json.dumps({{"loaded": loaded, "hooks": hooks}}) + "\\n")
"""


def _env():
    # this checkout's plugin, whatever copy of mtpcheck the interpreter has installed
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("extra", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_an_unrelated_session_imports_nothing_heavy(tmp_path, extra):
    """A fresh interpreter, one trivial test, no --mtp-* option: of mtpcheck only
    the package root and the plugin module are imported, and no hook is registered."""
    if extra:
        pytest.importorskip("xdist")
    out = tmp_path / "probe.jsonl"
    (tmp_path / "test_unrelated.py").write_text(PROBE.format(out=str(out)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, "test_unrelated.py"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = [__import__("json").loads(line) for line in out.read_text().splitlines()]
    assert probe and probe[0]["hooks"] is False
    assert "mtpcheck.plugin" in probe[0]["loaded"]  # the plugin was loaded: the check is not vacuous
    heavy = [m for m in probe[0]["loaded"] if m.startswith(HEAVY)]
    assert heavy == [], heavy
    assert "mtpcheck clauses" not in done.stdout


def test_the_same_session_with_an_option_registers_the_hooks(tmp_path):
    out = tmp_path / "probe.jsonl"
    (tmp_path / "test_unrelated.py").write_text(PROBE.format(out=str(out)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--mtp-seed=7",
                           "test_unrelated.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = __import__("json").loads(out.read_text())
    assert probe["hooks"] is True and "mtpcheck._plugin_impl" in probe["loaded"]


HOOKS = """
def test_hooks(request):
    print("HOOKS", request.config.pluginmanager.has_plugin("mtpcheck-hooks"))
"""


@pytest.mark.parametrize("args, ini, on", [
    ([], None, False),
    (["--mtp-seed=7"], None, True),
    (["--mtp-backend=mlx"], None, True),  # the default's value, given: still a use
    (["--mtp-xfails-strict"], None, True),
    ([], "[pytest]\naddopts = --mtp-profile=ci\n", True),
], ids=["none", "seed", "default-value", "flag", "addopts"])
def test_an_option_turns_the_plugin_on(pytester, args, ini, on):
    if ini:
        pytester.makeini(ini)
    pytester.makepyfile(test_hooks=HOOKS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-s", *args)
    result.stdout.fnmatch_lines([f"*HOOKS {on}"])
    assert result.ret == 0


def test_markers_are_registered_in_every_session(pytester):
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.contract(clause_id):*", "@pytest.mark.requires(*capabilities):*",
                                 "@pytest.mark.exercise(*needs, reason):*"])


def test_a_downstream_fixture_without_options_turns_it_on(pytester):
    """A downstream test that uses the plugin's fixtures, run with no --mtp-* option."""
    pytester.makepyfile(test_down="""
        def test_seed(mtp_seed, mtp_record, request):
            mtp_record(seed=mtp_seed)
            assert mtp_seed == 1234
            assert request.config.pluginmanager.has_plugin("mtpcheck-hooks")

        def test_plain():
            pass
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=2)


DOWNSTREAM_CONTRACT = """
import pytest

@pytest.mark.contract("REQ-BLOCK")
def test_marked(mtp_capabilities):
    assert mtp_capabilities is not None
"""


def test_a_contract_test_without_options_is_a_suite_test(pytester):
    """No option, no suite path, --strict-markers: the marker is known, the
    hooks turn on at collection, and the clause table is shown."""
    pytester.makepyfile(test_down=DOWNSTREAM_CONTRACT)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*mtpcheck clauses*", "REQ-BLOCK*PASSED*"])


def test_a_contract_test_without_options_under_xdist(pytester):
    """The controller collects nothing: it turns on at the first report of a suite test."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_down=DOWNSTREAM_CONTRACT + "\n\ndef test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*mtpcheck clauses*", "mtpcheck: backend mlx*", "REQ-BLOCK*PASSED*"])


def _config(args, pyargs=False, source="ARGS", here=Path("/nowhere")):
    return SimpleNamespace(args=[str(a) for a in args], option=SimpleNamespace(pyargs=pyargs),
                           args_source=getattr(pytest.Config.ArgsSource, source), rootpath=here,
                           invocation_params=SimpleNamespace(dir=here))


@pytest.mark.parametrize("args, pyargs, expected", [
    (["mtpcheck.suite"], True, True),
    (["mtpcheck.suite.test_greedy"], True, True),
    (["mtpcheck"], True, True),
    (["mtpcheck.suitex", "numpy"], True, False),
    (["mtpcheck.suite"], False, False),  # a path that does not exist, without --pyargs
    ([plugin.SUITE_DIR / "test_greedy.py::test_x"], False, True),
    ([plugin.SUITE_DIR], False, True),
    ([plugin.SUITE_DIR.parent], False, True),  # a folder above the suite
    ([Path(__file__).parent], False, False),  # a folder beside the package: neither above nor inside the suite
])
def test_the_suite_among_the_test_paths(args, pyargs, expected):
    assert plugin._names_suite(_config(args, pyargs)) is expected


def test_testpaths_are_read_from_the_rootdir():
    here = plugin.SUITE_DIR.parent.parent
    assert plugin._names_suite(_config(["mtpcheck/suite"], source="TESTPATHS", here=here))
    assert not plugin._names_suite(_config(["tests"], source="TESTPATHS", here=here))


def test_an_installed_copy_in_a_projects_venv_is_not_the_suite(tmp_path, monkeypatch):
    """`pytest` at a project's root, with mtpcheck installed in the project's
    .venv: pytest does not collect there, so the plugin stays off."""
    monkeypatch.setattr(plugin, "SUITE_DIR", tmp_path / ".venv/lib/python3.12/site-packages/mtpcheck/suite")
    assert not plugin._names_suite(_config(["."], here=tmp_path))
    assert plugin._names_suite(_config([".venv/lib/python3.12/site-packages/mtpcheck/suite"], here=tmp_path))


def test_the_watcher_knows_the_reports_properties():
    """plugin.py spells out the report's property names so it imports nothing."""
    from mtpcheck.machinery import report

    assert plugin.OWN_PROPERTIES == {report.CLAUSE_PROPERTY, report.EVIDENCE_PROPERTY, report.CAPABILITIES_PROPERTY,
                                     report.BROKEN_PROPERTY}


def test_the_load_timeout_help_names_the_default():
    from mtpcheck import _plugin_impl

    assert f"and {_plugin_impl.LOAD_TIMEOUT:g})" in Path(plugin.__file__).read_text()
