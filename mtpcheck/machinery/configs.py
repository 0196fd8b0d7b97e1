"""The suite's statistical plan: the sampling configurations the distribution
clauses draw under, the registry of the suite's statistical tests and the
false-failure budget derived from it, the staged tests' constants, and the
small request helpers built on them.

The suite's tests (mtpcheck/suite/) and the research programs that size or
calibrate them (research/ in the checkout: power, profile_power, truncated_power,
context_power, context_exact, calibrate) import them from here, so that a
measurement measures the very tests the suite runs without importing a test
module (docs/architecture.md). Importing this module does not import mlx.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams, SpeculationRequest
from mtpcheck.laws.independence import EMPIRICAL_ALPHA
from mtpcheck.laws.stats import SUITE_ALPHA

# -- the sampling configurations --------------------------------------------------

DIST_CONFIGS = {
    "temperature": SamplingParams(temperature=1.0),
    "top_k": SamplingParams(temperature=0.8, top_k=8),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8),
    "min_p": SamplingParams(temperature=1.2, min_p=0.05),
    # every filter on both sides of T = 1: a processor-order bug (a cut on the temperature-1
    # law, then tempering) shows only where a filter meets T != 1. With top_k at 0.8 and min_p at 1.2
    # above, these make each filter cross both sides; the two top-p ones replace the earlier unfiltered
    # T = 0.7 and 1.3 and carry their tempering (a runtime that refuses top-k or min-p with speculation,
    # as vLLM does, still speculates on them). No name is a substring of another: the zoo selects one
    # configuration with pytest -k
    "topp_cool": SamplingParams(temperature=0.7, top_p=0.8),
    "topp_hot": SamplingParams(temperature=1.3, top_p=0.8),
    "topk_hot": SamplingParams(temperature=1.3, top_k=8),
    "minp_cool": SamplingParams(temperature=0.7, min_p=0.05),
}

# DIST-CONTEXT: the configurations with a filter. A bug that acts through the
# filter (the draft law reported without it) tilts each context's law where
# pooled ranks cancel; without a filter the pooled tests already have power
# (docs/power.md).
CONTEXT_CONFIGS = ("top_k", "top_p", "min_p")

# SEED-STREAMS-INDEPENDENT samples its role laws at these temperatures (a profile may use fewer).
STREAM_TEMPERATURES = (1.0, 1.3)
# UNSEEDED-INDEPENDENT serves unseeded requests together through these calls (capabilities
# concurrent and parallel_samples).
TOGETHER_PATHS = ("generate_batch", "generate_n")
# CONSTRAINT-LANGUAGE tests the law under a constraint on both paths: the plain one locates a mask fault.
CONSTRAINT_PATHS = ("speculative", "plain")

# -- the budget ------------------------------------------------------------------


@dataclass(frozen=True)
class Statistical:
    """One statistical test function of the suite, declared once.

    `params`: the parametrisation ids it is collected under (empty when not
    parametrised); each collected item is one draw of `subtests` tests.
    `share`: "independence" - the clause holds INDEPENDENCE_ALPHA, split
    evenly over all its collected items; "distribution" - each subtest holds
    one DIST_ALPHA, the rest of the run's budget split evenly.
    """

    clause: str
    test: str  # "module.py::function", as pytest collects it under mtpcheck/suite/
    params: tuple[str, ...] = ()
    subtests: int = 1
    share: str = "distribution"

    @property
    def function(self) -> str:
        return self.test.split("::")[1]

    @property
    def items(self) -> tuple[str, ...]:
        """Node ids (relative to mtpcheck/suite/) of the collected items."""
        return tuple(f"{self.test}[{p}]" for p in self.params) or (self.test,)


# Every test of the suite that can fail on a p-value, with the tests it runs.
# tests/test_budget.py collects the suite and fails when a test that calls a
# statistical routine is missing here (or an entry is not collected as
# declared): a new statistical test cannot spend alpha the budget does not hold.
STATISTICAL = (
    Statistical("SEED-INDEPENDENT", "test_independence.py::test_different_seeds_share_no_draws",
                share="independence"),
    Statistical("SEED-SAMPLES-INDEPENDENT", "test_independence.py::test_parallel_samples_share_no_draws",
                share="independence"),
    # one exact permutation test per path that serves unseeded requests together, half each
    Statistical("UNSEEDED-INDEPENDENT", "test_independence.py::test_unseeded_requests_served_together_are_independent",
                TOGETHER_PATHS, share="independence"),
    # two forms x two temperatures, a quarter of the clause's alpha each; the role form runs
    # a rank G-test, two PIT-KS and a test martingale on its quarter
    Statistical("SEED-STREAMS-INDEPENDENT", "test_independence.py::test_draft_randomness_is_independent_of_the_targets",
                tuple(map(str, STREAM_TEMPERATURES)), share="independence"),
    Statistical("SEED-STREAMS-INDEPENDENT", "test_independence.py::test_each_role_follows_its_law",
                tuple(map(str, STREAM_TEMPERATURES)), subtests=4, share="independence"),
    # boundary tokens (a float flip or a tie at a filter boundary) counted against the boundary mass
    Statistical("DIST-ZERO", "test_distribution.py::test_no_token_outside_the_target_support", tuple(DIST_CONFIGS)),
    # rank G-test and PIT-KS per configuration, each in two stages (DIST_STAGE1, DIST_STAGE2)
    Statistical("DIST-EQUIV", "test_distribution.py::test_emitted_tokens_follow_the_target_law",
                tuple(DIST_CONFIGS), subtests=2),
    # one G-test per configuration in three stages (CONTEXT_STAGE_ALPHA)
    Statistical("DIST-CONTEXT", "test_context.py::test_tokens_follow_the_target_law_at_fixed_contexts",
                CONTEXT_CONFIGS),
    Statistical("CONSTRAINT-LANGUAGE", "test_grammar.py::test_constrained_outputs_follow_the_exact_law",
                CONSTRAINT_PATHS),
)

# Alphas spent only after a budgeted test has already failed: they label or
# withhold a failure and cannot make a passing run fail, so they are outside
# the false-failure budget (each with the place that uses it).
AFTER_FAILURE = {
    # DIST-EQUIV names the deviating side: the same requests with speculation off, the same tests.
    # A pinned xfails line turns a wrong label into a failure, so the label keeps the run's level.
    "SIDE_ALPHA": 1e-6,
    # SEED-INDEPENDENT, SEED-SAMPLES-INDEPENDENT: unrelated seeds' coincidences (an empirical
    # null); a rejection there turns the failure into a "not judged" skip, never a failure.
    "EMPIRICAL_ALPHA": EMPIRICAL_ALPHA,
}
SIDE_ALPHA = AFTER_FAILURE["SIDE_ALPHA"]

# The run's false-failure budget SUITE_ALPHA = 1e-6, split by a union bound:
# each independence clause gets INDEPENDENCE_ALPHA (their e-value tests win by
# orders of magnitude when they fire, so a small share costs them little);
# the STAT_SUBTESTS distribution subtests share the rest, DIST_ALPHA each.
INDEPENDENCE_ALPHA = 1e-8
INDEPENDENCE_CLAUSES = tuple(dict.fromkeys(s.clause for s in STATISTICAL if s.share == "independence"))
INDEPENDENCE_TESTS = len(INDEPENDENCE_CLAUSES)
STAT_SUBTESTS = sum(len(s.items) * s.subtests for s in STATISTICAL if s.share == "distribution")
DIST_ALPHA = (SUITE_ALPHA - INDEPENDENCE_TESTS * INDEPENDENCE_ALPHA) / STAT_SUBTESTS


def item_alpha(entry: Statistical) -> float:
    """What one collected item of `entry` may spend, all its subtests together."""
    if entry.share == "distribution":
        return entry.subtests * DIST_ALPHA
    items = sum(len(s.items) for s in STATISTICAL if s.clause == entry.clause)
    return INDEPENDENCE_ALPHA / items


def statistical(test: str) -> Statistical:
    """The registry's entry for the suite test function named `test`."""
    entry = next((s for s in STATISTICAL if s.function == test), None)
    if entry is None:
        raise KeyError(f"{test} is not a registered statistical test (mtpcheck.machinery.configs.STATISTICAL)")
    return entry


def subtest_alpha(test: str) -> float:
    """The alpha of each subtest of the registered suite test function `test`
    (its name): how the suite's statistical tests take their level."""
    entry = statistical(test)
    return item_alpha(entry) / entry.subtests


def budget_total() -> float:
    """The union bound over every collected statistical item of a run."""
    return sum(len(s.items) * item_alpha(s) for s in STATISTICAL)


# -- DIST-EQUIV (mtpcheck/suite/test_distribution.py) -------------------------------

# Escalation on suspicion (docs/statistics.md): each DIST-EQUIV test spends
# its alpha in two stages, DIST_STAGE1 on the profile's sample and DIST_STAGE2
# on that sample grown DIST_ESCALATE-fold, drawn only when a stage-1 p-value
# lands in (DIST_STAGE1, SUSPICIOUS]. Union bound: DIST_STAGE1 + DIST_STAGE2 = DIST_ALPHA.
DIST_STAGE1 = DIST_STAGE2 = subtest_alpha("test_emitted_tokens_follow_the_target_law") / 2
SUSPICIOUS = 1e-3  # a null p-value lands here once in 1,000 tests; a bug near the power limit, often
DIST_ESCALATE = 4

# -- DIST-CONTEXT (mtpcheck/suite/test_context.py) ----------------------------------

# Three stages share one DIST_ALPHA (union bound): the pilot over every prompt,
# the targeted sample, and its escalation when the targeted p-value is suspicious.
CONTEXT_STAGE_ALPHA = subtest_alpha("test_tokens_follow_the_target_law_at_fixed_contexts") / 3
CONTEXT_TARGETS = 2  # prompts the targeted stage concentrates on
CONTEXT_ESCALATE = 2  # the targeted sample is already the suite's largest draw: grown 2-fold, not 4
CONTEXT_PILOT_MIN_EXPECTED = 5.0  # the pilot's per-prompt scores only rank prompts; their p-values are not used

# -- request helpers ----------------------------------------------------------------


def request(prompt, max_tokens, sp: SamplingParams, spec=None, **kw) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, sampling=sp, speculation=spec, **kw)


def without_speculation(req: GenerationRequest) -> GenerationRequest:
    """The same request on the plain path: what names the side of a failure."""
    return req.model_copy(update={"speculation": SpeculationRequest(mode="off")})


def seeded(sp: SamplingParams, seed: int) -> SamplingParams:
    return sp.model_copy(update={"seed": seed})


def spec_for(caps, depth: int | None = None, **kw) -> dict:
    """A speculation block for the backend's first drafter kind at a depth it
    supports. Never builds one the capabilities forbid: a backend that cannot
    speculate skips the calling test, with the reason."""
    from mtpcheck.machinery.checks import cannot_speculate

    why = cannot_speculate(caps)
    if why:
        pytest.skip(why)
    d = min(depth or 3, caps.max_depth)
    if caps.depths and d not in caps.depths:  # a depth fixed at launch: the nearest one below, else the smallest
        d = max([x for x in caps.depths if x <= d] or [min(caps.depths)])
    return {"mode": "native_mtp", "num_draft_tokens": d, **kw}


def skip_unless_depth(caps, depth: int) -> None:
    """Skip a clause that needs requests at exactly `depth` on a backend whose
    depths are fixed at launch (Capabilities.depths) without it."""
    if caps.depths and depth not in caps.depths:
        pytest.skip(f"clause needs depth {depth}; backend serves depths {caps.depths} only (fixed at launch)")


__all__ = [
    "AFTER_FAILURE",
    "CONSTRAINT_PATHS",
    "CONTEXT_CONFIGS",
    "CONTEXT_ESCALATE",
    "CONTEXT_PILOT_MIN_EXPECTED",
    "CONTEXT_STAGE_ALPHA",
    "CONTEXT_TARGETS",
    "DIST_ALPHA",
    "DIST_CONFIGS",
    "DIST_ESCALATE",
    "DIST_STAGE1",
    "DIST_STAGE2",
    "INDEPENDENCE_ALPHA",
    "INDEPENDENCE_CLAUSES",
    "INDEPENDENCE_TESTS",
    "SIDE_ALPHA",
    "STATISTICAL",
    "STAT_SUBTESTS",
    "STREAM_TEMPERATURES",
    "SUSPICIOUS",
    "Statistical",
    "TOGETHER_PATHS",
    "budget_total",
    "item_alpha",
    "request",
    "seeded",
    "skip_unless_depth",
    "spec_for",
    "statistical",
    "subtest_alpha",
    "without_speculation",
]
