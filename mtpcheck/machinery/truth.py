"""Ground truth checked before it judges.

The statistical and exact clauses judge the speculative path against the
laws an adapter computes (target_distributions, target_logits). An adapter
whose ground truth is wrong (a cache passed under a keyword the library
ignores: every row computed without context) would have the runtime judged
against the wrong law. So before the first such clause runs, the plain path
of the same runtime is held to it: each greedy plain token must be the
argmax of its row, up to the declared near-tie gap. A disagreement is an
adapter error, named as such, never a verdict on the runtime.
"""

from __future__ import annotations

import math

import numpy as np

from mtpcheck.contracts import BackendError, Capabilities, GenerationRequest, SamplingParams
from mtpcheck.laws.precision import precision

PROMPTS, TOKENS = 2, 16  # fixture prompts x greedy plain tokens checked


class GroundTruthError(BackendError):
    """The backend's ground truth disagrees with its own plain path: an adapter error."""


def gap(row: np.ndarray, token: int, logits: bool) -> float:
    """How far `token` lies below the row's top, in nats of logit (inf where it has no mass)."""
    top = float(np.max(row))
    if logits:
        return top - float(row[token])
    return math.inf if row[token] <= 0 else math.log(top / float(row[token]))


def problems(backend, caps: Capabilities, prompts: list[list[int]]) -> list[str]:
    """Positions where a greedy plain token is not the argmax of the backend's
    own ground truth, beyond the precision rule's logit gap; raw logits beyond
    the declared logit_scale (every tolerance is counted in ulps at it)."""
    out, tol, largest = [], precision(caps).logit_gap, 0.0
    for n, prompt in enumerate(prompts[:PROMPTS]):
        plain = backend.generate(GenerationRequest(prompt_tokens=prompt, max_tokens=TOKENS, stop_token_ids=[],
                                                   sampling=SamplingParams(temperature=0.0), speculation=False))
        sources = []
        if caps.target_distributions:
            sources.append(("target_distributions", False, backend.target_distributions(
                prompt, plain.tokens, SamplingParams(temperature=1.0))))
        if caps.raw_logits:
            sources.append(("target_logits", True, backend.target_logits(prompt, plain.tokens)))
        for name, logits, rows in sources:
            if logits and len(plain.tokens):
                z = np.abs(np.asarray(rows, dtype=np.float64))
                largest = max(largest, float(z[np.isfinite(z)].max(initial=0.0)))
            bad = [(i, t) for i, t in enumerate(plain.tokens) if gap(rows[i], t, logits) >= tol]
            if bad:
                i, t = bad[0]
                out.append(f"{name}: prompt {n}, {len(bad)} of {len(plain.tokens)} greedy plain tokens are not its "
                           f"argmax (first: position {i}, plain token {t}, argmax {int(np.argmax(rows[i]))}, "
                           f"{gap(rows[i], t, logits):.3g} nats below it; the precision rule's logit gap "
                           f"{tol:.3g})")
    if largest > caps.logit_scale:
        out.append(f"target_logits reach |logit| {largest:.4g}, beyond the declared logit_scale {caps.logit_scale:g}: "
                   f"the precision rule would count ulps too small; declare logit_scale >= {largest:.4g}")
    return out


def verdict(backend, caps: Capabilities, prompts: list[list[int]]) -> str | None:
    """The adapter error's words, or None when the ground truth agrees with the plain path."""
    found = problems(backend, caps, prompts)
    if not found:
        return None
    return ("adapter error, not a verdict on the runtime: the ground truth disagrees with the runtime's own plain "
            "path (every clause judged against it would judge the wrong law): " + "; ".join(found))
