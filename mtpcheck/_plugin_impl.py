"""The plugin's hooks, registered by mtpcheck.plugin only in a session that
uses mtpcheck (an --mtp-* option, the suite among the test paths, or a
collected test with a contract marker or an mtp_* fixture). Logic lives in
the library (mtpcheck.machinery.harness, mtpcheck.machinery.checks,
mtpcheck.machinery.report).

Must not import mlx at load time: the backend is loaded on first use, only by
runs that hold suite tests.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from mtpcheck.machinery.report import (
    BROKEN_PROPERTY,
    CAPABILITIES_PROPERTY,
    CLAUSE_PROPERTY,
    EVIDENCE_PROPERTY,
    EXERCISE_PROPERTY,
    MARGIN_PROPERTY,
    REDRAW_PROPERTY,
    XFAIL_SECTION,
    XPASS_PIN_PROPERTY,
    RunRecorder,
    is_clause_failure,
    match_lines,
    side_of,
    to_plain,
)

STASH_BACKEND = pytest.StashKey[object]()
STASH_XFAIL_LINE = pytest.StashKey[str]()
STASH_XFAIL_SIDE = pytest.StashKey[str]()  # the side the matching xfails line documents (side=...)
STASH_XFAIL_UNEXERCISED = pytest.StashKey[bool]()  # the matching line documents unexercised speculation
# the raises= lines that apply: (no deviation line beside them, {exception class name: reason})
STASH_XFAIL_RAISES = pytest.StashKey[tuple]()
STASH_RECORDER = pytest.StashKey[RunRecorder]()
STASH_SETTINGS = pytest.StashKey[dict]()
STASH_CAPS_SENT = pytest.StashKey[bool]()
# loading a real checkpoint takes minutes where one call takes seconds: the
# factory gets its own, longer limit (a hang is still named, not waited on)
LOAD_TIMEOUT = 600.0
# options whose value is a path: pytest counts one given space-separated among
# the test paths when it chooses the rootdir (_warn_on_moved_rootdir)
PATH_OPTIONS = ("--mtp-json", "--mtp-markdown", "--mtp-xfails-file", "--mtp-skips-file")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # an xdist worker: the controller reports


def pytest_configure(config):
    from mtpcheck.backends import UnknownBackendError, parse_options, resolve_factory
    from mtpcheck.machinery.settings import (
        SettingsError,
        check_backend_options,
        check_id_file,
        check_seed,
        check_timeout,
        check_writable,
    )

    try:  # bad settings fail at start-up, each in one line (exit 4)
        name = config.getoption("--mtp-backend")
        options = parse_options(config.getoption("--mtp-backend-option"))
        check_backend_options(name, resolve_factory(name), options)
        timeout = check_timeout(config.getoption("--mtp-timeout"))
        load = config.getoption("--mtp-load-timeout")
        load_timeout = check_timeout(load, "--mtp-load-timeout") if load is not None else (
            max(timeout, LOAD_TIMEOUT) if timeout else None)
        seed = check_seed(config.getoption("--mtp-seed")) if not _is_worker(config) else None
        for option in ("--mtp-json", "--mtp-markdown"):
            check_writable(config.getoption(option), option)
        id_files = {o: check_id_file(config.getoption(o), o) for o in ("--mtp-skips-file", "--mtp-xfails-file")}
        if any(e.rules for e in id_files["--mtp-xfails-file"] or ()):
            from mtpcheck.catalogue import load_catalogue

            unknown = sorted({e.rules for e in id_files["--mtp-xfails-file"]} - {None} - set(load_catalogue().by_id()))
            if unknown:
                raise SettingsError(f"--mtp-xfails-file: rules= names unknown clause ids {unknown}")
        if config.getoption("--mtp-clauses"):
            from mtpcheck.catalogue import load_catalogue

            ids = {w.strip() for w in config.getoption("--mtp-clauses").split(",") if w.strip()}
            unknown = sorted(ids - set(load_catalogue().by_id()))
            if unknown:
                raise SettingsError(f"--mtp-clauses: unknown clause ids {unknown}; see `mtpcheck contracts list`")
    except (UnknownBackendError, SettingsError) as exc:
        raise pytest.UsageError(str(exc)) from None
    if seed is None:  # xdist workers take the controller's seed ('random' is drawn once)
        seed = config.workerinput.get("mtpcheck_seed")
    if seed is None:  # a controller that started without mtpcheck: no --mtp-* option, so no 'random' seed
        seed = check_seed(config.getoption("--mtp-seed"))
    recorder = RunRecorder(backend=name, options=options, profile=config.getoption("--mtp-profile"), seed=seed)
    if config.getoption("--mtp-json") and not _is_worker(config):
        recorder.sink = Path(config.getoption("--mtp-json"))
    _excused_clauses(recorder, id_files)
    config.stash[STASH_RECORDER] = recorder
    config.stash[STASH_SETTINGS] = {"timeout": timeout, "load_timeout": load_timeout, "id_files": id_files}
    config.pluginmanager.register(recorder, "mtpcheck-recorder")  # receives pytest_runtest_logreport
    if not _is_worker(config):
        _warn_on_moved_rootdir(config)


def _excused_clauses(recorder, id_files: dict) -> None:
    """Clause ids listed whole in the xfails or skips file also cover their
    rules broken by results of other clauses' tests (xfailed, or not recorded)."""
    if not any(id_files.values()):
        return
    from mtpcheck.catalogue import load_catalogue

    ids = set(load_catalogue().by_id())
    xfails = id_files["--mtp-xfails-file"] or ()
    recorder.xfailed_clauses = {e.entry: e.reason for e in xfails if e.entry in ids and not e.rules}
    recorder.xfailed_rules = [(e.entry, e.rules, e.reason) for e in xfails if e.rules]
    recorder.skipped_clauses = {e.entry for e in id_files["--mtp-skips-file"] or () if e.entry in ids}


def _warn_on_moved_rootdir(config) -> None:
    """pytest chooses the rootdir and ini file before it loads any plugin, so
    the PATH of a space-separated `--mtp-json PATH` that exists (an earlier
    run's report) counts as a test path in that choice and can move them.
    No hook runs before that choice and the rootdir has no public setter, so
    the plugin names the `--mtp-json=PATH` form rather than fixing it up."""
    args = [str(a) for a in config.invocation_params.args]
    here = config.invocation_params.dir
    counted = [(flag, value) for flag, value in zip(args, args[1:], strict=False)
               if flag in PATH_OPTIONS and not value.startswith("-") and (here / value).exists()]
    if not counted:
        return
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    positional = [str(a).split("::")[0] for a in config.args] if explicit else []

    def ancestor(paths: list[str]) -> Path:
        dirs = [p if p.is_dir() else p.parent for p in (here / a for a in paths) if p.exists()]
        return Path(os.path.commonpath(dirs)) if dirs else here

    without = ancestor(positional)  # where pytest's search starts without those paths
    if config.inipath is not None:  # found from the ancestor upwards: moved if it is not above `without`
        moved = config.inipath.parent not in (without, *without.parents)
    else:  # no ini file: pytest falls back to the common folder of the invocation folder and the ancestor
        moved = config.rootpath != Path(os.path.commonpath([here, without]))
    if not moved:
        return
    config.issue_config_time_warning(pytest.PytestConfigWarning(
        f"pytest chose the rootdir {config.rootpath} counting {', '.join(v for _, v in counted)} as a test path, "
        f"before it knew mtpcheck's options: write {', '.join(f'{f}={v}' for f, v in counted)} to keep the "
        "rootdir (and the ini file, node ids and cache folder that follow from it)"), stacklevel=2)


# -- xdist: workers run and send their reports; the controller records and writes


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["mtpcheck_seed"] = node.config.stash[STASH_RECORDER].seed


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """A worker died in native code: its test is named crashed; xdist starts a
    fresh worker (a fresh backend process) for the rest of the run."""
    rec = report.node.config.stash.get(STASH_RECORDER, None) if hasattr(report, "node") else None
    if rec is not None:
        rec.note_crash(crashitem)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    rec = node.config.stash.get(STASH_RECORDER, None)
    data = getattr(node, "workeroutput", {}).get("mtpcheck")
    if rec is not None and data:
        rec.merge_worker(data)


def recorder(config) -> RunRecorder:
    return config.stash[STASH_RECORDER]


def guarded_backend(config):
    """Load the backend once; a load failure is recorded and re-raised per test."""
    if STASH_BACKEND not in config.stash:
        from mtpcheck.backends import load_backend
        from mtpcheck.machinery.harness import Guarded, call_with_timeout

        rec, timeout = config.stash[STASH_RECORDER], config.stash[STASH_SETTINGS]["timeout"]
        try:  # a factory that hangs hits the timeout too
            backend = call_with_timeout(load_backend, rec.backend, rec.options,
                                        timeout=config.stash[STASH_SETTINGS]["load_timeout"],
                                        what=f"the factory of backend {rec.backend!r}")
            guarded = Guarded(backend, timeout=timeout)
            rec.capabilities = guarded.capabilities().model_dump(mode="json")
            config.stash[STASH_BACKEND] = guarded
        except Exception as exc:
            rec.backend_error = f"{type(exc).__name__}: {exc}"
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
    # the files first, over every suite test: a line naming a test that --mtp-clauses
    # then deselects is not a stale line
    strict = config.getoption("--mtp-xfails-strict")
    for option, marker in (("--mtp-skips-file", "skip"), ("--mtp-xfails-file", "xfail")):
        entries = config.stash[STASH_SETTINGS]["id_files"][option]
        if not entries:
            continue
        # a rules= line covers broken result rules only (its records), never the tests it names
        unmatched = match_lines([e for e in entries if not e.rules and not e.raises], suite_items, _clause_ids)
        unmatched["__unused__"] += [e.entry for e in entries if e.rules
                                    and not match_lines([e], suite_items, lambda _: ())["__matches__"]]
        # a raises= line applies beside a test's deviation line: which of the two shows can depend on state
        # the suite does not choose (a server's prompt cache); a test may have several, one per exception
        crashes = match_lines([e for e in entries if e.raises], suite_items, _clause_ids, every=True)
        unmatched["__unused__"] += crashes["__unused__"]
        for item, line in unmatched.pop("__matches__"):
            if marker == "skip":
                item.add_marker(pytest.mark.skip(reason=line.reason))
            else:
                item.add_marker(pytest.mark.xfail(reason=line.reason, strict=strict))
                item.stash[STASH_XFAIL_LINE] = line.entry
                if line.side:
                    item.stash[STASH_XFAIL_SIDE] = line.side
                item.stash[STASH_XFAIL_UNEXERCISED] = line.unexercised
        for item, line in crashes["__matches__"]:
            if marker == "skip":
                item.add_marker(pytest.mark.skip(reason=line.reason))
                continue
            alone, raises = item.stash.get(STASH_XFAIL_RAISES, (STASH_XFAIL_LINE not in item.stash, {}))
            if alone and not raises:
                item.add_marker(pytest.mark.xfail(reason=line.reason, strict=strict))
                item.stash[STASH_XFAIL_LINE] = line.entry
            raises.setdefault(line.raises, line.reason)
            item.stash[STASH_XFAIL_RAISES] = (alone, raises)
        for line in unmatched["__unused__"]:
            shadowed = match_lines([(line, "")], suite_items, _clause_ids)["__matches__"]
            warnings.warn(f"{option}: line {line!r} " + ("names only tests an earlier line names: the first line that "
                          "names a test applies" if shadowed else "matches no collected test"),
                          pytest.PytestWarning, stacklevel=1)
    wanted = config.getoption("--mtp-clauses")
    if wanted:
        ids = {w.strip() for w in wanted.split(",") if w.strip()}
        keep = [i for i in items if set(_clause_ids(i)) & ids]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
        suite_items = keep
    for item in suite_items:  # plain strings: JUnit XML shows <property name="clause" value="DIST-EQUIV"/>
        item.user_properties.extend((CLAUSE_PROPERTY, cid) for cid in _clause_ids(item))


def pytest_collection_finish(session):
    rec = session.config.stash[STASH_RECORDER]
    rec.note_collected(session.items)  # after every deselection (-k, --mtp-clauses)
    if not any(_clause_ids(i) for i in session.items):
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    try:
        guarded_backend(session.config)
    except Exception as exc:
        if tr:
            tr.write_line(f"mtpcheck: backend {rec.backend!r} failed to load: {type(exc).__name__}: {exc}", red=True)
        return
    if tr:
        for line in rec.header_lines():
            tr.write_line(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """An xfails line documents a failure of its clause's check: a test that
    raised anything else (the backend raised, hung, returned garbage) is
    reported as what it is, and the line is named as not covering it."""
    outcome = yield
    line = item.stash.get(STASH_XFAIL_LINE, None)
    rep = outcome.get_result()
    _send_broken_rules(item, rep)
    if line is not None and rep.when == "call" and hasattr(rep, "wasxfail") and rep.passed and (
            item.stash.get(STASH_XFAIL_UNEXERCISED, False) or item.stash.get(STASH_XFAIL_RAISES, (False,))[0]):
        rep.user_properties.append((XPASS_PIN_PROPERTY, line))
    if line is None or not (hasattr(rep, "wasxfail") and rep.skipped) or call.excinfo is None:
        return
    exc = call.excinfo.value
    unexercised = item.stash.get(STASH_XFAIL_UNEXERCISED, False)
    alone, raises = item.stash.get(STASH_XFAIL_RAISES, (False, {}))
    if raises:
        from mtpcheck.contracts.errors import BackendError

        raised = [type(e).__name__ for e in (exc, exc.__cause__) if e is not None]
        covering = next((r for r in raises if r in raised), None) if isinstance(exc, BackendError) else None
        if covering:
            rep.wasxfail = raises[covering]
            return
    if alone:
        why = (f"xfails line {line!r} documents the backend raising {' or '.join(raises)} (raises=), this test "
               + ("failed the clause's check:" if is_clause_failure(exc) else f"raised {' from '.join(raised)}:"))
    elif type(exc).__name__ == "NotExercised" or unexercised:
        if type(exc).__name__ == "NotExercised" and unexercised:
            return
        why = (f"xfails line {line!r} documents unexercised speculation (exercise=none), the clause's check failed:"
               if unexercised else f"xfails line {line!r} covers a failure of the clause's check; speculation was "
                                   "not exercised, which only a line pinned exercise=none documents:")
    elif not is_clause_failure(exc):
        why = f"xfails line {line!r} covers a failure of the clause's check, this test raised {type(exc).__name__}:"
    else:
        pinned = item.stash.get(STASH_XFAIL_SIDE, None)
        found = _failure_side(item)
        if pinned is None or found == pinned:
            return
        why = (f"deviating side {found or 'not named by the clause'}, the xfails line documents side={pinned} "
               f"({line!r}):")
    rep.outcome = "failed"
    del rep.wasxfail
    rep.sections.append((XFAIL_SECTION, f"not the documented deviation: {why}"))


def _send_broken_rules(item, rep) -> None:
    """The broken result rules found in this phase go with its report (so an
    xdist worker sends them): the recorder files them under their own clauses."""
    backend = item.config.stash.get(STASH_BACKEND, None)
    found = getattr(backend, "violations", None)
    if found:
        rep.user_properties.extend((BROKEN_PROPERTY, json.dumps(to_plain(v))) for v in found)
        found.clear()


def _failure_side(item) -> str | None:
    return side_of([json.loads(v) for k, v in item.user_properties if k == EVIDENCE_PROPERTY])


def pytest_runtest_setup(item):
    __tracebackhide__ = True
    ids = _clause_ids(item)
    if not ids:
        return
    from mtpcheck.catalogue import load_catalogue
    from mtpcheck.machinery.checks import missing_capabilities, skip_reason

    backend = guarded_backend(item.config)
    # before the fixtures: a shared sample counts for the test that draws it; the test judges its clauses' rules
    backend.start_tally(ids)
    if _is_worker(item.config) and not item.config.stash.get(STASH_CAPS_SENT, False):
        # with the first report, not only at the end: an interrupted worker's end never reaches the controller
        item.config.stash[STASH_CAPS_SENT] = True
        item.user_properties.append((CAPABILITIES_PROPERTY, json.dumps(item.config.stash[STASH_RECORDER].capabilities)))
    clauses = load_catalogue().by_id()
    needed = [c for i in ids if i in clauses for c in clauses[i].requires]
    needed += [c for m in item.iter_markers("requires") for c in m.args]
    missing = missing_capabilities(backend.capabilities(), needed)
    if missing:
        pytest.skip(skip_reason(backend.capabilities(), missing))
    caps = backend.capabilities()
    if (caps.target_distributions or caps.raw_logits) and ("target_distributions" in needed or set(ids) & TRUTH_READERS):
        _check_ground_truth(item.config, backend)


# clauses that read the ground truth without requiring target_distributions (gaps, raw logits)
TRUTH_READERS = {"CTRL-CONTRACT", "GREEDY-EQUIV"}
STASH_TRUTH = pytest.StashKey[object]()


def _check_ground_truth(config, backend) -> None:
    """Once per process, before the first clause that judges against the
    backend's ground truth: its plain path held to it (machinery.truth). A call
    of the check that raises is the test's error and is tried again by the next."""
    __tracebackhide__ = True
    from mtpcheck.machinery.truth import GroundTruthError, verdict

    if STASH_TRUTH not in config.stash:
        from mtpcheck.fixture import fixture_prompts

        config.stash[STASH_TRUTH] = verdict(backend, backend.capabilities(), list(fixture_prompts(backend).values()))
    if config.stash[STASH_TRUTH]:
        raise GroundTruthError(config.stash[STASH_TRUTH])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that passed on speculative results holding no accepted (or, for
    a rule about rejections, no rejected) proposal judged nothing of
    speculation: it fails, named, unless every such request was declared
    unaccelerated (then it skips, naming the control)."""
    __tracebackhide__ = True
    ids = _clause_ids(item)
    if not ids:
        return (yield)
    backend = item.config.stash.get(STASH_BACKEND, None)
    tally = getattr(backend, "tally", None)
    try:
        result = yield
    finally:
        counts = tally.as_dict() if tally is not None else None
        if counts and counts["requests"]:
            item.user_properties.append((EXERCISE_PROPERTY, json.dumps(counts)))
    if counts:
        from mtpcheck.catalogue import load_catalogue
        from mtpcheck.machinery.exercise import NotExercised, margin_of, verdict

        marker = item.get_closest_marker("exercise")
        clauses = load_catalogue().by_id()
        needs = list(marker.args) if marker else sorted({n for i in ids if i in clauses for n in clauses[i].exercise})
        found = verdict(counts, needs)
        if found and found[0] == "fail" and _takes_seed(item) and not item.stash.get(STASH_XFAIL_UNEXERCISED, False):
            counts, found = _redraw(item, backend, counts, found, needs)
        if found and found[0] == "skip":
            pytest.skip(found[1])
        if found:
            raise NotExercised(found[1])
        margin = margin_of(counts, needs)
        if margin:
            item.user_properties.append((MARGIN_PROPERTY, json.dumps(margin)))
    return result


def _takes_seed(item) -> bool:
    """The test function asks for mtp_seed itself: a fixture built on the seed is not drawn again."""
    import inspect

    fn = getattr(item, "function", None)
    return fn is not None and "mtp_seed" in inspect.signature(fn).parameters and "mtp_seed" in item.funcargs


def _redraw(item, backend, counts: dict, found: tuple, needs: list[str]) -> tuple[dict, tuple | None]:
    """A seeded test that passed on a sample holding nothing of what it needs
    is drawn once more at a moved base seed, and only the redrawn sample is
    judged: its check, then its exercise. A redraw follows what would be a
    failure, so it can turn one into a verdict but never fail a passing run;
    a dead drafter holds nothing at either seed. The first sample's counts
    and evidence go to the report (`exercise_redraw`)."""
    __tracebackhide__ = True
    from mtpcheck.machinery.exercise import Tally, redraw_seed, verdict

    seed = item.funcargs["mtp_seed"]
    first = [p for p in item.user_properties if p[0] in (EVIDENCE_PROPERTY, EXERCISE_PROPERTY)]
    item.user_properties[:] = [p for p in item.user_properties if p[0] not in (EVIDENCE_PROPERTY, EXERCISE_PROPERTY)]
    moved = redraw_seed(seed)
    item.user_properties.append((REDRAW_PROPERTY, json.dumps({
        "seed": seed, "redraw_seed": moved, "exercise": counts, "message": found[1],
        "evidence": [json.loads(v) for k, v in first if k == EVIDENCE_PROPERTY]})))
    backend.tally = Tally()  # the violations found so far stay: they are results the runtime returned
    item.funcargs["mtp_seed"] = moved
    try:
        item.runtest()
    finally:
        item.funcargs["mtp_seed"] = seed
        counts = backend.tally.as_dict()
        item.user_properties.append((EXERCISE_PROPERTY, json.dumps(counts)))
    again = verdict(counts, needs)
    if again and again[0] == "fail":
        again = ("fail", f"{again[1]}, drawn again at base seed {moved}; at seed {seed}: {found[1]}")
    return counts, again


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    rec = config.stash.get(STASH_RECORDER, None)
    if rec is None:
        return
    if _is_worker(config):  # the controller merges this and writes the one report
        config.workeroutput["mtpcheck"] = to_plain(rec.worker_output())
        return
    if rec.broken_failures() and exitstatus == 0:  # every test passed its own check; a clause failed
        exitstatus = session.exitstatus = pytest.ExitCode.TESTS_FAILED
    rec.finish(exitstatus, session.shouldfail or session.shouldstop)
    for option, write in (("--mtp-json", rec.write_json), ("--mtp-markdown", rec.write_markdown)):
        if config.getoption(option):
            write(config.getoption(option))


def pytest_unconfigure(config):
    """Close the backend once the run is over: a backend that started processes
    (llama-server) stops them here, not only at interpreter exit."""
    backend = config.stash.get(STASH_BACKEND, None)
    close = getattr(getattr(backend, "backend", None), "close", None)
    if callable(close):
        close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rec = config.stash.get(STASH_RECORDER, None)
    if rec is not None and rec.has_clauses() and not _is_worker(config):
        terminalreporter.section("mtpcheck clauses")
        if config.pluginmanager.hasplugin("dsession"):  # xdist: the workers' header lines were not shown
            for line in rec.header_lines():
                terminalreporter.write_line(line)
        for line in rec.table_lines() + rec.closing_lines(config.getoption("--mtp-json"),
                                                         config.getoption("--mtp-markdown")):
            terminalreporter.write_line(line)


