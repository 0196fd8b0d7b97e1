"""Token-level constraints: a deterministic automaton over token ids.

Compiled from allowed token-id sequences, from allowed strings (through the
tokenizer's per-token texts) or from explicit edges (a tiny grammar). States
are ints; an end token leads to DONE, a token the state does not allow to
DEAD. Every state the compilers keep can still reach an accepting state,
so a correct engine never meets an empty mask.

The engine masks draft and target logits with `allowed(state)` at each
position's exact logical history and advances a transaction-local `Cursor`
along a block; the request's own cursor moves only by committed tokens
(bug class B09). Numpy only: the suite imports this without mlx.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

DONE = -1  # after an end token
DEAD = -2  # after a token the state does not allow


class ConstraintError(ValueError):
    """A constraint that cannot be compiled or allows no token."""


class TokenDFA:
    """start state, edges[state][token] -> state, accepting states; at an
    accepting state the end tokens are allowed as well."""

    def __init__(self, vocab: int, start: int, edges: dict[int, dict[int, int]], accepting: Iterable[int],
                 end_ids: Iterable[int]):
        self.vocab, self.start = vocab, start
        self.edges = {s: dict(e) for s, e in edges.items()}
        self.accepting, self.end_ids = frozenset(accepting), frozenset(end_ids)
        if not self.end_ids:
            raise ConstraintError("a constraint needs at least one end token (stop_token_ids or the backend's EOS)")
        bad = [t for e in self.edges.values() for t in e if not 0 <= t < vocab] + [t for t in self.end_ids if not 0 <= t < vocab]
        if bad:
            raise ConstraintError(f"constraint token ids outside the vocabulary (size {vocab}): {sorted(set(bad))[:5]}")
        self._prune()
        self._masks: dict[int, np.ndarray] = {}

    def _prune(self) -> None:
        """Drop states that cannot reach an accepting state (no dead ends)."""
        live = set(self.accepting)
        changed = True
        while changed:
            changed = False
            for s, e in self.edges.items():
                if s not in live and any(d in live for d in e.values()):
                    live.add(s)
                    changed = True
        if self.start not in live:
            raise ConstraintError("the constraint accepts no sequence")
        self.edges = {s: {t: d for t, d in e.items() if d in live} for s, e in self.edges.items() if s in live}

    # -- the automaton -------------------------------------------------------
    def allowed(self, state: int) -> np.ndarray:
        """[V] bool: tokens this state allows."""
        if state not in self._masks:
            m = np.zeros(self.vocab, dtype=bool)
            m[list(self.edges.get(state, {}))] = True
            if state in self.accepting:
                m[list(self.end_ids)] = True
            self._masks[state] = m
        return self._masks[state]

    def complete(self, state: int) -> bool:
        """A grammar-complete boundary: output may end here."""
        return state in self.accepting

    def advance(self, state: int, tok: int) -> int:
        if state in self.accepting and tok in self.end_ids:
            return DONE
        return self.edges.get(state, {}).get(tok, DEAD)

    def walk(self, tokens: Sequence[int], state: int | None = None) -> int:
        s = self.start if state is None else state
        for t in tokens:
            s = self.advance(s, t)
        return s

    def violations(self, tokens: Sequence[int]) -> list[int]:
        """Indices of tokens the automaton, fed the tokens before them, does not allow."""
        out, s = [], self.start
        for i, t in enumerate(tokens):
            if s < 0 or not self.allowed(s)[t]:
                out.append(i)
            s = self.advance(s, t) if s >= 0 else s
        return out

    def signature(self, state: int) -> str:
        """What a state means, independent of how an implementation numbers
        states: its allowed tokens and whether it is complete."""
        ids = np.flatnonzero(self.allowed(state)).tolist() if state >= 0 else [state]
        return hashlib.blake2b(repr((ids, self.complete(state))).encode(), digest_size=8).hexdigest()

    # -- compilers -----------------------------------------------------------
    @classmethod
    def from_sequences(cls, seqs: Sequence[Sequence[int]], vocab: int, end_ids: Iterable[int]) -> TokenDFA:
        """A trie: state = node; a whole sequence is accepting."""
        edges: dict[int, dict[int, int]] = {0: {}}
        accepting = set()
        for seq in seqs:
            s = 0
            for t in seq:
                if t not in edges[s]:
                    edges[s][t] = len(edges)
                    edges[len(edges)] = {}
                s = edges[s][t]
            accepting.add(s)
        return cls(vocab, 0, edges, accepting, end_ids)

    @classmethod
    def from_strings(cls, strings: Sequence[str], token_texts: Sequence[str], end_ids: Iterable[int]) -> TokenDFA:
        """State = the text consumed so far, a prefix of an allowed string; a
        token is an edge when the longer text is still such a prefix."""
        end = set(end_ids)
        names: dict[str, int] = {"": 0}
        edges: dict[int, dict[int, int]] = {}
        todo = [""]
        while todo:
            text = todo.pop()
            edges[names[text]] = {}
            for t, piece in enumerate(token_texts):
                nxt = text + piece
                if t in end or not piece or not any(s.startswith(nxt) for s in strings):
                    continue
                if nxt not in names:
                    names[nxt] = len(names)
                    todo.append(nxt)
                edges[names[text]][t] = names[nxt]
        accepting = {names[s] for s in strings if s in names}
        return cls(len(token_texts), 0, edges, accepting, end)

    @classmethod
    def from_edges(cls, vocab: int, start: int, edges: Iterable[tuple[int, Sequence[int], int]],
                   accepting: Iterable[int], end_ids: Iterable[int]) -> TokenDFA:
        """A tiny grammar: (from, tokens, to) triples."""
        table: dict[int, dict[int, int]] = {}
        for src, toks, dst in edges:
            table.setdefault(src, {}).update({t: dst for t in toks})
            table.setdefault(dst, {})
        return cls(vocab, start, table, accepting, end_ids)


@dataclass(frozen=True)
class Cursor:
    """An automaton and a state: an immutable value, so advancing a copy
    along a block never touches the request's committed state."""

    dfa: TokenDFA | None
    state: int = 0

    @classmethod
    def of(cls, dfa: TokenDFA | None) -> Cursor:
        return cls(dfa, dfa.start if dfa else 0)

    @property
    def mask(self) -> np.ndarray | None:
        return None if self.dfa is None else self.dfa.allowed(self.state)

    @property
    def complete(self) -> bool:
        return self.dfa is not None and self.dfa.complete(self.state)

    def advance(self, tok: int) -> Cursor:
        return self if self.dfa is None else Cursor(self.dfa, self.dfa.advance(self.state, tok))

    def advance_all(self, tokens: Iterable[int]) -> Cursor:
        c = self
        for t in tokens:
            c = c.advance(t)
        return c


FREE = Cursor(None)


def masked(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Logits [V] with disallowed tokens at -inf, before any processing."""
    if mask is None:
        return logits
    if not mask.any():
        raise ConstraintError("the constraint allows no token here (a dead state: its state was advanced wrongly)")
    return np.where(mask, logits, -np.inf)


def compile_constraint(spec, vocab: int, eos: Sequence[int], token_texts: Sequence[str] | None = None) -> TokenDFA:
    """A ConstraintSpec (mtpcheck.contracts.scheduling) -> TokenDFA. End tokens default to `eos`."""
    end = spec.end_token_ids if spec.end_token_ids is not None else list(eos)
    if spec.sequences is not None:
        return TokenDFA.from_sequences(spec.sequences, vocab, end)
    if spec.strings is not None:
        if token_texts is None:
            raise ConstraintError("string constraints need a backend with a tokenizer (text capability)")
        return TokenDFA.from_strings(spec.strings, token_texts, end)
    g = spec.grammar
    return TokenDFA.from_edges(vocab, g.start, [(e.src, e.tokens, e.dst) for e in g.edges], g.accepting, end)
