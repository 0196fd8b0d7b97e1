"""Drafters and the draft block.

Both drafters keep one invariant between rounds: the draft cache holds no
speculative entries; it equals a fresh prefill of a prefix of the committed
tokens, never longer than the target cache. The frontier (what the drafter
has not yet consumed) is caught up lazily at the next `draft`.

Embedded MTP: cache entry i is the head run on (h_i, x_{i+1}), h_i being the
*target's* hidden state at position i. Entries built from the head's own
hidden state (depth >= 2) are speculative and are trimmed after verification.
External assistant: its cache holds committed tokens like the target's. It
can be cloned, so that a lookahead branch is drafted from a copy and its
frontier kept for reuse (seed 000); after the prompt it consumes one token
per forward, so a branch drafted ahead and the normal path compute every
distribution with the same sequence of forwards, bit for bit.

Drafting under a constraint masks each draw at its exact history and stops
before a proposal would cross a grammar-complete boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mtpcheck.contracts import SamplingParams

from .cache import KVCache, RecurrentCache, cache_length, trim_cache
from .constraints import FREE, Cursor, masked
from .model import Model
from .sampling import STREAM_DRAFT, process, sample, uniform


@dataclass
class DraftBlock:
    tokens: list[int]  # [k] proposals
    probs: np.ndarray  # [k, V] processed law each proposal was drawn from
    uniforms: list[float]  # [k] draft uniforms used
    position: int  # logical position of tokens[0]
    frontier: object | None = None  # the assistant that drafted it, fed up to tokens[-2]

    @classmethod
    def empty(cls, position: int, vocab: int) -> DraftBlock:
        return cls([], np.zeros((0, vocab)), [], position)

    def append(self, tok: int, q: np.ndarray, u: float) -> None:
        self.tokens.append(tok)
        self.probs = np.concatenate([self.probs, q[None]])
        self.uniforms.append(u)

    def head(self, k: int) -> DraftBlock:
        """The first k proposals (same position, same frontier)."""
        return DraftBlock(self.tokens[:k], self.probs[:k], self.uniforms[:k], self.position, self.frontier)


def _draw(logits: mx.array, sp: SamplingParams, history: list[int], seed: int, pos: int, cursor: Cursor):
    q = process(masked(np.array(logits, dtype=np.float64), cursor.mask), sp, history)
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

    def draw(self, logits, sp: SamplingParams, history: list[int], seed: int, pos: int, cursor: Cursor):
        """One proposal: (token, processed law q, uniform); a seam that mtpcheck.mutants overrides."""
        return _draw(logits, sp, history, seed, pos, cursor)

    def observe(self, start: int, hidden: mx.array) -> None:
        """Target hidden states [L, D] for positions start..start+L-1."""
        for i in range(hidden.shape[0]):
            self.hidden[start + i] = hidden[i]

    def draft(self, history: list[int], target_len: int, k: int, sp: SamplingParams, seed: int,
              cursor: Cursor = FREE) -> DraftBlock:
        # history: committed tokens incl. the pending one at index target_len
        n = target_len
        start = self.length
        # catch up: pairs (h_i, x_{i+1}) for i in start..n-1, one forward
        h = mx.stack([self.hidden[i] for i in range(start, n)])[None]  # [1, L, D]
        nxt = mx.array(history[start + 1 : n + 1])[None]  # [1, L]
        out, logits = self.model.mtp_forward(h, nxt, self.cache)
        self.hidden = {i: v for i, v in self.hidden.items() if i >= n}
        block = DraftBlock.empty(n + 1, self.model.args.vocab_size)
        for s in range(k):
            if cursor.complete:
                break
            tok, q, u = self.draw(logits[0, -1], sp, history + block.tokens, seed, n + 1 + s, cursor)
            block.append(tok, q, u)
            cursor = cursor.advance(tok)
            if s + 1 < k:  # recurrent reuse of the head: its own hidden + the proposal
                out, logits = self.model.mtp_forward(out[:, -1:], mx.array([[tok]]), self.cache)
        return block

    def after_verify(self, target_len_before: int, target_len_after: int, hidden: mx.array) -> None:
        """Drop speculative entries; keep the verified target hidden states."""
        trim_cache(self.cache, min(self.length, target_len_before))
        self.observe(target_len_before, hidden[: target_len_after - target_len_before])

    def state(self) -> list[mx.array]:
        return [a for c in self.cache for a in c.contents()]


class AssistantDrafter:
    kind = "assistant"

    def __init__(self, model: Model, cache: list | None = None):
        self.model = model
        self.cache = model.make_cache() if cache is None else cache

    @property
    def length(self) -> int:
        return cache_length(self.cache)

    def draw(self, logits, sp: SamplingParams, history: list[int], seed: int, pos: int, cursor: Cursor):
        """One proposal: (token, processed law q, uniform); a seam that mtpcheck.mutants overrides."""
        return _draw(logits, sp, history, seed, pos, cursor)

    def observe(self, start: int, hidden: mx.array) -> None:
        pass  # the assistant reads tokens, not the target's hidden states

    def draft(self, history: list[int], target_len: int, k: int, sp: SamplingParams, seed: int,
              cursor: Cursor = FREE) -> DraftBlock:
        # history: committed tokens incl. the pending one at index target_len
        block = DraftBlock.empty(target_len + 1, self.model.args.vocab_size)
        return self.extend(history[: target_len + 1], block, k, sp, seed, cursor)

    def extend(self, history: list[int], block: DraftBlock, k: int, sp: SamplingParams, seed: int,
               cursor: Cursor) -> DraftBlock:
        """Draw proposals after history + block.tokens until the block holds k
        (or the cursor, advanced past them, is complete)."""
        while len(block.tokens) < k and not cursor.complete:
            seq = history + block.tokens
            tok, q, u = self.draw(self._logits_after(seq), sp, seq, seed, len(seq), cursor)
            block.append(tok, q, u)
            cursor = cursor.advance(tok)
        return block

    def _logits_after(self, seq: list[int]) -> mx.array:
        """Feed what the cache lacks of seq -> logits [V] for position len(seq).
        The prompt goes in one forward; later tokens one per forward (bitwise
        reproducible whichever path fed them)."""
        new = seq[self.length :]
        if self.length == 0:
            return self.model(mx.array(new)[None], self.cache)[1][0, -1]
        for t in new:
            _, logits = self.model(mx.array([[t]]), self.cache)
        return logits[0, -1]

    def clone(self) -> AssistantDrafter:
        """An independent copy: drafting on it leaves this one untouched."""
        return type(self)(self.model, [_copy_cache(c) for c in self.cache])

    def after_verify(self, target_len_before: int, target_len_after: int, hidden: mx.array) -> None:
        # entries past target_len_after hold rejected proposals
        trim_cache(self.cache, min(self.length, target_len_after))

    def state(self) -> list[mx.array]:
        return [a for c in self.cache for a in c.contents()]


def _copy_cache(c):
    if isinstance(c, KVCache):
        new = KVCache()
        if c.keys is not None:  # slicing copies: the clone's writes stay its own
            new.keys, new.values = c.keys[:, :, : c.length], c.values[:, :, : c.length]
        new.length = c.length
        return new
    new = RecurrentCache()
    new.state, new.length, new.checkpoints = c.state, c.length, dict(c.checkpoints)
    return new
