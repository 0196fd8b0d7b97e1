"""Small helpers shared by suite modules (not fixtures: those live in the plugin)."""

from __future__ import annotations

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.laws.stats import SUITE_ALPHA

# The run's false-failure budget SUITE_ALPHA = 1e-6, split by a union bound:
# SEED-INDEPENDENT and SEED-STREAMS-INDEPENDENT get INDEPENDENCE_ALPHA each
# (their e-value tests win by orders of magnitude when they fire, so a small
# share costs them little); the STAT_SUBTESTS distribution subtests share the
# rest, DIST_ALPHA each.
INDEPENDENCE_ALPHA = 1e-8
INDEPENDENCE_TESTS = 2
# rank G-test and PIT-KS for each of the six DIST_CONFIGS, and DIST-CONTEXT's
# test (three stages sharing one DIST_ALPHA) for each of the CONTEXT_CONFIGS
STAT_SUBTESTS = 12 + 3
DIST_ALPHA = (SUITE_ALPHA - INDEPENDENCE_TESTS * INDEPENDENCE_ALPHA) / STAT_SUBTESTS

DIST_CONFIGS = {
    "temperature": SamplingParams(temperature=1.0),
    "top_k": SamplingParams(temperature=0.8, top_k=8),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8),
    "min_p": SamplingParams(temperature=1.2, min_p=0.05),
    # temperatures without filters (issue 12): a bug in tempering shows where T != 1
    "temp_0_7": SamplingParams(temperature=0.7),
    "temp_1_3": SamplingParams(temperature=1.3),
}


# DIST-CONTEXT: the configurations with a filter. A bug that acts through the
# filter (the draft law reported without it) tilts each context's law where
# pooled ranks cancel; without a filter the pooled tests already have power
# (docs/power.md).
CONTEXT_CONFIGS = ("top_k", "top_p", "min_p")


def request(prompt, max_tokens, sp: SamplingParams, spec=None, **kw) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, sampling=sp, speculation=spec, **kw)


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
