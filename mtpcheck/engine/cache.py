"""Caches with a logical length.

Rejection shortens the logical length; capacity may stay (seed 000: "chunked
target caches may retain allocation capacity while reducing their logical
length"). Recurrent state cannot be trimmed, so it is restored from the
checkpoints its last forward recorded.
"""

from __future__ import annotations

import mlx.core as mx

CHUNK = 256


class RollbackError(RuntimeError):
    """A cache was asked for a length it cannot restore."""


class KVCache:
    def __init__(self):
        self.keys: mx.array | None = None  # [B, H, capacity, hd]
        self.values: mx.array | None = None
        self.length = 0

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def update(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Write k, v [B, H, L, hd] at the logical end; return the live prefix."""
        B, H, L, hd = k.shape
        end = self.length + L
        if end > self.capacity:
            grow = ((end - self.capacity + CHUNK - 1) // CHUNK) * CHUNK
            pad = mx.zeros((B, H, grow, hd), dtype=k.dtype)
            self.keys = pad if self.keys is None else mx.concatenate([self.keys, pad], axis=2)
            self.values = mx.zeros_like(pad) if self.values is None else mx.concatenate([self.values, mx.zeros_like(pad)], axis=2)
        self.keys[:, :, self.length : end, :] = k
        self.values[:, :, self.length : end, :] = v
        self.length = end
        return self.keys[:, :, :end, :], self.values[:, :, :end, :]

    def trim_to(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise RollbackError(f"KV cache of length {self.length} cannot be trimmed to {length}")
        self.length = length

    def contents(self) -> list[mx.array]:
        if self.keys is None:
            return []
        return [self.keys[:, :, : self.length, :], self.values[:, :, : self.length, :]]


class RecurrentCache:
    """State of a gated linear-attention layer: one matrix per head, plus the
    states after each input of the last forward (the rollback checkpoints)."""

    def __init__(self):
        self.state: mx.array | None = None  # [B, H, dk, dv]
        self.length = 0
        self.checkpoints: dict[int, mx.array | None] = {}

    def record(self, states: list[mx.array]) -> None:
        """states[t] is the state after input t of a forward that started at self.length.
        Checkpoints accumulate until the next trim_to, which marks a commit."""
        start = self.length
        self.checkpoints[start] = self.state
        for t, s in enumerate(states):
            self.checkpoints[start + t + 1] = s
        self.state = states[-1]
        self.length = start + len(states)

    def trim_to(self, length: int) -> None:
        if length != self.length and length not in self.checkpoints:
            raise RollbackError(
                f"recurrent state at length {self.length} has no checkpoint for {length} "
                f"(has {sorted(self.checkpoints)})"
            )
        self.state = self.checkpoints.get(length, self.state)
        self.length = length
        self.checkpoints = {length: self.state}  # the committed boundary only moves forward

    def contents(self) -> list[mx.array]:
        return [] if self.state is None else [self.state]


def cache_length(cache: list) -> int:
    lengths = {c.length for c in cache}
    if len(lengths) != 1:
        raise RollbackError(f"layer caches disagree on logical length: {sorted(lengths)}")
    return lengths.pop()


def trim_cache(cache: list, length: int) -> None:
    for c in cache:
        c.trim_to(length)
