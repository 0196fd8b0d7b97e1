"""pytest11 entry point: options, markers, fixtures, report. Logic lives in
the library (mtpcheck.harness, mtpcheck.checks, mtpcheck.report).

Must not import mlx at load time: the plugin is loaded by every pytest run in
an environment where mtpcheck is installed. The backend is loaded on first
use, only by runs that hold suite tests.
"""

from __future__ import annotations

import warnings

import pytest

from mtpcheck.report import RunRecorder, match_lines, read_id_file

STASH_BACKEND = pytest.StashKey[object]()
STASH_RECORDER = pytest.StashKey[RunRecorder]()


def pytest_addoption(parser):
    group = parser.getgroup("mtpcheck", "mtpcheck: speculative decoding conformance")
    group.addoption("--mtp-backend", default="mlx",
                    help="backend: a built-in name, an entry point in 'mtpcheck.backends', or package.module:factory (default: mlx)")
    group.addoption("--mtp-backend-option", action="append", default=[], metavar="KEY=VALUE",
                    help="option passed to the backend factory (repeatable)")
    group.addoption("--mtp-profile", default="ci", choices=["ci", "dev", "thorough"],
                    help="sample sizes and hypothesis example counts (default: ci)")
    group.addoption("--mtp-seed", default="1234", help="base seed of the run, or 'random' (default: 1234)")
    group.addoption("--mtp-timeout", type=float, default=120.0, help="per-call backend timeout in seconds (0: none)")
    group.addoption("--mtp-xfails-file", default=None, help="node-id prefixes or clause ids to xfail, '#' comments")
    group.addoption("--mtp-skips-file", default=None, help="node-id prefixes or clause ids to skip, '#' comments")
    group.addoption("--mtp-json", default=None, metavar="PATH", help="write a machine-readable report")
    group.addoption("--mtp-clauses", default=None, metavar="ID,ID",
                    help="run only the suite tests of these clause ids (comma-separated)")


def pytest_configure(config):
    config.addinivalue_line("markers", "contract(clause_id): the catalogue clause this suite test checks")
    config.addinivalue_line("markers", "requires(*capabilities): capabilities needed beyond the clause's own")
    from mtpcheck.backends import UnknownBackendError, parse_options, resolve_factory

    try:  # an unknown backend fails at start-up, in one line
        resolve_factory(config.getoption("--mtp-backend"))
        parse_options(config.getoption("--mtp-backend-option"))
    except UnknownBackendError as exc:
        raise pytest.UsageError(str(exc)) from None
    seed = config.getoption("--mtp-seed")
    if seed == "random":
        import secrets

        seed = str(secrets.randbelow(2**31))
    if not seed.isdigit():
        raise pytest.UsageError(f"--mtp-seed must be an integer or 'random', got {seed!r}")
    recorder = RunRecorder(
        backend=config.getoption("--mtp-backend"),
        options=parse_options(config.getoption("--mtp-backend-option")),
        profile=config.getoption("--mtp-profile"),
        seed=int(seed),
    )
    config.stash[STASH_RECORDER] = recorder
    config.pluginmanager.register(recorder, "mtpcheck-recorder")  # receives pytest_runtest_logreport


def _backend(config):
    """Load the backend once; a load failure is recorded and re-raised per test."""
    if STASH_BACKEND not in config.stash:
        from mtpcheck.backends import load_backend
        from mtpcheck.harness import Guarded

        rec = config.stash[STASH_RECORDER]
        try:
            guarded = Guarded(load_backend(rec.backend, rec.options), timeout=config.getoption("--mtp-timeout") or None)
            rec.capabilities = guarded.capabilities().model_dump()
            config.stash[STASH_BACKEND] = guarded
        except Exception as exc:
            config.stash[STASH_BACKEND] = exc
    value = config.stash[STASH_BACKEND]
    if isinstance(value, Exception):
        raise value
    return value


def _clause_ids(item) -> list[str]:
    return [m.args[0] for m in item.iter_markers("contract") if m.args]


def pytest_collection_modifyitems(session, config, items):
    suite_items = [i for i in items if _clause_ids(i)]
    if not suite_items:
        return
    wanted = config.getoption("--mtp-clauses")
    if wanted:
        from mtpcheck.catalogue import load_catalogue

        ids = {w.strip() for w in wanted.split(",") if w.strip()}
        unknown = sorted(ids - set(load_catalogue().by_id()))
        if unknown:
            raise pytest.UsageError(f"--mtp-clauses: unknown clause ids {unknown}; see `mtpcheck contracts list`")
        keep = [i for i in items if set(_clause_ids(i)) & ids]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
        suite_items = keep
    for item in suite_items:
        item.user_properties.append(("mtp_clauses", _clause_ids(item)))
    for option, marker in (("--mtp-skips-file", "skip"), ("--mtp-xfails-file", "xfail")):
        path = config.getoption(option)
        if not path:
            continue
        entries = read_id_file(path)
        unmatched = match_lines(entries, suite_items, _clause_ids)
        for item, reason in unmatched.pop("__matches__"):
            mark = pytest.mark.skip(reason=reason) if marker == "skip" else pytest.mark.xfail(reason=reason, strict=False)
            item.add_marker(mark)
        for line in unmatched["__unused__"]:
            warnings.warn(f"{option}: line {line!r} matches no collected test", pytest.PytestWarning, stacklevel=1)


def pytest_collection_finish(session):
    if not any(_clause_ids(i) for i in session.items):
        return
    rec = session.config.stash[STASH_RECORDER]
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    try:
        _backend(session.config)
    except Exception as exc:
        if tr:
            tr.write_line(f"mtpcheck: backend {rec.backend!r} failed to load: {type(exc).__name__}: {exc}", red=True)
        return
    if tr:
        for line in rec.header_lines():
            tr.write_line(line)


def pytest_runtest_setup(item):
    ids = _clause_ids(item)
    if not ids:
        return
    from mtpcheck.catalogue import load_catalogue
    from mtpcheck.checks import missing_capabilities

    backend = _backend(item.config)
    clauses = load_catalogue().by_id()
    needed = [c for i in ids if i in clauses for c in clauses[i].requires]
    needed += [c for m in item.iter_markers("requires") for c in m.args]
    missing = missing_capabilities(backend.capabilities(), needed)
    if missing:
        pytest.skip(f"backend lacks capability: {', '.join(missing)}")


def pytest_sessionfinish(session, exitstatus):
    rec = session.config.stash.get(STASH_RECORDER, None)
    path = session.config.getoption("--mtp-json")
    if rec is not None and path:
        rec.write_json(path)


def pytest_unconfigure(config):
    """Close the backend once the run is over: a backend that started processes
    (llama-server) stops them here, not only at interpreter exit."""
    backend = config.stash.get(STASH_BACKEND, None)
    close = getattr(getattr(backend, "backend", None), "close", None)
    if callable(close):
        close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rec = config.stash.get(STASH_RECORDER, None)
    if rec is not None and rec.has_clauses():
        terminalreporter.section("mtpcheck clauses")
        for line in rec.table_lines():
            terminalreporter.write_line(line)


# -- fixtures ----------------------------------------------------------------


@pytest.fixture(scope="session")
def mtp_backend(request):
    """The backend under test, guarded: timeouts, validation, named errors."""
    return _backend(request.config)


@pytest.fixture(scope="session")
def mtp_capabilities(mtp_backend):
    return mtp_backend.capabilities()


@pytest.fixture(scope="session")
def mtp_profile(request):
    from mtpcheck.harness import PROFILES

    return PROFILES[request.config.getoption("--mtp-profile")]


@pytest.fixture(scope="session")
def mtp_seed(request) -> int:
    return request.config.stash[STASH_RECORDER].seed


@pytest.fixture(scope="session")
def mtp_fixture(mtp_backend):
    """Fixture prompts as token ids for this backend, by kind."""
    from mtpcheck.checks import fixture_prompts

    return fixture_prompts(mtp_backend)


@pytest.fixture
def mtp_record(request):
    """Record evidence for the JSON report: mtp_record(key=value, ...)."""

    def record(**evidence):
        request.node.user_properties.append(("mtp_evidence", evidence))

    return record
