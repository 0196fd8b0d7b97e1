"""CONCURRENT-EQUALS-SOLO: requests served together (capability `concurrent`,
through generate_batch) give what each gives alone.

Black-box: only the tokens are compared. A mix varies what a runtime may
wrongly share between requests in flight - seeds (two requests differ only in
theirs), temperatures and filters, depths, lengths (short requests leave while
long ones run), greedy and plain requests beside speculative ones. A
divergence is triaged as GREEDY-EQUIV and SEED-SPEC-EQUALS-PLAIN triage
theirs: batch composition changes kernel shapes, so a greedy flip at a
near-tie (top-2 logit gap inside the precision rule's, laws.precision) or a
seeded draw within its CDF tolerance of an interval boundary is reported as such; anything else
fails.
"""

from __future__ import annotations

import numpy as np

from mtpcheck.contracts import Capabilities, GenerationRequest, GenerationResult, SamplingParams
from mtpcheck.laws.precision import precision

from .checks import first_divergence, flip_excused, seeded_flip, top2_logit_gap
from .configs import request, spec_for

# (temperature, filter): below, at and above 1, each filter once, and greedy
MIX_SAMPLING = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_k=8),
    SamplingParams(temperature=1.3, top_p=0.9),
    SamplingParams(temperature=1.0, min_p=0.05),
]
MIX_LENGTHS = [24, 6, 16, 10, 20, 4]


def concurrent_mix(caps: Capabilities, prompts: list[list[int]], base_seed: int, n: int = 12) -> list[GenerationRequest]:
    """n requests to serve together. Requests 2k and 2k+1 share prompt,
    controls, depth and length and differ only in their seed; every sixth
    pair runs without speculation."""
    depths = caps.depths or list(range(1, caps.max_depth + 1)) or [1]
    reqs = []
    for i in range(n):
        pair = i // 2
        sp = MIX_SAMPLING[pair % len(MIX_SAMPLING)].model_copy(update={"seed": base_seed + 7919 * i})
        spec = spec_for(caps, depths[pair % len(depths)]) if pair % 6 != 5 else False
        reqs.append(request(prompts[pair % len(prompts)], MIX_LENGTHS[pair % len(MIX_LENGTHS)], sp, spec,
                            stop_token_ids=[]))
    return reqs


def divergence(backend, caps: Capabilities, req: GenerationRequest, alone: GenerationResult,
               together: GenerationResult) -> dict | None:
    """None when `together` emitted the tokens of `alone`; else the evidence:
    position, both tokens, the triage (near-tie / float flip) and `excused`."""
    j = first_divergence(together.tokens, alone.tokens)
    if j is None:
        return None
    sp = req.sampling
    ev = dict(position=j, alone=alone.tokens[j:j + 3], together=together.tokens[j:j + 3], seed=sp.seed,
              temperature=sp.temperature, max_tokens=req.max_tokens, excused=False)
    if j >= min(len(alone.tokens), len(together.tokens)):
        return {**ev, "why": f"length: {len(together.tokens)} tokens together, {len(alone.tokens)} alone, "
                             "equal up to there"}
    if not caps.target_distributions:
        return {**ev, "why": "no target_distributions to triage the divergence with"}
    prompt = list(req.prompt_tokens)
    if sp.temperature == 0:
        law = np.asarray(backend.target_distributions(prompt, alone.tokens[: j + 1], SamplingParams(temperature=1.0))[j])
        gap, tol = top2_logit_gap(law), precision(caps).logit_gap
        ok = gap < tol
        return {**ev, "top2_logit_gap": gap, "logit_gap_tolerance": tol, "excused": ok,
                "why": (f"near-tie: top-2 logit gap {gap:.3g} < the precision rule's {tol:.3g}" if ok else
                        f"greedy, not a near-tie: top-2 logit gap {gap:.4g} nats >= the precision rule's {tol:.3g}")}
    law = np.asarray(backend.target_distributions(prompt, alone.tokens[: j + 1], sp)[j])
    flip = seeded_flip(law, alone.tokens[j], together.tokens[j])
    ok, why = flip_excused(flip, precision(caps).cdf)
    return {**ev, **flip, "excused": ok, "why": f"seeded: {why}"}


__all__ = ["MIX_SAMPLING", "concurrent_mix", "divergence"]
