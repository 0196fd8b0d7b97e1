"""pytest11 entry point: the --mtp-* options, the markers and the fixtures.

pytest loads this module in every session of an environment where mtpcheck
is installed, so it is inert: it imports pytest and the standard library
only, and registers the real hooks (mtpcheck._plugin_impl: settings, the
recorder, xfails/skips files, capability skips, the report) only in a session
that uses mtpcheck:

- an --mtp-* option was given (on the command line, in addopts or
  PYTEST_ADDOPTS), or
- the suite is among the test paths (`--pyargs mtpcheck.suite`, a path inside
  mtpcheck/suite, or a checkout folder that holds it), or
- a collected test carries the `contract` marker or uses an mtp_* fixture
  (a downstream suite run without options); under xdist the controller,
  which collects nothing, turns on at the first report of such a test.

The markers are registered in every session, as hypothesis registers its
own: a downstream test module marked `contract` must import under
--strict-markers before anything above can be seen. The fixtures live here
too, so downstream suites find them; their bodies import on first use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

IMPL = "mtpcheck-hooks"  # the name mtpcheck._plugin_impl is registered under
SUITE_MODULE = "mtpcheck.suite"
SUITE_DIR = Path(__file__).resolve().parent / "suite"
MARKERS = (
    "contract(clause_id): the catalogue clause this suite test checks",
    "requires(*capabilities): capabilities needed beyond the clause's own",
    "exercise(*needs, reason): what this test's sample must exercise, in place of its clause's catalogue field "
    "('accepted', 'rejected'; none: exempt, with why)",
)
# report properties only mtpcheck writes (mtpcheck.machinery.report: CLAUSE_PROPERTY, BROKEN_PROPERTY,
# EVIDENCE_PROPERTY, CAPABILITIES_PROPERTY), spelled out so this module imports nothing
OWN_PROPERTIES = frozenset({"clause", "mtp_evidence", "mtp_capabilities", "mtp_broken_rule"})
_DEFAULTS: dict[str, object] = {}  # option dest -> default, filled by pytest_addoption


def pytest_addoption(parser):
    group = parser.getgroup("mtpcheck", "mtpcheck: speculative decoding conformance")

    def add(name, **kwargs):
        group.addoption(name, **kwargs)
        _DEFAULTS[name[2:].replace("-", "_")] = kwargs.get("default")

    add("--mtp-backend", default="mlx",
        help="backend: a built-in name, an entry point in 'mtpcheck.backends', or package.module:factory (default: mlx)")
    add("--mtp-backend-option", action="append", default=[], metavar="KEY=VALUE",
        help="option passed to the backend factory (repeatable)")
    add("--mtp-profile", default="ci", choices=["ci", "dev", "thorough"],
        help="sample sizes and hypothesis example counts (default: ci)")
    add("--mtp-seed", default="1234", help="base seed of the run, or 'random' (default: 1234)")
    add("--mtp-timeout", default="120", help="per-call backend timeout in seconds (0: none)")
    add("--mtp-load-timeout", default=None,
        help="timeout of the backend factory in seconds (0: none; default: the larger of --mtp-timeout"
             " and 600)")  # mtpcheck._plugin_impl.LOAD_TIMEOUT: not imported here
    add("--mtp-xfails-file", default=None, help="node-id prefixes or clause ids to xfail, '#' comments")
    add("--mtp-xfails-strict", action="store_true", default=False,
        help="an xfails line whose test passes fails the run (XPASS(strict)), as in array-api-tests' CI use")
    add("--mtp-skips-file", default=None, help="node-id prefixes or clause ids to skip, '#' comments")
    add("--mtp-json", default=None, metavar="PATH",
        help="write a machine-readable report (write --mtp-json=PATH: pytest counts a space-separated PATH "
             "that exists among the test paths when it chooses the rootdir)")
    add("--mtp-markdown", default=None, metavar="PATH",
        help="write the clause table with the evidence summary as Markdown (for a pull request)")
    add("--mtp-clauses", default=None, metavar="ID,ID",
        help="run only the suite tests of these clause ids (comma-separated)")


def activate(config):
    """Register the real hooks once and return their module. pytest_configure
    is a historic hook: pytest calls the module's own on registration, even
    when that comes after the session was configured."""
    from mtpcheck import _plugin_impl

    if not config.pluginmanager.has_plugin(IMPL):
        config.pluginmanager.register(_plugin_impl, IMPL)
    return _plugin_impl


def _option_given(config) -> bool:
    args = [*config.invocation_params.args, *config.getini("addopts")]
    return any(str(a).startswith("--mtp-") for a in args) or any(
        config.getoption(dest) != default for dest, default in _DEFAULTS.items())


def _names_suite(config) -> bool:
    """The test paths hold the suite: a module name with --pyargs, or a path
    inside mtpcheck/suite or above it (not through an installed package's
    folder, which pytest does not collect into: a project's own .venv)."""
    base = config.rootpath if config.args_source == pytest.Config.ArgsSource.TESTPATHS else config.invocation_params.dir
    for arg in config.args:
        target = str(arg).split("::")[0]
        if config.option.pyargs and target and (SUITE_MODULE.startswith(target + ".") or target == SUITE_MODULE
                                                or target.startswith(SUITE_MODULE + ".")):
            return True
        try:
            path = (base / target).resolve()
        except (OSError, ValueError):
            continue
        if path == SUITE_DIR or SUITE_DIR in path.parents:
            return True
        if path in SUITE_DIR.parents and not any(part.startswith(".") or part in ("site-packages", "dist-packages")
                                                 for part in SUITE_DIR.relative_to(path).parts):
            return True
    return False


def _xdist_controller(config) -> bool:
    # xdist's own test for a distributed run (its pytest_cmdline_main has set both)
    return config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None)) and not (
        config.getoption("collectonly") or hasattr(config, "workerinput"))


def pytest_configure(config):
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if _option_given(config) or _names_suite(config):
        activate(config)
    elif _xdist_controller(config):
        config.pluginmanager.register(_ReportWatcher(config), "mtpcheck-watcher")
    else:
        config.pluginmanager.register(_CollectionWatcher(), "mtpcheck-watcher")


def _uses_mtpcheck(item) -> bool:
    return item.get_closest_marker("contract") is not None or any(
        name.startswith("mtp_") for name in getattr(item, "fixturenames", ()))


class _CollectionWatcher:
    """A session with no --mtp-* option and no suite path: turn on when a
    collected test is a suite test or uses the plugin's fixtures."""

    def pytest_collection_modifyitems(self, session, config, items):
        if not config.pluginmanager.has_plugin(IMPL) and any(_uses_mtpcheck(i) for i in items):
            # registered during this hook call, so pluggy does not call its own: pass the items on
            activate(config).pytest_collection_modifyitems(session, config, items)


class _ReportWatcher:
    """An xdist controller collects nothing: turn on at the first report that
    carries mtpcheck's properties (the recorder registered now missed it)."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        if self.config.pluginmanager.has_plugin(IMPL) or not any(
                k in OWN_PROPERTIES for k, _ in report.user_properties):
            return
        activate(self.config).recorder(self.config).pytest_runtest_logreport(report)


# -- fixtures: bodies import on first use -----------------------------------


@pytest.fixture(scope="session")
def mtp_backend(request):
    """The backend under test, guarded: timeouts, validation, named errors."""
    return activate(request.config).guarded_backend(request.config)


@pytest.fixture(scope="session")
def mtp_capabilities(mtp_backend):
    return mtp_backend.capabilities()


@pytest.fixture(scope="session")
def mtp_profile(request):
    from mtpcheck.machinery.harness import PROFILES

    return PROFILES[request.config.getoption("--mtp-profile")]


@pytest.fixture(scope="session")
def mtp_seed(request) -> int:
    return activate(request.config).recorder(request.config).seed


@pytest.fixture(scope="session")
def mtp_fixture(mtp_backend):
    """Fixture prompts as token ids for this backend, by kind."""
    from mtpcheck.fixture import fixture_prompts

    return fixture_prompts(mtp_backend)


@pytest.fixture
def mtp_record(request):
    """Record evidence for the JSON report: mtp_record(key=value, ...). Any test
    may call it: one without a contract marker is recorded under "tests" with
    no clauses (docs/downstream.md)."""
    import json

    from mtpcheck.machinery.report import EVIDENCE_PROPERTY, to_plain

    activate(request.config)

    def record(**evidence):
        # plain JSON text: xdist can send it (numpy scalars it cannot), JUnit shows it as it is
        request.node.user_properties.append((EVIDENCE_PROPERTY, json.dumps(to_plain(evidence))))

    return record
