"""The mutant zoo (mtpcheck.mutants): every mutant is killed by every clause it
declares, and the correct backend passes those clauses.

Default run: the zoo's shape (cheap), one fast mutant per clause family
(request/report, statistics, greedy, distribution, trace, stop, seed,
scheduler; declared clauses only, the distribution clauses on one sampling
configuration), and a calibration slice (the correct backend, 2 seeds, the
same clauses). The whole zoo (`mtpcheck mutants`, minutes) runs only with
`--run-slow` or MTPCHECK_FULL_ZOO=1.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from mtpcheck.catalogue import load_catalogue, suite_tests
from mtpcheck.mutants import MUTANTS, load_mutant
from mtpcheck.mutants.run import (
    DIST_SELECT,
    SEED_FREE,
    MutantRun,
    backend_args,
    render_markdown,
    run_mutant,
    run_zoo,
    suite_run,
)

# one mutant per clause family, each caught by cheap clauses
FAST = {
    "request/report": "off-block-ignored",
    "statistics": "counts-rejected-tail",
    "greedy": "first-proposal-unverified",
    "distribution": "typical-acceptance",
    "trace": "unnormalised-residual",
    "stop": "stop-checked-per-block",
    "seed": "unseeded-acceptance",
    "independence": "samples-share-the-parent-seed",
    "scheduler": "counts-cancelled-round",
}
FAMILY_MODULES = {
    "request/report": ("test_request.py", "test_report.py"),
    "statistics": ("test_stats.py",),
    "greedy": ("test_greedy.py",),
    "distribution": ("test_distribution.py",),
    "trace": ("test_traces.py",),
    "stop": ("test_stops.py",),
    "seed": ("test_seeds.py",),
    "independence": ("test_independence.py",),
    "scheduler": ("test_scheduler.py",),
}
FAST_SELECT = DIST_SELECT  # the distribution clauses on the `temperature` configuration only
NULL_SEEDS = (1, 2)


def _explain(run: MutantRun) -> str:
    return (f"{run.name} ({run.bug_class}): {run.verdict}; declared {run.declared}, outcomes {run.outcomes}, "
            f"notes {run.notes}, runner error {run.error[-800:]!r}")


# -- the zoo's shape ------------------------------------------------------------------------------


def test_every_bug_class_has_a_mutant():
    classes = {m.bug_class for m in MUTANTS.values()}
    assert {f"B{i:02d}" for i in range(1, 18)} <= classes


def test_declared_clauses_exist_and_every_clause_kills_something():
    """Every clause the zoo's base backend (toy) can run is declared by some mutant;
    clauses needing a capability it lacks (e.g. inspection) are skipped there."""
    from mtpcheck.backends.toy import load_toy
    from mtpcheck.machinery.checks import missing_capabilities

    clauses = load_catalogue().by_id()
    declared = {c for m in MUTANTS.values() for c in m.clauses}
    assert declared <= set(clauses), sorted(declared - set(clauses))
    caps = load_toy().capabilities()
    runnable = {i for i, c in clauses.items() if not missing_capabilities(caps, list(c.requires))}
    assert runnable <= declared, f"clauses no mutant declares: {sorted(runnable - declared)}"
    assert {i for i, c in clauses.items() if c.kind == "statistical"} <= declared
    for m in MUTANTS.values():
        assert m.clauses, f"{m.name} declares no clause"


def test_the_existing_mutants_keep_their_names_and_clauses():
    assert MUTANTS["one-sided-temperature"].clauses == ("DIST-EQUIV", "TRACE-ACCEPT")
    assert MUTANTS["unnormalised-residual"].clauses == ("TRACE-RESIDUAL-BONUS",)
    assert MUTANTS["recurrent-state-not-restored"].clauses == ("GREEDY-EQUIV", "TRACE-ACCEPT")


def test_every_clause_family_has_a_fast_mutant():
    tests = suite_tests()
    for family, modules in FAMILY_MODULES.items():
        clauses = {c for t, ids in tests.items() if t.split("::")[0] in modules for c in ids}
        assert set(MUTANTS[FAST[family]].clauses) & clauses, (family, FAST[family], clauses)


@pytest.mark.parametrize("name", ["argmax-draft", "stale-hidden-state", "assistant-not-rolled-back", "starving-scheduler"])
def test_mutants_apply_to_the_engine_objects(name):
    """A mutant is the reference engine with one object subclassed; it still generates."""
    from mtpcheck.contracts import GenerationRequest, SamplingParams

    backend = load_mutant(name)
    assert backend.engine.name == f"mutant:{name}"
    res = backend.generate(GenerationRequest(prompt_tokens=[3, 1, 4], max_tokens=6, stop_token_ids=[],
                                             sampling=SamplingParams(temperature=1.0, seed=3)))
    assert len(res.tokens) == 6 and res.speculation.used


def test_unknown_mutant_is_named():
    with pytest.raises(ValueError, match="unknown mutant 'nope'; known: .*argmax-draft"):
        load_mutant("nope")


# -- fast subset and calibration slice (subprocesses, in parallel) ----------------------------


@pytest.fixture(scope="module")
def fast_runs(tmp_path_factory):
    """(mutant runs by family, null runs by seed), two pytest processes at a time."""
    work = tmp_path_factory.mktemp("zoo")
    clauses = sorted({c for name in FAST.values() for c in MUTANTS[name].clauses})

    def mutant(family):
        m = MUTANTS[FAST[family]]
        return family, run_mutant(m, list(m.clauses), work, select=FAST_SELECT)

    def null(seed):
        # clauses that use no seed give the same result under every seed: run them under the first only
        cl = clauses if seed == NULL_SEEDS[0] else [c for c in clauses if c not in SEED_FREE]
        code, data, tail, _ = suite_run(backend_args({"acceptance": "rejection", "drafter": "mtp"}), cl,
                                        work / f"null-{seed}.json", seed=seed, select=FAST_SELECT)
        return seed, (code, data, tail)

    with ThreadPoolExecutor(max_workers=2) as pool:
        nulls = [pool.submit(null, s) for s in NULL_SEEDS]
        mutants = [pool.submit(mutant, f) for f in FAST]
        return dict(f.result() for f in mutants), dict(f.result() for f in nulls)


@pytest.mark.parametrize("family", list(FAST))
def test_fast_mutant_is_killed_by_its_declared_clauses(fast_runs, family):
    run = fast_runs[0][family]
    assert run.verdict == "killed", _explain(run)


@pytest.mark.parametrize("seed", NULL_SEEDS)
def test_correct_backend_passes_the_same_clauses(fast_runs, seed):
    code, data, tail = fast_runs[1][seed]
    assert data is not None, tail
    bad = {c: r["notes"] for c, r in data["clauses"].items() if r["outcome"] not in ("passed", "skipped")}
    assert code == 0 and not bad, (bad, tail[-1500:])
    assert sum(r["outcome"] == "passed" for r in data["clauses"].values()) >= 4


def test_kill_matrix_renders_declared_against_actual():
    runs = [MutantRun("a", "B01", "bug a", ["X-ONE"], ["X-ONE", "REQ-BLOCK"], {"X-ONE": "failed", "REQ-BLOCK": "passed"}),
            MutantRun("b", "B02", "bug b", ["X-ONE"], ["X-ONE"], {"X-ONE": "passed"})]
    assert [r.verdict for r in runs] == ["killed", "survived"]
    text = render_markdown(runs, {"profile": "ci", "seed": 1, "base": "toy", "clause_mode": "plausible", "select": "per-mutant",
                                  "jobs": 1, "cpus": 2, "wall_s": 1.0})
    assert "do not edit" in text and "1 of 2 mutants killed" in text and "`b` (survived)" in text


def test_kill_matrix_renders_the_black_box_column():
    white = [MutantRun("a", "B01", "bug a", ["X-ONE"], ["X-ONE"], {"X-ONE": "failed"}),
             MutantRun("b", "B02", "bug b", ["X-ONE"], ["X-ONE"], {"X-ONE": "failed"})]
    black = [MutantRun("a", "B01", "bug a", ["X-ONE"], ["Y-TWO"], {"Y-TWO": "failed", "X-ONE": "skipped"}, black_box=True),
             MutantRun("b", "B02", "bug b", ["X-ONE"], ["X-ONE"], {"X-ONE": "skipped"}, black_box=True,
                       invisible="the output law stays exact")]
    assert [r.black_box_verdict for r in black] == ["killed", "output-invisible"]
    meta = {"profile": "ci", "seed": 1, "base": "toy", "clause_mode": "plausible", "select": "per-mutant",
            "jobs": 1, "cpus": 2, "wall_s": 1.0}
    text = render_markdown(white, meta, black, meta)
    assert "1 of 2 killed black-box" in text and "black-box: killed by" in text
    assert "`b` (output-invisible): the output law stays exact" in text


def test_black_box_mask_withholds_the_white_box_capabilities():
    from mtpcheck.contracts import GenerationRequest, SamplingParams

    backend = load_mutant("argmax-draft", black_box="1")
    caps = backend.capabilities()
    assert not (caps.traces or caps.logprobs or caps.scheduler or caps.lookahead or caps.constraints)
    assert caps.target_distributions and caps.streaming and caps.seeded_determinism
    assert not hasattr(backend, "open_scheduler") and hasattr(backend, "generate_stream")
    res = backend.generate(GenerationRequest(prompt_tokens=[3, 1, 4], max_tokens=6, trace=True,
                                             sampling=SamplingParams(temperature=1.0, seed=3)))
    assert res.trace is None and res.logprobs is None


def test_every_mutant_is_visible_black_box_or_says_why():
    """A bug output alone cannot show is listed with its reason; the rest must be killed black-box."""
    for m in MUTANTS.values():
        assert m.invisible == "" or len(m.invisible) > 20, m.name


# -- the whole zoo ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_full_zoo_every_mutant_killed_as_declared(request, tmp_path):
    if not (request.config.getoption("--run-slow", default=False) or os.environ.get("MTPCHECK_FULL_ZOO") == "1"):
        pytest.skip("the full zoo takes minutes: --run-slow or MTPCHECK_FULL_ZOO=1 (or `mtpcheck mutants`)")
    runs = run_zoo(list(MUTANTS), "plausible", jobs=2, workdir=tmp_path)
    bad = [_explain(r) for r in runs if r.verdict != "killed"]
    assert not bad, "\n".join(bad)


def test_zoo_config_names_match_the_suite_and_select_exactly():
    """dist_select keeps one configuration with pytest -k (substring match): no name may contain another."""
    from mtpcheck.machinery.configs import DIST_CONFIGS as SUITE
    from mtpcheck.mutants.run import DIST_CONFIG, DIST_CONFIGS

    assert DIST_CONFIGS == tuple(SUITE)
    assert not [(a, b) for a in DIST_CONFIGS for b in DIST_CONFIGS if a != b and a in b]
    assert set(DIST_CONFIG.values()) <= set(DIST_CONFIGS)


def test_kill_matrix_renders_the_server_column():
    white = [MutantRun("a", "B12", "bug a", ["X-ONE"], ["X-ONE"], {"X-ONE": "failed"})]
    black = [MutantRun("a", "B12", "bug a", ["X-ONE"], ["X-ONE"], {"X-ONE": "skipped"}, black_box=True,
                       invisible="only requests in flight together share it")]
    server = [MutantRun("a", "B12", "bug a", ["X-ONE"], ["X-ONE"], {"X-ONE": "failed"}, black_box=True, server=True)]
    meta = {"profile": "ci", "seed": 1, "base": "toy", "clause_mode": "plausible", "select": "per-mutant",
            "jobs": 1, "cpus": 2, "wall_s": 1.0}
    text = render_markdown(white, meta, black, meta, server, meta)
    assert "1 of 1 killed by the server mask" in text and "server: killed by" in text
    assert "| X-ONE | killed |" in text


def test_server_visible_mutants_are_killable_by_the_server_mask():
    """A mutant the server mask shows (server_visible) runs with an empty invisibility reason there."""
    from mtpcheck.mutants.run import plausible_clauses

    for name in ("shared-random-stream", "shared-generator-when-concurrent", "draft-logprobs", "zero-logprobs"):
        m = MUTANTS[name]
        assert m.server_visible and m.invisible
        assert {"CONCURRENT-EQUALS-SOLO", "LOGPROBS"} <= set(plausible_clauses(m, True, server=True))
