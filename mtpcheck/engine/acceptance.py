"""Acceptance rules as pure functions over float64 probability vectors.

Each rule is two laws plus one decision procedure built from them:
  accept_probability(p, q, d)  P(accept proposal d | p, q)
  correction(p, q, d)          law of the emitted token after rejecting d
  verify(...)                  the decisions of one block, from uniforms

The law enumerator (mtpcheck.laws.exact) composes the first two; the engine
runs the third. Both are lossless: every emitted token ~ p (Leviathan et al.
2023, Chen et al. 2023 for `rejection`; `exact_match` keeps the target's own
positioned sample, so it equals plain decoding under the same seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from .sampling import sample


def rejection_accept_probability(p: np.ndarray, q: np.ndarray, d: int) -> float:
    """min(1, p[d]/q[d]); d was drawn from q so q[d] > 0."""
    return 1.0 if p[d] >= q[d] else float(p[d] / q[d])


def rejection_correction(p: np.ndarray, q: np.ndarray, d: int) -> np.ndarray:
    """(p - q)+ normalised. Its mass is zero only when p == q, where rejection
    has probability zero; return p then so the function stays total."""
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    return r / s if s > 0.0 else p.copy()


def exact_match_accept_probability(p: np.ndarray, q: np.ndarray, d: int) -> float:
    """The target's own sample equals d."""
    return float(p[d])


def exact_match_correction(p: np.ndarray, q: np.ndarray, d: int) -> np.ndarray:
    """The target's own sample, given that it is not d."""
    r = p.copy()
    r[d] = 0.0
    s = r.sum()
    return r / s if s > 0.0 else p.copy()


@dataclass(frozen=True)
class Verdict:
    accepted: int  # proposals accepted, 0..k
    next_token: int  # correction (accepted < k) or bonus (accepted == k)
    next_kind: Literal["correction", "bonus"]
    next_law: np.ndarray  # [V] the law next_token was drawn from with target_uniforms[accepted]


def verify_rejection(
    ps: np.ndarray,  # [k+1, V] processed target laws at each position
    qs: np.ndarray,  # [k, V] processed draft laws the proposals were drawn from
    proposals: list[int],  # [k]
    accept_uniforms: np.ndarray,  # [k]
    target_uniforms: np.ndarray,  # [k+1]
) -> Verdict:
    for j, d in enumerate(proposals):
        if not accept_uniforms[j] < rejection_accept_probability(ps[j], qs[j], d):
            law = rejection_correction(ps[j], qs[j], d)
            return Verdict(j, sample(law, target_uniforms[j]), "correction", law)
    k = len(proposals)
    return Verdict(k, sample(ps[k], target_uniforms[k]), "bonus", ps[k])


def verify_exact_match(
    ps: np.ndarray,
    qs: np.ndarray,
    proposals: list[int],
    accept_uniforms: np.ndarray,
    target_uniforms: np.ndarray,
) -> Verdict:
    """Accept while the proposal equals the target's positioned sample; on a
    mismatch that sample is the correction. q is not consulted."""
    for j, d in enumerate(proposals):
        s = sample(ps[j], target_uniforms[j])
        if s != d:
            return Verdict(j, s, "correction", ps[j])
    k = len(proposals)
    return Verdict(k, sample(ps[k], target_uniforms[k]), "bonus", ps[k])


@dataclass(frozen=True)
class Rule:
    name: str
    accept_probability: callable
    correction: callable
    verify: callable


RULES: dict[str, Rule] = {
    "rejection": Rule("rejection", rejection_accept_probability, rejection_correction, verify_rejection),
    "exact_match": Rule(
        "exact_match", exact_match_accept_probability, exact_match_correction, verify_exact_match
    ),
}


def get_rule(name: str) -> Rule:
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"unknown acceptance rule {name!r}; known: {', '.join(RULES)}") from None
