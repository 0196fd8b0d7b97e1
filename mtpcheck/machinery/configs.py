"""The suite's statistical plan: how the run's false-failure budget is split,
the sampling configurations the distribution clauses draw under, the staged
tests' constants, and the small request helpers built on them.

The suite's tests (mtpcheck/suite/) and the research programs that size or
calibrate them (research/ in the checkout: power, profile_power, truncated_power,
context_power, context_exact, calibrate) import them from here, so that a
measurement measures the very tests the suite runs without importing a test
module (docs/architecture.md). Importing this module does not import mlx.
"""

from __future__ import annotations

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams, SpeculationRequest
from mtpcheck.laws.stats import SUITE_ALPHA

# -- the budget ----------------------------------------------------------------

# The run's false-failure budget SUITE_ALPHA = 1e-6, split by a union bound:
# SEED-INDEPENDENT, SEED-STREAMS-INDEPENDENT and SEED-SAMPLES-INDEPENDENT get INDEPENDENCE_ALPHA each
# (their e-value tests win by orders of magnitude when they fire, so a small
# share costs them little); the STAT_SUBTESTS distribution subtests share the
# rest, DIST_ALPHA each.
INDEPENDENCE_ALPHA = 1e-8
INDEPENDENCE_TESTS = 3  # SEED-INDEPENDENT, SEED-STREAMS-INDEPENDENT, SEED-SAMPLES-INDEPENDENT
# rank G-test and PIT-KS for each of the eight DIST_CONFIGS, DIST-CONTEXT's
# test (three stages sharing one DIST_ALPHA) for each of the CONTEXT_CONFIGS,
# and CONSTRAINT-LANGUAGE's G-tests on the speculative and the plain path
STAT_SUBTESTS = 16 + 3 + 2
DIST_ALPHA = (SUITE_ALPHA - INDEPENDENCE_TESTS * INDEPENDENCE_ALPHA) / STAT_SUBTESTS

# -- the sampling configurations --------------------------------------------------

DIST_CONFIGS = {
    "temperature": SamplingParams(temperature=1.0),
    "top_k": SamplingParams(temperature=0.8, top_k=8),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8),
    "min_p": SamplingParams(temperature=1.2, min_p=0.05),
    # every filter on both sides of T = 1 (issue 23): a processor-order bug (a cut on the temperature-1
    # law, then tempering) shows only where a filter meets T != 1. With top_k at 0.8 and min_p at 1.2
    # above, these make each filter cross both sides; the two top-p ones replace issue 12's unfiltered
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

# -- DIST-EQUIV (mtpcheck/suite/test_distribution.py) -------------------------------

# Escalation on suspicion (docs/statistics.md): each DIST-EQUIV test spends
# its alpha in two stages, DIST_STAGE1 on the profile's sample and DIST_STAGE2
# on that sample grown DIST_ESCALATE-fold, drawn only when a stage-1 p-value
# lands in (DIST_STAGE1, SUSPICIOUS]. Union bound: DIST_STAGE1 + DIST_STAGE2 = DIST_ALPHA.
DIST_STAGE1 = DIST_STAGE2 = DIST_ALPHA / 2
SUSPICIOUS = 1e-3  # a null p-value lands here once in 1,000 tests; a bug near the power limit, often
DIST_ESCALATE = 4

# -- DIST-CONTEXT (mtpcheck/suite/test_context.py) ----------------------------------

# Three stages share one DIST_ALPHA (union bound): the pilot over every prompt,
# the targeted sample, and its escalation when the targeted p-value is suspicious.
CONTEXT_STAGE_ALPHA = DIST_ALPHA / 3
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
    "INDEPENDENCE_TESTS",
    "STAT_SUBTESTS",
    "SUSPICIOUS",
    "request",
    "seeded",
    "skip_unless_depth",
    "spec_for",
    "without_speculation",
]
