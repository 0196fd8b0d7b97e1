"""Ground truth checked before it judges.

The statistical and exact clauses judge the speculative path against the
laws an adapter computes (target_distributions, target_logits). An adapter
whose ground truth is wrong (a cache passed under a keyword the library
ignores: every row computed without context) would have the runtime judged
against the wrong law. So before the first such clause runs, the plain path
of the same runtime is held to it: each greedy plain token must be the
argmax of its row, up to the declared near-tie gap; and each token of a
small seeded plain sample under every filter (top-k, top-p, min-p) must
have probability above 0 in its row, up to the precision rule's filter
margin (a mapped filter the runtime does not apply, or applies otherwise,
leaves the argmax alone and shows only there). The sampled half is exact,
so it spends no alpha; a law wrong by degree (a temperature applied twice)
is left to the statistical clauses, whose side test then reads "both paths".
A disagreement is an adapter error, named as such, never a verdict on the
runtime.
"""

from __future__ import annotations

import math

import numpy as np

from mtpcheck.contracts import BackendError, Capabilities, GenerationRequest, SamplingParams
from mtpcheck.laws.precision import precision

PROMPTS, TOKENS = 2, 16  # fixture prompts x greedy plain tokens checked
SAMPLED = ("top_k", "top_p", "min_p")  # DIST configurations whose filter the sampled half checks
SEEDS = (1, 2)  # seeded plain requests per prompt and configuration


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
    out += sampled_problems(backend, caps, prompts)
    if largest > caps.logit_scale:
        out.append(f"target_logits reach |logit| {largest:.4g}, beyond the declared logit_scale {caps.logit_scale:g}: "
                   f"the precision rule would count ulps too small; declare logit_scale >= {largest:.4g}")
    return out


def below_cut(raw: np.ndarray, law: np.ndarray, token: int) -> float:
    """How far `token` lies below the least probable token `law` keeps, relative,
    in `raw` (the same law with its filters off). Top-k, top-p and min-p keep
    the most probable tokens in any order they are applied, so the cut of the
    runtime's own processing is a probability in `raw`, whatever the contract's
    order; inf for a token outside the vocabulary or of raw probability 0."""
    raw, law = np.asarray(raw, dtype=np.float64), np.asarray(law)
    if not 0 <= token < len(raw) or raw[token] <= 0 or not (law > 0).any():
        return math.inf
    cut = float(raw[law > 0].min())
    return max((cut - float(raw[token])) / cut, 0.0)


def sampled_problems(backend, caps: Capabilities, prompts: list[list[int]]) -> list[str]:
    """Sampled plain tokens the ground truth gives probability 0, beyond the
    precision rule's filter margin (a top-N law: only where its tail is empty)."""
    from mtpcheck.machinery.configs import DIST_CONFIGS

    if not caps.target_distributions:
        return []
    out, tol = [], precision(caps).filter_margin
    for name in SAMPLED:
        if name in caps.unsupported_controls:
            continue
        sp, bad, seen = DIST_CONFIGS[name], [], 0
        raw_sp = sp.model_copy(update={"top_k": None, "top_p": None, "min_p": None})
        for prompt in prompts[:PROMPTS]:
            for seed in SEEDS:
                plain = backend.generate(GenerationRequest(
                    prompt_tokens=prompt, max_tokens=TOKENS, stop_token_ids=[], speculation=False,
                    sampling=sp.model_copy(update={"seed": seed})))
                rows = np.asarray(backend.target_distributions(prompt, plain.tokens, sp), dtype=np.float64)
                seen += len(plain.tokens)
                zeros = [i for i, t in enumerate(plain.tokens) if not 0 <= t < rows.shape[1] or rows[i, t] <= 0
                         and not (caps.truncated_laws and rows[i].sum() < 1.0 - 1e-9)]
                if zeros:
                    raws = backend.target_distributions(prompt, plain.tokens[: zeros[-1] + 1], raw_sp)
                    bad += [(i, plain.tokens[i], m) for i in zeros
                            if (m := below_cut(raws[i], rows[i], plain.tokens[i])) > tol]
        if bad:
            i, t, m = bad[0]
            out.append(f"target_distributions: {len(bad)} of {seen} seeded plain tokens under {name} ({sp.model_dump(exclude_defaults=True)}) "
                       f"have probability 0 in their rows (first: position {i}, token {t}, {m:.3g} below the row's cut; "
                       f"the precision rule's {tol:.3g}): the filters are not mapped as the runtime applies them")
    return out


def verdict(backend, caps: Capabilities, prompts: list[list[int]]) -> str | None:
    """The adapter error's words, or None when the ground truth agrees with the plain path."""
    found = problems(backend, caps, prompts)
    if not found:
        return None
    return ("adapter error, not a verdict on the runtime: the ground truth disagrees with the runtime's own plain "
            "path (every clause judged against it would judge the wrong law): " + "; ".join(found))
