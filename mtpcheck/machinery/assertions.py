"""Assertions for downstream test suites."""

from __future__ import annotations

from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.laws.stats import SUITE_ALPHA, TestResult, rank_gtest, zero_probability_violations


def assert_lossless(
    backend,
    prompt: list[int],
    sampling: SamplingParams,
    speculation: dict | bool = True,
    runs: int = 100,
    max_tokens: int = 32,
    alpha: float = SUITE_ALPHA,
    seed: int = 0,
) -> TestResult:
    """Generate `runs` seeded completions with speculation on and test that
    every emitted token follows the backend's own processed target law
    (`target_distributions`): a zero-probability token fails at once, then a
    rank-space G-test at `alpha`. Returns the test result (alpha, n, p-value,
    detectable TV) for the caller's report; raises AssertionError otherwise."""
    from mtpcheck.machinery.checks import observations
    from mtpcheck.machinery.harness import Guarded

    guarded = backend if isinstance(backend, Guarded) else Guarded(backend)
    obs, used = [], 0
    for r in range(runs):
        req = GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, speculation=speculation,
                                sampling=sampling.model_copy(update={"seed": seed + r}))
        res = guarded.generate(req)
        used += res.speculation.used
        obs += observations(guarded, prompt, [res], sampling)
    if not used:
        raise AssertionError("speculation was never used: nothing to judge (see the speculation report's reason)")
    bad = zero_probability_violations(obs)
    if bad:
        raise AssertionError(f"{len(bad)} of {len(obs)} emitted tokens have target probability 0")
    result = rank_gtest(obs, alpha=alpha)
    if not result.passed:
        raise AssertionError(f"emitted tokens do not follow the target law: p={result.p_value:.3g} < alpha={alpha:.2g} "
                             f"(n={result.n}, detectable TV {result.detectable_tv})")
    return result
