"""A model form over mlx-vlm's Qwen3.5 classes, so the reference engine can
decode the very checkpoint mlx-vlm runs (``mtpcheck/fixture/real/mlx_vlm``).

The engine needs four things of a target (see model.Model): a forward
``(tokens, cache) -> (hidden, logits)``, caches with a logical ``length`` and
``trim_to``, ``mtp_forward`` for the head, and ``args.vocab_size`` /
``args.mtp_layers``. Here the layers, weights and kernels are mlx-vlm's
(``Qwen3_5Model``, its gated-delta and attention layers, the ``qwen3_5_mtp``
drafter's blocks); only the cache bookkeeping is ours:

* attention layers keep mlx-vlm's ``KVCache`` (trim = shorten the offset);
* gated-delta layers hold a causal-conv window and a recurrent state that
  cannot be trimmed. ``DeltaCache`` asks mlx-vlm's own operator for the state
  after every input of a forward (``state_steps``) and keeps the conv window
  after every input, so rejection restores the exact state at the accepted
  length (the same checkpoint rule as cache.RecurrentCache).

Imports mlx-vlm (the ``mlx-vlm`` extra); nothing imports this module
unless a Qwen3.5 checkpoint is loaded.

Positions are explicit (text only: the three M-RoPE sections share one
position), so the language model's cached ``_position_ids`` never enter.
The hidden state handed to the head is the target's final normed hidden, as
mlx-vlm's MTP loop feeds it; the head returns its normed output, which is
what mlx-vlm feeds back for deeper proposals.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_vlm.models.cache import ArraysCache, KVCache

from .cache import RollbackError


@dataclass
class FormArgs:
    vocab_size: int
    mtp_layers: int  # 0: no head


class AttnCache(KVCache):
    """mlx-vlm's KV cache with the engine's logical-length interface."""

    @property
    def length(self) -> int:
        return int(self.offset)

    def trim_to(self, length: int) -> None:
        if not 0 <= length <= self.offset:
            raise RollbackError(f"KV cache of length {self.offset} cannot be trimmed to {length}")
        self.trim(self.offset - length)

    def contents(self) -> list[mx.array]:
        return [] if self.keys is None else [self.keys[..., : self.offset, :], self.values[..., : self.offset, :]]


class DeltaCache(ArraysCache):
    """Slot 0: conv window [B, K-1, C]; slot 1: recurrent state [B, Hv, Dv, Dk].
    checkpoints[n] = (window, state) after n inputs, kept back to the last commit."""

    def __init__(self):
        super().__init__(size=2)
        self.length = 0
        self.checkpoints: dict[int, tuple] = {0: (None, None)}
        self._windows: list[mx.array] = []

    def update_window(self, index, source, width, *, lengths=None):
        # source = [previous window, this forward's inputs]: [B, K-1+L, C]
        L = source.shape[1] - width
        self._windows = [source[:, t + 1 : t + 1 + width] for t in range(L)]
        return super().update_window(index, source, width, lengths=lengths)

    def update_recurrent(self, index, length, update):
        # mlx-vlm's operator returns the L-1 intermediate states when asked
        result = update(self.cache[index], length - 1 if length > 1 else None)
        output, state = result[:2]
        states = [result[2][:, t] for t in range(length - 1)] if length > 1 else []
        states.append(state)
        if len(self._windows) != length:
            raise RollbackError(f"conv windows for {len(self._windows)} inputs, recurrent update of {length}")
        for t in range(length):
            self.checkpoints[self.length + t + 1] = (self._windows[t], states[t])
        self.cache[index] = state
        self.length += length
        return output, state

    def trim_to(self, length: int) -> None:
        if length not in self.checkpoints:
            raise RollbackError(f"recurrent state at length {self.length} has no checkpoint for {length} "
                                f"(has {sorted(self.checkpoints)})")
        window, state = self.checkpoints[length]
        self.cache[0], self.cache[1] = window, state
        self.length = length
        self.checkpoints = {length: (window, state)}  # the committed boundary only moves forward

    def contents(self) -> list[mx.array]:
        return [a for a in self.cache if a is not None]


class Qwen35Form:
    """Target (qwen3_5_text) + optional qwen3_5_mtp head, in the engine's model form."""

    def __init__(self, target, drafter=None):
        self.lm = target.language_model  # mlx-vlm LanguageModel
        self.inner = self.lm.model  # Qwen3_5Model: embed -> layers -> final norm
        self.drafter = drafter
        if drafter is not None:
            drafter.bind(target)  # the head reads out through the target's embedding / LM head
        self.args = FormArgs(vocab_size=self.lm.args.vocab_size,
                             mtp_layers=len(drafter.layers) if drafter is not None else 0)

    def _logits(self, h: mx.array) -> mx.array:
        head = self.inner.embed_tokens.as_linear if self.lm.args.tie_word_embeddings else self.lm.lm_head
        return head(h).astype(mx.float32)  # the host reads float32

    def __call__(self, tokens: mx.array, cache: list | None = None) -> tuple[mx.array, mx.array]:
        """tokens [1, L] -> (final normed hidden [1, L, D], logits [1, L, V] float32)."""
        start = 0 if cache is None else cache[self.inner.fa_idx].length
        L = tokens.shape[1]
        pos = mx.broadcast_to(mx.arange(start, start + L)[None, None], (3, 1, L))  # [3, B, L]: text-only M-RoPE
        h = self.inner(tokens, cache=cache, position_ids=pos)
        return h, self._logits(h)

    def mtp_forward(self, h: mx.array, next_tokens: mx.array, cache: list | None = None):
        """(h [1, L, D], x_{i+1} [1, L]) -> (head hidden [1, L, D], logits for x_{i+2} [1, L, V]).
        Head cache entry i sits at position i, as in mlx-vlm's drafter."""
        start = 0 if cache is None else cache[0].length
        L = next_tokens.shape[1]
        pos = mx.arange(start, start + L)[None]  # [B, L]
        emb = self.inner.embed_tokens(next_tokens) * self.drafter._input_embed_scale
        out = self.drafter._forward_hidden(emb, h, cache, pos)  # normed, as mlx-vlm feeds it back
        return out, self._logits(out)

    def make_cache(self) -> list:
        return [DeltaCache() if layer.is_linear else AttnCache() for layer in self.inner.layers]

    def make_mtp_cache(self) -> list:
        return [AttnCache() for _ in range(self.args.mtp_layers)]


def load_qwen35(target_path, drafter_path=None, dtype=mx.float32) -> Qwen35Form:
    """The model form of an mlx-vlm target folder and MTP drafter folder,
    loaded with mlx-vlm's own loaders. The reference computes in float32 (the
    fixture's float16 weights upcast, as load_model does for the tiny fixture):
    in float16 its teacher-forced law and its decoding law differ by rounding,
    enough to move a top-k boundary."""
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.utils import load

    model, _ = load(str(target_path))  # the reference reads text through tokenizers (load_tokenizer)
    drafter = None
    if drafter_path is not None:
        drafter, kind = load_drafter(str(drafter_path), kind="mtp")
        if kind != "mtp" or not hasattr(drafter, "_forward_hidden"):  # V8: a target labelled "mtp"
            raise ValueError(f"drafter {drafter_path} did not load as a qwen3_5_mtp head "
                             f"(kind {kind!r}, {type(drafter).__name__})")
    for m in (model, drafter):
        if m is not None:
            m.set_dtype(dtype)
            mx.eval(m.parameters())  # evaluate here: a lazy cast would be evaluated on the caller's thread
    return Qwen35Form(model, drafter)
