"""Benchmark session settings: the baseline storage and the regression gate
come from the repository (benchmarks/baseline/, mtpcheck/measurement/bench_gates.toml)
unless given on the command line; per-run tables and gate lines are printed
at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BASELINE = Path(__file__).resolve().parent / "baseline"
DEFAULT_STORAGE = "file://./.benchmarks"  # pytest-benchmark's own default
LINES = pytest.StashKey[list]()

os.environ.setdefault("MLX_DISABLE_COMPILE", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Before pytest-benchmark reads its options: storage defaults to
    benchmarks/baseline; --benchmark-compare without --benchmark-compare-fail
    takes the gates file's compare_fail."""
    config.stash[LINES] = []
    opt = config.option
    if not hasattr(opt, "benchmark_storage"):
        return
    if opt.benchmark_storage == DEFAULT_STORAGE:
        opt.benchmark_storage = f"file://{BASELINE}"
    if opt.benchmark_compare and not opt.benchmark_compare_fail:
        from pytest_benchmark.utils import parse_compare_fail

        from mtpcheck.measurement.bench import load_gates

        spec = load_gates().get("compare_fail")
        if spec:
            opt.benchmark_compare_fail = [parse_compare_fail(spec)]


@pytest.fixture(scope="session")
def baseline_dir() -> Path:
    return BASELINE


@pytest.fixture(scope="session")
def bench_lines(request) -> list[str]:
    """Lines for the end-of-run summary (tables, gate verdicts)."""
    return request.config.stash[LINES]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(LINES, [])
    if lines:
        terminalreporter.section("mtpcheck speculation benchmarks")
        for line in lines:
            terminalreporter.write_line(line)
