"""Drafters and the draft block.

Both drafters keep one invariant between rounds: the draft cache holds no
speculative entries; it equals a fresh prefill of a prefix of the committed
tokens, never longer than the target cache. The frontier (what the drafter
has not yet consumed) is caught up lazily at the next `draft`.

Embedded MTP: cache entry i is the head run on (h_i, x_{i+1}), h_i being the
*target's* hidden state at position i. Entries built from the head's own
hidden state (depth >= 2) are speculative and are trimmed after verification.
External assistant: its cache holds committed tokens like the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mtpcheck.contracts import SamplingParams

from .cache import cache_length, trim_cache
from .model import Model
from .sampling import STREAM_DRAFT, process, sample, uniform


@dataclass
class DraftBlock:
    tokens: list[int]  # [k] proposals
    probs: np.ndarray  # [k, V] processed law each proposal was drawn from
    uniforms: list[float]  # [k] draft uniforms used
    position: int  # logical position of tokens[0]


def _draw(logits: mx.array, sp: SamplingParams, history: list[int], seed: int, pos: int):
    q = process(np.array(logits, dtype=np.float64), sp, history)
    u = uniform(seed, STREAM_DRAFT, pos)
    return sample(q, u), q, u


class MtpDrafter:
    kind = "mtp"

    def __init__(self, model: Model):
        if not model.args.mtp_layers:
            raise ValueError("target model has no MTP head")
        self.model = model
        self.cache = model.make_mtp_cache()
        self.hidden: dict[int, mx.array] = {}  # target hidden [D] at committed positions not yet fed

    @property
    def length(self) -> int:
        return cache_length(self.cache)

    def observe(self, start: int, hidden: mx.array) -> None:
        """Target hidden states [L, D] for positions start..start+L-1."""
        for i in range(hidden.shape[0]):
            self.hidden[start + i] = hidden[i]

    def draft(self, history: list[int], target_len: int, k: int, sp: SamplingParams, seed: int) -> DraftBlock:
        # history: committed tokens incl. the pending one at index target_len
        n = target_len
        start = self.length
        # catch up: pairs (h_i, x_{i+1}) for i in start..n-1, one forward
        h = mx.stack([self.hidden[i] for i in range(start, n)])[None]  # [1, L, D]
        nxt = mx.array(history[start + 1 : n + 1])[None]  # [1, L]
        out, logits = self.model.mtp_forward(h, nxt, self.cache)
        self.hidden = {i: v for i, v in self.hidden.items() if i >= n}
        block = DraftBlock([], np.zeros((0, self.model.args.vocab_size)), [], n + 1)
        qs = []
        for s in range(k):
            pos = n + 1 + s
            tok, q, u = _draw(logits[0, -1], sp, history + block.tokens, seed, pos)
            block.tokens.append(tok)
            qs.append(q)
            block.uniforms.append(u)
            if s + 1 < k:  # recurrent reuse of the head: its own hidden + the proposal
                out, logits = self.model.mtp_forward(out[:, -1:], mx.array([[tok]]), self.cache)
        block.probs = np.stack(qs) if qs else block.probs
        return block

    def after_verify(self, target_len_before: int, target_len_after: int, hidden: mx.array) -> None:
        """Drop speculative entries; keep the verified target hidden states."""
        trim_cache(self.cache, min(self.length, target_len_before))
        self.observe(target_len_before, hidden[: target_len_after - target_len_before])

    def state(self) -> list[mx.array]:
        return [a for c in self.cache for a in c.contents()]


class AssistantDrafter:
    kind = "assistant"

    def __init__(self, model: Model):
        self.model = model
        self.cache = model.make_cache()

    @property
    def length(self) -> int:
        return cache_length(self.cache)

    def observe(self, start: int, hidden: mx.array) -> None:
        pass  # the assistant reads tokens, not the target's hidden states

    def draft(self, history: list[int], target_len: int, k: int, sp: SamplingParams, seed: int) -> DraftBlock:
        n = target_len
        _, logits = self.model(mx.array(history[self.length : n + 1])[None], self.cache)
        block = DraftBlock([], np.zeros((0, self.model.args.vocab_size)), [], n + 1)
        qs = []
        for s in range(k):
            tok, q, u = _draw(logits[0, -1], sp, history + block.tokens, seed, n + 1 + s)
            block.tokens.append(tok)
            qs.append(q)
            block.uniforms.append(u)
            if s + 1 < k:
                _, logits = self.model(mx.array([[tok]]), self.cache)
        block.probs = np.stack(qs) if qs else block.probs
        return block

    def after_verify(self, target_len_before: int, target_len_after: int, hidden: mx.array) -> None:
        # entries past target_len_after hold rejected proposals
        trim_cache(self.cache, min(self.length, target_len_after))

    def state(self) -> list[mx.array]:
        return [a for c in self.cache for a in c.contents()]
