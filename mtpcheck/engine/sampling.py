"""Processed distributions and position-addressed randomness.

Pure numpy float64, so that the engine, the law enumerator and the suite use
the very same function. Draft and target go through `process` with the same
SamplingParams (bug class B02 is a one-sided application of it).

Processing order, each step renormalising:
  logit_bias -> penalties -> temperature (0 = greedy) -> top-k -> top-p -> min-p
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

from mtpcheck.contracts import SamplingParams

# Random streams. Independent by construction: the stream id is hashed in.
STREAM_TARGET = 1  # plain samples, corrections, bonus tokens
STREAM_DRAFT = 2  # draft proposals
STREAM_ACCEPT = 3  # acceptance uniforms of the rejection rule


def uniform(seed: int, stream: int, position: int, slot: int = 0) -> float:
    """U[0,1) keyed by (seed, stream, logical position, slot) through blake2b.

    A real hash, not seed+position: additive mixing makes (s, n+1) and (s+1, n)
    collide, so neighbouring seeds would share randomness."""
    digest = hashlib.blake2b(struct.pack("<QQQQ", seed, stream, position, slot), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * (1.0 / (1 << 53))


def sample(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: token i owns [cdf[i-1], cdf[i]), so P(i) = probs[i]
    exactly and a zero-probability token is never drawn."""
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    # side="right" lands on a token with cdf[i] > cdf[i-1]; only rounding of
    # u*total onto the last edge can run past the end.
    return min(i, int(np.flatnonzero(probs > 0)[-1]))


def _counted(history: Sequence[int], width: int) -> tuple[np.ndarray, np.ndarray]:
    ids, counts = np.unique(np.asarray(history, dtype=np.int64), return_counts=True)
    ok = ids < width
    return ids[ok], counts[ok]


def apply_penalties(logits: np.ndarray, sp: SamplingParams, history: Sequence[int],
                    additive_history: Sequence[int] | None = None) -> np.ndarray:
    """Repetition (CTRL-style, on logits) then OpenAI presence/frequency
    penalties; those two count `additive_history` where given (OpenAI's
    sampled tokens only), else `history`."""
    out = logits.copy()
    if sp.logit_bias:
        for tok, bias in sp.logit_bias.items():
            if 0 <= tok < len(out):
                out[tok] += bias
    if history and sp.repetition_penalty and sp.repetition_penalty != 1.0:
        ids, _ = _counted(history, len(out))
        vals = out[ids]
        out[ids] = np.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    additive = history if additive_history is None else additive_history
    if additive and (sp.presence_penalty or sp.frequency_penalty):
        ids, counts = _counted(additive, len(out))
        if sp.presence_penalty:
            out[ids] -= sp.presence_penalty
        if sp.frequency_penalty:
            out[ids] -= sp.frequency_penalty * counts
    return out


def process(logits: np.ndarray, sp: SamplingParams, history: Sequence[int] = (),
            top_k_ties: str = "exactly_k") -> np.ndarray:
    """logits [V] -> processed distribution [V], float64, sums to 1.
    top_k_ties: the declared convention (Capabilities.top_k_ties)."""
    x = np.asarray(logits, dtype=np.float64)
    if sp.logit_bias or sp.speculation_blockers():
        x = apply_penalties(x, sp, history)
    if sp.temperature == 0.0:
        p = np.zeros_like(x)
        p[int(np.argmax(x))] = 1.0  # argmax takes the lowest id on ties
        return p
    z = x / sp.temperature
    p = np.exp(z - np.max(z))
    p /= p.sum()
    if sp.top_k is not None and sp.top_k < len(p):
        order = np.argsort(-p, kind="stable")
        if top_k_ties == "keep_ties":  # a threshold: every token as probable as the k-th survives
            p[p < p[order[sp.top_k - 1]]] = 0.0
        else:  # exactly the k largest; ties at the boundary broken by lower id (stable sort)
            p[order[sp.top_k :]] = 0.0
        p /= p.sum()
    if sp.top_p is not None and sp.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # smallest prefix whose mass reaches top_p (the crossing token is kept)
        keep = int(np.searchsorted(cum, sp.top_p - 1e-12, side="left")) + 1
        p[order[keep:]] = 0.0
        p /= p.sum()
    if sp.min_p is not None and sp.min_p > 0.0:
        p = np.where(p >= sp.min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


def process_rows(logits: np.ndarray, sp: SamplingParams, histories: Sequence[Sequence[int]],
                 top_k_ties: str = "exactly_k") -> np.ndarray:
    """logits [L, V] with one history per row -> processed [L, V]."""
    return np.stack([process(row, sp, h, top_k_ties) for row, h in zip(logits, histories, strict=True)])


def digest(*parts: object) -> str:
    """Short stable digest of sampler/constraint state for traces."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()
