"""The DIST clauses' statistics stay bounded in memory at real vocabularies
(docs/benchmarks.md, "The suite's own cost"): what they keep per observation
does not grow with V, and a sample's rows are never all held at once."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mtpcheck.cli import main
from mtpcheck.laws import stats
from mtpcheck.laws.stats import LawSummary, ObservationBatch, pit_ks, rank_gtest, summarise
from mtpcheck.machinery.configs import DIST_CONFIGS
from mtpcheck.measurement.scale import measure_config, zipf_rows

V = 32_000
PEAK_BUDGET_MB = 96  # one generation's rows (48 x V float64) are 12 MB; the sample's 960 rows would be 245 MB
KEPT_PER_OBSERVATION = 256  # bytes; a row of width V is 256 KB


def test_the_statistics_path_at_32k_stays_under_its_memory_budget():
    filtered = measure_config(V, "top_p", runs=20, tokens=48, seed=0)  # the suite's path, a generation at a time
    full = measure_config(V, "temperature", runs=2, tokens=48, seed=1)  # full support: every row sorted whole
    for cost in (filtered, full):
        assert cost.peak_mb < PEAK_BUDGET_MB, cost
        assert cost.kept_kb * 1024 / cost.rows < KEPT_PER_OBSERVATION, cost
        assert cost.gtest_p > 1e-6 and cost.pit_ks_p > 1e-6, cost  # the synthetic tokens follow their laws


def test_summaries_in_blocks_and_pieces_give_the_whole_sample_results(monkeypatch):
    rng = np.random.default_rng(3)
    tokens, laws = zipf_rows(700, 300, DIST_CONFIGS["top_p"], rng)
    whole = ObservationBatch(tokens, laws)
    want_g, want_ks = rank_gtest(whole), pit_ks(whole, rng_seed=2)
    monkeypatch.setattr(stats, "BLOCK_BYTES", 7 * 700 * 8)  # seven rows a block
    pieces = LawSummary.join([summarise(ObservationBatch(tokens[i:i + 48], laws[i:i + 48])) for i in range(0, 300, 48)])
    assert rank_gtest(pieces) == want_g and pit_ks(pieces, rng_seed=2) == want_ks
    assert rank_gtest(list(zip(tokens.tolist(), laws, strict=True))) == want_g


@pytest.mark.parametrize("config", ["temperature", "top_k", "top_p", "min_p"])
def test_synthetic_laws_are_the_configurations_laws(config):
    sp = DIST_CONFIGS[config]
    tokens, laws = zipf_rows(2000, 64, sp, np.random.default_rng(0))
    assert np.allclose(laws.sum(axis=1), 1.0) and np.all(laws[np.arange(64), tokens] > 0)
    support = (laws > 0).sum(axis=1)
    if sp.top_k:
        assert support.max() <= sp.top_k
    if sp.min_p:
        assert np.all(np.where(laws > 0, laws, np.inf).min(axis=1) >= sp.min_p * laws.max(axis=1) * (1 - 1e-12))
    if config == "temperature":
        assert np.all(support == 2000)


def test_bench_scale_writes_its_figures(tmp_path, capsys):
    out = tmp_path / "scale.json"
    assert main(["bench-scale", "--vocab", "64,300", "--configs", "top_k,min_p", "--runs", "2", "--tokens", "8",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["vocab"]) == {"64", "300"} and len(report["configs"]) == 4
    assert "| V | config |" in capsys.readouterr().out
    assert main(["bench-scale", "--configs", "nope"]) == 2
