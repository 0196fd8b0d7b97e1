"""Small helpers shared by suite modules (not fixtures: those live in the plugin)."""

from __future__ import annotations

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams

# Statistical subtests in the whole suite; each gets SUITE_ALPHA / STAT_SUBTESTS
# so that a run's false-failure probability stays <= 1e-6 (Bonferroni).
STAT_SUBTESTS = 8

DIST_CONFIGS = {
    "temperature": SamplingParams(temperature=1.0),
    "top_k": SamplingParams(temperature=0.8, top_k=8),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8),
    "min_p": SamplingParams(temperature=1.2, min_p=0.05),
}


def request(prompt, max_tokens, sp: SamplingParams, spec=None, **kw) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, sampling=sp, speculation=spec, **kw)


def seeded(sp: SamplingParams, seed: int) -> SamplingParams:
    return sp.model_copy(update={"seed": seed})


def spec_for(caps, depth: int | None = None, **kw) -> dict:
    """A speculation block for the backend's first drafter kind at a depth it
    supports. Never builds one the capabilities forbid: a backend that cannot
    speculate skips the calling test, with the reason."""
    from mtpcheck.checks import cannot_speculate

    why = cannot_speculate(caps)
    if why:
        pytest.skip(why)
    d = min(depth or 3, caps.max_depth)
    return {"mode": "native_mtp", "num_draft_tokens": d, **kw}
