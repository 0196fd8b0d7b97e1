"""Speculation on vs off, per backend and fixture prompt kind (pytest-benchmark).

Not in the default test run (testpaths = tests): timings belong here. One
test per (backend, prompt kind) loads the backend once and runs the
interleaved sweep of mtpcheck.measurement.bench: each pytest-benchmark round is one
repetition over every arm (speculation off, then on at depths 1-5), after
one unrecorded warmup repetition. pytest-benchmark's statistics are those of
a whole repetition (what --benchmark-compare-fail guards); the figures per
depth - realised and predicted speedup, efficiency, tokens per round,
acceptance by position, draft/target cost ratio c, verification cost v - go
into extra_info, hence into --benchmark-json and saved runs. The gates of
mtpcheck/measurement/bench_gates.toml are applied to every run; a failure names the
figure, the floor and the run.

    pytest benchmarks                                   # measure, gate, print tables
    pytest benchmarks --benchmark-save=baseline         # store a new baseline (benchmarks/baseline/)
    pytest benchmarks --benchmark-compare --benchmark-json=out/bench.json   # gate against it

Environment: MTPCHECK_BENCH_BACKENDS (comma list, default all that load),
MTPCHECK_BENCH_REPS (default 5), MTPCHECK_BENCH_MAX_TOKENS (default 64).
"""

from __future__ import annotations

import os

import pytest

from mtpcheck.machinery.golden import GOLDEN_BACKENDS, load_golden_backend
from mtpcheck.measurement import bench

BACKENDS = list(GOLDEN_BACKENDS)  # mlx (the reference), mlx-lm, mlx-vlm
KINDS = ["structured", "prose"]
DEPTHS = (1, 2, 3, 4, 5)
REPS = int(os.environ.get("MTPCHECK_BENCH_REPS", "5"))
MAX_TOKENS = int(os.environ.get("MTPCHECK_BENCH_MAX_TOKENS", "64"))


@pytest.fixture(scope="module")
def backends():
    loaded: dict[str, tuple] = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_golden_backend(name)
        return loaded[name]

    yield get
    loaded.clear()


@pytest.fixture(scope="module")
def gates():
    return bench.load_gates()


@pytest.fixture(scope="module")
def baseline(baseline_dir):
    return bench.baseline_figures(baseline_dir)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", BACKENDS)
def test_speculation(benchmark, backends, gates, baseline, bench_lines, name, kind, request):
    wanted = [b.strip() for b in os.environ.get("MTPCHECK_BENCH_BACKENDS", "").split(",") if b.strip()]
    if wanted and name not in wanted:
        pytest.skip(f"backend {name!r} not selected (MTPCHECK_BENCH_BACKENDS={','.join(wanted)})")
    backend, reason = backends(name)
    if backend is None:
        pytest.skip(reason)
    from mtpcheck.fixture import PROMPTS

    sweep = bench.Sweep(backend, list(backend.encode(PROMPTS[kind])), DEPTHS, MAX_TOKENS)
    sweep.rep(record=False)  # warmup, not recorded
    benchmark.group = name
    benchmark.extra_info.update(backend=name, kind=kind, depths=list(DEPTHS), reps=REPS, max_tokens=MAX_TOKENS,
                                temperature=0.0, timed="one interleaved repetition: off, on@1..5")
    benchmark.pedantic(sweep.rep, rounds=REPS, iterations=1)

    rows = bench.summarise(sweep.arms)
    benchmark.extra_info.update(bench.extra_info(rows, sweep.arms))
    run = request.node.nodeid
    results = bench.check_gates(name, kind, rows, gates, run)
    results += bench.check_regression(name, kind, rows, baseline.get(request.node.name), gates, run)
    bench_lines += bench.format_table(rows, f"{name} / {kind} ({run})")
    bench_lines += [f"  {g.line()}" for g in results]
    failed = [g for g in results if g.passed is False]
    if failed:
        pytest.fail("\n".join(g.line() for g in failed), pytrace=False)
