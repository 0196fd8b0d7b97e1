"""Exact law enumeration and statistical tests of losslessness.

`exact`: laws of speculative decoding on toy models, compared with the
target law in float64. `stats`: G-test in rank space, randomized PIT + KS,
power and the suite's alpha budget. Neither imports mlx.
"""

from .exact import (
    Law,
    RuleLike,
    ToyModel,
    acceptance_probability,
    block_law,
    distribution_pairs,
    distributions,
    max_law_error,
    rule_law_problems,
    stream_law,
    stream_law_error,
    target_law,
    toy_models,
    verify_law,
    verify_law_error,
)
from .stats import (
    SUITE_ALPHA,
    Observation,
    ObservationBatch,
    TestResult,
    alpha_for,
    bonferroni,
    detectable_tv,
    observations,
    pit_ks,
    rank_gtest,
    samples_for_tv,
    zero_probability_violations,
)

__all__ = [
    "SUITE_ALPHA",
    "Law",
    "Observation",
    "ObservationBatch",
    "RuleLike",
    "TestResult",
    "ToyModel",
    "acceptance_probability",
    "alpha_for",
    "block_law",
    "bonferroni",
    "detectable_tv",
    "distribution_pairs",
    "distributions",
    "max_law_error",
    "rule_law_problems",
    "observations",
    "pit_ks",
    "rank_gtest",
    "samples_for_tv",
    "stream_law",
    "stream_law_error",
    "target_law",
    "toy_models",
    "verify_law",
    "verify_law_error",
    "zero_probability_violations",
]
