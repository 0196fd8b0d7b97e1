"""Exact laws of speculative decoding on toy models, in float64.

"Exact before statistical" (docs/statistics.md): where the
law of the emitted stream can be enumerated, compare it with the target law
directly instead of sampling. Three levels:

* `acceptance_probability` - the first-position acceptance probability of a
  rule, from its `accept_probability` law alone.
* `stream_law` - the joint law of the first n emitted tokens of a toy
  context-dependent model under speculative decoding with depth k, composed
  from a rule's two laws (`accept_probability`, `correction`). Lossless means
  `stream_law == target_law`.
* `verify_law` - the law of one block's outcome (accepted count, next token)
  obtained by running the rule's `verify` (the decision procedure the engine
  actually executes) on every cell of its uniforms, weighted by the cell's
  volume. `block_law` is the same law composed from the two analytic laws;
  equality shows that `verify` realises them exactly.

Every function takes a `Rule`-like object (anything with the attributes
`accept_probability`, `correction` and, for `verify_law`, `verify`), so
deliberately broken rules (mutants) can be passed in. Nothing here
validates or renormalises what a rule returns: a rule whose laws do not sum
to one shows up as a law error, which is the point.

`toy_models()`, `distributions()` and `distribution_pairs()` are hypothesis
strategies that include zeros, ties, disjoint supports and one-hot rows.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from hypothesis import strategies as st

__all__ = [
    "Law",
    "RuleLike",
    "ToyModel",
    "acceptance_probability",
    "block_law",
    "distribution_pairs",
    "distributions",
    "max_law_error",
    "rule_law_problems",
    "stream_law",
    "stream_law_array",
    "stream_law_error",
    "target_law",
    "target_law_array",
    "toy_models",
    "verify_law",
    "verify_law_error",
]

Law = dict[tuple[int, ...], float]
"""A (sub-)probability law over token tuples; absent keys have mass 0."""


class RuleLike(Protocol):
    """What the enumerators need from an acceptance rule."""

    accept_probability: Callable[[np.ndarray, np.ndarray, int], float]
    correction: Callable[[np.ndarray, np.ndarray, int], np.ndarray]


# --------------------------------------------------------------------------
# toy model


@dataclass(frozen=True, eq=False)
class ToyModel:
    """Target and draft laws that depend on the last token of the context.

    `p_table[t]` / `q_table[t]` is the law of the next token after a context
    ending in token t; row V (the last row) is the empty-context row, so both
    tables have shape [V+1, V].

    `draft_table` (default: `q_table`) is the law proposals are actually drawn
    from, while `q_table` is the law the acceptance rule is told about. They
    differ only in broken runtimes (bug class B01: argmax draft verified as
    if sampled from softmax q), which is why the knob exists.
    """

    p_table: np.ndarray
    q_table: np.ndarray
    draft_table: np.ndarray | None = None

    def __post_init__(self) -> None:
        p = np.array(self.p_table, dtype=np.float64)
        q = np.array(self.q_table, dtype=np.float64)
        dr = q if self.draft_table is None else np.array(self.draft_table, dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != p.shape[1] + 1 or p.shape[1] < 1:
            raise ValueError(f"p_table must have shape [V+1, V], got {p.shape}")
        for name, t in (("p_table", p), ("q_table", q), ("draft_table", dr)):
            if t.shape != p.shape:
                raise ValueError(f"{name} has shape {t.shape}, expected {p.shape}")
            if not np.all(np.isfinite(t)) or np.any(t < 0):
                raise ValueError(f"{name} must be finite and non-negative")
            if not np.allclose(t.sum(axis=1), 1.0, rtol=0, atol=1e-9):
                raise ValueError(f"{name} rows must sum to 1")
        object.__setattr__(self, "p_table", p)
        object.__setattr__(self, "q_table", q)
        object.__setattr__(self, "draft_table", dr)

    @property
    def vocab(self) -> int:
        return self.p_table.shape[1]

    def row(self, context: tuple[int, ...] = ()) -> int:
        return int(context[-1]) if len(context) else self.vocab

    def p(self, context: tuple[int, ...] = ()) -> np.ndarray:
        return self.p_table[self.row(context)]

    def q(self, context: tuple[int, ...] = ()) -> np.ndarray:
        return self.q_table[self.row(context)]


# --------------------------------------------------------------------------
# first-position acceptance


def acceptance_probability(
    p: np.ndarray, q: np.ndarray, rule: RuleLike, draft: np.ndarray | None = None
) -> float:
    """P(the first proposal is accepted) = sum_d draft[d] * accept_probability(p, q, d),
    with proposals drawn from `draft` (default q). For the lossless rules this
    is sum(min(p, q)) (rejection) and sum(p * q) (exact_match)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    draft = q if draft is None else np.asarray(draft, dtype=np.float64)
    return float(
        sum(
            draft[d] * float(rule.accept_probability(p, q, int(d)))
            for d in np.flatnonzero(draft > 0)
        )
    )


def rule_law_problems(
    rule: RuleLike, p: np.ndarray, q: np.ndarray, tol: float = 1e-12
) -> list[str]:
    """What is wrong with a rule's laws at (p, q), as readable lines (empty:
    nothing): an acceptance probability outside [0, 1], or a correction that
    is not a probability vector or puts mass where p is 0, for a proposal d
    with q[d] > 0 that can be rejected.

    The stream law alone cannot see an acceptance "probability" above 1 in
    the law algebra (e.g. p/q without min(1, .)): there the signed rejection
    masses cancel exactly, and a verify that tests `u < p/q` behaves as
    min(1, p/q) anyway. This check names it."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    out = []
    for d in np.flatnonzero(q > 0):
        d = int(d)
        a = float(rule.accept_probability(p, q, d))
        if not -tol <= a <= 1.0 + tol:
            out.append(f"accept_probability(d={d}) = {a!r} is not in [0, 1]")
        if a < 1.0:
            c = np.asarray(rule.correction(p, q, d), dtype=np.float64)
            if not np.all(np.isfinite(c)) or np.any(c < -tol) or abs(c.sum() - 1.0) > 1e-9:
                out.append(f"correction(d={d}) is not a probability vector (sum {c.sum()!r})")
            elif np.any(c[p <= 0] > tol):
                out.append(f"correction(d={d}) puts mass on tokens of target probability 0")
    return out


# --------------------------------------------------------------------------
# stream laws


def _transitions(model: ToyModel, rule: RuleLike, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """One emitted token of the chain over states (last token, j).

    A[t, j, x]: probability, from state (.., t; j), of emitting x by accepting
    proposal x (next state (.., x; j+1)); zero at j == depth.
    R[t, j, x]: probability of emitting x as a correction (j < depth) or a bonus
    (j == depth); next state (.., x; 0).
    Rows t = 0..V-1 are "last token t", row V is the empty context."""
    V = model.vocab
    A = np.zeros((V + 1, depth + 1, V))
    R = np.zeros((V + 1, depth + 1, V))
    for t in range(V + 1):
        p, q, dr = model.p_table[t], model.q_table[t], model.draft_table[t]
        acc = np.zeros(V)
        rej = np.zeros(V)
        for d in np.flatnonzero(dr > 0):
            d = int(d)
            a = float(rule.accept_probability(p, q, d))
            acc[d] = dr[d] * a
            w = dr[d] * (1.0 - a)
            if w != 0.0:
                rej += w * np.asarray(rule.correction(p, q, d), dtype=np.float64)
        A[t, :depth] = acc
        R[t, :depth] = rej
        R[t, depth] = p
    return A, R


def _law_from_array(arr: np.ndarray) -> Law:
    if arr.ndim == 0:
        return {(): float(arr)} if arr != 0 else {}
    flat = arr.ravel()
    nz = np.flatnonzero(flat)
    idx = np.unravel_index(nz, arr.shape)
    keys = zip(*(i.tolist() for i in idx), strict=True)
    return {tuple(k): float(v) for k, v in zip(keys, flat[nz].tolist(), strict=True)}


def stream_law_array(model: ToyModel, rule: RuleLike, depth: int, n_tokens: int) -> np.ndarray:
    """`stream_law` as a dense array of shape [V] * n_tokens."""
    if depth < 1:
        raise ValueError("depth must be >= 1")
    if n_tokens < 0:
        raise ValueError("n_tokens must be >= 0")
    V = model.vocab
    A, R = _transitions(model, rule, depth)
    # probs[s, j]: mass of (emitted sequence s in base-V order, j accepted so far)
    probs = np.zeros((1, depth + 1))
    probs[0, 0] = 1.0
    last = np.array([V])
    for _ in range(n_tokens):
        S = probs.shape[0]
        new = np.empty((S, V, depth + 1))
        new[:, :, 0] = np.einsum("sj,sjx->sx", probs, R[last])
        new[:, :, 1:] = np.transpose(probs[:, :depth, None] * A[last][:, :depth, :], (0, 2, 1))
        probs = new.reshape(S * V, depth + 1)
        last = np.tile(np.arange(V), S)
    return probs.sum(axis=1).reshape((V,) * n_tokens)


def stream_law(model: ToyModel, rule: RuleLike, depth: int, n_tokens: int) -> Law:
    """Exact joint law of the first `n_tokens` tokens emitted by speculative
    decoding with `depth` proposals per round.

    The chain: in state (T, j), if j == depth emit a bonus x ~ p(.|T) and go to
    (T+x, 0); else draw d ~ draft(.|T), emit d with probability
    rule.accept_probability(p, q, d) and go to (T+d, j+1), otherwise emit
    c ~ rule.correction(p, q, d) and go to (T+c, 0). The mass is propagated
    forward one emitted token at a time, vectorised over all prefixes (the
    transition depends only on (last token, j)), so V=8, depth 4, 5 tokens
    takes about 0.1 s (most of it building the dict; `stream_law_array` is
    the dense form)."""
    return _law_from_array(stream_law_array(model, rule, depth, n_tokens))


def target_law_array(model: ToyModel, n_tokens: int) -> np.ndarray:
    V = model.vocab
    probs = np.ones(1)
    last = np.array([V])
    for _ in range(n_tokens):
        probs = (probs[:, None] * model.p_table[last]).ravel()
        last = np.tile(np.arange(V), len(probs) // V)
    return probs.reshape((V,) * n_tokens)


def target_law(model: ToyModel, n_tokens: int) -> Law:
    """Autoregressive law of the first n tokens: prod_i p(x_i | x_<i)."""
    return _law_from_array(target_law_array(model, n_tokens))


def max_law_error(a: Mapping[Any, float], b: Mapping[Any, float]) -> float:
    """max over the union of outcomes of |a(x) - b(x)| (absent = 0)."""
    keys = set(a) | set(b)
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys), default=0.0)


def stream_law_error(model: ToyModel, rule: RuleLike, depth: int, n_tokens: int) -> float:
    """max |stream_law - target_law| (dense, so it also sees mass on outcomes
    that only one of the two laws has)."""
    s = stream_law_array(model, rule, depth, n_tokens)
    t = target_law_array(model, n_tokens)
    return float(np.max(np.abs(s - t))) if s.size else 0.0


# --------------------------------------------------------------------------
# the law realised by a rule's `verify`


class _Unassigned(BaseException):
    """Raised when verify reads a coordinate the walk has not fixed yet.
    A BaseException so that a `try/except Exception` inside verify cannot
    swallow it."""

    def __init__(self, coord: tuple[str, int]):
        super().__init__(coord)
        self.coord = coord


class _Lazy:
    """Read-only sequence over one kind of coordinate of the walk."""

    __slots__ = ("kind", "length", "assigned")

    def __init__(self, kind: str, length: int, assigned: Mapping[tuple[str, int], Any]):
        self.kind = kind
        self.length = length
        self.assigned = assigned

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(self.length))]
        j = operator.index(j)
        if j < 0:
            j += self.length
        if not 0 <= j < self.length:
            raise IndexError(j)
        key = (self.kind, j)
        if key not in self.assigned:
            raise _Unassigned(key)
        return self.assigned[key]

    def __iter__(self) -> Iterator[Any]:
        for j in range(self.length):
            yield self[j]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array([self[j] for j in range(self.length)], dtype=dtype)


def _cdf_breaks(law: np.ndarray) -> np.ndarray:
    """Edges in u-space of `sampling.sample(law, u)`: token i owns
    [cdf[i-1], cdf[i]) / total."""
    law = np.asarray(law, dtype=np.float64)
    cdf = np.cumsum(law)
    total = cdf[-1]
    if not np.isfinite(total) or total <= 0:
        return np.empty(0)
    return cdf / total


def _cells(breaks: list[float] | np.ndarray) -> list[tuple[float, float]]:
    """(representative point, volume) of each non-empty cell [b_i, b_i+1) of
    [0, 1) cut at `breaks`."""
    b = np.unique(
        np.clip(np.concatenate([[0.0, 1.0], np.asarray(breaks, dtype=np.float64)]), 0.0, 1.0)
    )
    out = []
    for lo, hi in zip(b[:-1].tolist(), b[1:].tolist(), strict=True):
        if hi > lo:
            mid = lo + 0.5 * (hi - lo)
            out.append((mid if mid < hi else lo, hi - lo))
    return out


def verify_law(
    rule: Any,
    ps: np.ndarray,
    qs: np.ndarray,
    proposals: list[int] | None = None,
) -> dict[tuple[int, int], float]:
    """Exact law of (accepted count, next token) realised by `rule.verify`.

    ps [k+1, V] are the target laws at the k+1 positions, qs [k, V] the draft
    laws. With `proposals` given the law is conditional on them; otherwise
    proposal j is drawn from qs[j] (independently: one block with fixed
    laws).

    `verify` is run as a black box on lazy sequences. When it reads a
    coordinate that is not fixed yet (proposal j, accept uniform j, target
    uniform j) the walk splits on it and reruns, so only the coordinates
    the decision procedure actually reads are enumerated (a rejection at
    position 0 never enumerates later proposals). Splits:
      proposal j       - each token d with qs[j][d] > 0, weight qs[j][d];
      accept uniform j - [0, a) and [a, 1), a = rule.accept_probability(ps[j], qs[j], d_j);
      target uniform j - the cdf cells of ps[j] and, for j < k, of
                         rule.correction(ps[j], qs[j], d_j) (inverse-CDF sampling).
    Each cell is represented by its midpoint and weighted by its length.

    The law is exact when `verify` is a threshold function of each uniform
    with thresholds among those cut points, which is what a correct verify
    is (`u < a`, `sample(law, u)`). A verify that thresholds elsewhere (e.g.
    reuses the accept uniform to draw the correction) gets a law that is
    not its own exact law but still differs from `block_law`, so the check
    fails as it should."""
    ps = np.asarray(ps, dtype=np.float64)
    qs = np.asarray(qs, dtype=np.float64)
    k = qs.shape[0]
    if ps.shape != (k + 1, qs.shape[1]):
        raise ValueError(f"ps must have shape {(k + 1, qs.shape[1])}, got {ps.shape}")
    fixed: dict[tuple[str, int], Any] = {}
    if proposals is not None:
        if len(proposals) != k:
            raise ValueError("need one proposal per draft law")
        fixed = {("proposal", j): int(d) for j, d in enumerate(proposals)}

    memo: dict[tuple[str, int, int | None], list] = {}

    def splits(coord: tuple[str, int], assigned: Mapping) -> tuple[tuple[str, int], list]:
        kind, j = coord
        if kind != "proposal" and j < k and ("proposal", j) not in assigned:
            coord, kind = ("proposal", j), "proposal"
        d = assigned.get(("proposal", j)) if kind != "proposal" else None
        key = (kind, j, d)
        if key not in memo:
            if kind == "proposal":
                memo[key] = [(int(t), float(qs[j][t])) for t in np.flatnonzero(qs[j] > 0)]
            elif kind == "accept":
                memo[key] = _cells([float(rule.accept_probability(ps[j], qs[j], d))])
            else:
                breaks = [_cdf_breaks(ps[j])]
                if j < k:
                    breaks.append(_cdf_breaks(rule.correction(ps[j], qs[j], d)))
                memo[key] = _cells(np.concatenate(breaks))
        return coord, memo[key]

    law: dict[tuple[int, int], float] = defaultdict(float)
    stack: list[tuple[dict, float]] = [(fixed, 1.0)]
    while stack:
        assigned, weight = stack.pop()
        try:
            v = rule.verify(
                ps,
                qs,
                _Lazy("proposal", k, assigned),
                _Lazy("accept", k, assigned),
                _Lazy("target", k + 1, assigned),
            )
        except _Unassigned as need:
            if need.coord in assigned:  # cannot happen; guards against an endless walk
                raise RuntimeError(f"walk re-requested {need.coord}") from None
            coord, options = splits(need.coord, assigned)
            for value, w in options:
                stack.append(({**assigned, coord: value}, weight * w))
            continue
        law[(int(v.accepted), int(v.next_token))] += weight
    return {key: w for key, w in law.items() if w != 0.0}


def block_law(
    rule: RuleLike,
    ps: np.ndarray,
    qs: np.ndarray,
    proposals: list[int] | None = None,
) -> dict[tuple[int, int], float]:
    """The law of (accepted count, next token) of one block, composed from the
    rule's analytic laws: stop at m < k with prod_{i<m} a_i * (1 - a_m) *
    correction_m[x]; full acceptance with prod a_i * ps[k][x]. Same
    conventions as `verify_law`."""
    ps = np.asarray(ps, dtype=np.float64)
    qs = np.asarray(qs, dtype=np.float64)
    k = qs.shape[0]
    law: dict[tuple[int, int], float] = defaultdict(float)

    def walk(j: int, w: float) -> None:
        if j == k:
            for x in np.flatnonzero(ps[k]):
                law[(k, int(x))] += w * ps[k][x]
            return
        if proposals is not None:
            options = [(int(proposals[j]), 1.0)]
        else:
            options = [(int(d), float(qs[j][d])) for d in np.flatnonzero(qs[j] > 0)]
        for d, wd in options:
            a = float(rule.accept_probability(ps[j], qs[j], d))
            if a != 0.0:
                walk(j + 1, w * wd * a)
            if a != 1.0:
                corr = np.asarray(rule.correction(ps[j], qs[j], d), dtype=np.float64)
                for x in np.flatnonzero(corr):
                    law[(j, int(x))] += w * wd * (1.0 - a) * corr[x]

    walk(0, 1.0)
    return {key: w for key, w in law.items() if w != 0.0}


def verify_law_error(
    rule: Any, ps: np.ndarray, qs: np.ndarray, proposals: list[int] | None = None
) -> float:
    """max |verify_law - block_law|."""
    return max_law_error(verify_law(rule, ps, qs, proposals), block_law(rule, ps, qs, proposals))


# --------------------------------------------------------------------------
# hypothesis strategies

_WEIGHTS = st.one_of(
    st.just(0.0),
    st.sampled_from([1.0, 2.0, 3.0]),  # ties
    st.floats(min_value=1e-6, max_value=1.0),
)


def _normalise(w: np.ndarray) -> np.ndarray:
    return w / w.sum()


@st.composite
def distributions(draw: st.DrawFn, vocab: int) -> np.ndarray:
    """A float64 law over `vocab` tokens: arbitrary weights with zeros and
    ties, one-hot, or uniform."""
    kind = draw(st.sampled_from(["weights", "weights", "weights", "one_hot", "uniform"]))
    if kind == "one_hot":
        w = np.zeros(vocab)
        w[draw(st.integers(0, vocab - 1))] = 1.0
    elif kind == "uniform":
        w = np.ones(vocab)
    else:
        w = np.array(draw(st.lists(_WEIGHTS, min_size=vocab, max_size=vocab)), dtype=np.float64)
        if w.sum() <= 0.0:
            w[draw(st.integers(0, vocab - 1))] = 1.0
    return _normalise(w)


@st.composite
def distribution_pairs(draw: st.DrawFn, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(p, q) over `vocab` tokens: independent, equal, disjoint supports, or
    q supported on a subset of p's support."""
    kind = draw(st.sampled_from(["independent", "independent", "equal", "disjoint", "subset"]))
    p = draw(distributions(vocab))
    if kind == "equal":
        return p, p.copy()
    if kind == "independent" or vocab < 2:
        return p, draw(distributions(vocab))
    if kind == "disjoint":
        mask = np.array(draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab)))
        if mask.all() or not mask.any():
            mask[:] = False
            mask[: draw(st.integers(1, vocab - 1))] = True
        wp = np.array(draw(st.lists(st.floats(1e-3, 1.0), min_size=vocab, max_size=vocab)))
        wq = np.array(draw(st.lists(st.floats(1e-3, 1.0), min_size=vocab, max_size=vocab)))
        return _normalise(np.where(mask, wp, 0.0)), _normalise(np.where(mask, 0.0, wq))
    # subset: q lives on part of p's support (q[d] > 0 implies p[d] > 0)
    support = np.flatnonzero(p > 0)
    keep = draw(
        st.lists(st.sampled_from(support.tolist()), min_size=1, max_size=len(support), unique=True)
    )
    wq = np.zeros(vocab)
    wq[keep] = np.array(
        draw(st.lists(st.floats(1e-3, 1.0), min_size=len(keep), max_size=len(keep)))
    )
    return p, _normalise(wq)


@st.composite
def toy_models(draw: st.DrawFn, min_vocab: int = 2, max_vocab: int = 6) -> ToyModel:
    """ToyModel with V in [min_vocab, max_vocab], every row pair drawn by
    `distribution_pairs` (zeros, ties, disjoint supports, one-hot rows)."""
    V = draw(st.integers(min_vocab, max_vocab))
    rows = [draw(distribution_pairs(V)) for _ in range(V + 1)]
    return ToyModel(np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows]))
