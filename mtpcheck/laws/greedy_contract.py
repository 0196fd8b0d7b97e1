"""CTRL-CONTRACT's law: greedy tokens against the contract's processed logits.

At temperature 0 the contract's law is one-hot on the argmax (lowest id on
ties) of the *processed logits*: the raw logits with the logit bias added and
the penalties applied over the whole history, prompt + output so far
(`mtpcheck.engine.sampling.apply_penalties`). Given those rows at the
positions a path emitted, every emitted token is checked against its row's
argmax; a flip is excused only as a near tie of the path's float precision,
and the verdict names the path that deviates: speculative, plain, or both.
Comparing the two paths with each other cannot tell these apart: a history
bug that both paths share gives the same wrong output on both sides.

Pure numpy (this layer imports only contracts); the rows come from
`mtpcheck.machinery.contract_logits`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mtpcheck.contracts import SamplingParams

PATHS = ("speculative", "plain")
# With only target_distributions the suite has log p = logits - c(row) of the
# temperature-1 law: enough for controls that add to logits (the argmax moves
# with the differences only), not for repetition_penalty, which divides a
# positive logit and multiplies a negative one: its result depends on c.
ADDITIVE = ("presence_penalty", "frequency_penalty", "logit_bias")
SIGN_DEPENDENT = ("repetition_penalty",)


def sign_dependent(sp: SamplingParams) -> list[str]:
    """The controls of `sp` that need the raw logits themselves (not up to a constant)."""
    return [c for c in sp.speculation_blockers() if c in SIGN_DEPENDENT]


def logits_from_law(p: np.ndarray) -> np.ndarray:
    """log p of unfiltered temperature-1 laws: the logits less a constant per
    row (-inf where a probability underflowed to 0)."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.log(p)


def top2_margin(row: np.ndarray) -> float:
    """Processed logit of the top token less that of the second (nats)."""
    top2 = np.sort(np.asarray(row, dtype=np.float64))[-2:]
    return math.inf if not np.isfinite(top2[0]) else float(top2[1] - top2[0])


@dataclass(frozen=True)
class Flip:
    """An emitted token that is not the argmax of the processed logits."""

    prompt: str
    position: int  # output index
    expected: int  # the contract's argmax
    emitted: int
    margin: float  # top-2 margin of the processed logits there
    gap: float  # processed logit of `expected` less that of `emitted` (>= margin)
    near_tie: bool  # gap below the declared epsilon: a float flip, excused

    def words(self) -> str:
        return (f"{self.prompt} position {self.position}: expected {self.expected}, emitted {self.emitted} "
                f"(margin {self.margin:.3g}, emitted {self.gap:.3g} below the top)")


def greedy_flips(rows: np.ndarray, emitted: list[int], epsilon: float, prompt: str = "") -> list[Flip]:
    """Every position where `emitted` differs from the argmax of its processed
    logits row; `near_tie` where the emitted token's logit is within epsilon
    of the top one (which puts the top-2 margin below epsilon too)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.shape[0] != len(emitted):
        raise ValueError(f"{rows.shape[0]} rows for {len(emitted)} emitted tokens")
    out = []
    for i, tok in enumerate(emitted):
        best = int(np.argmax(rows[i]))
        if tok == best:
            continue
        gap = float(rows[i, best] - rows[i, tok])
        out.append(Flip(prompt, i, best, int(tok), top2_margin(rows[i]), gap, bool(gap < epsilon)))
    return out


@dataclass
class PathCheck:
    """One path's tokens against the law, pooled over prompts."""

    path: str
    checked: int = 0
    deviations: list[Flip] = field(default_factory=list)
    near_ties: list[Flip] = field(default_factory=list)

    def add(self, rows: np.ndarray, emitted: list[int], epsilon: float, prompt: str = "") -> None:
        flips = greedy_flips(rows, emitted, epsilon, prompt)
        self.checked += len(emitted)
        self.deviations += [f for f in flips if not f.near_tie]
        self.near_ties += [f for f in flips if f.near_tie]

    @property
    def first(self) -> Flip | None:
        return self.deviations[0] if self.deviations else None

    def summary(self) -> str:
        if not self.deviations:
            ties = f" ({len(self.near_ties)} near ties excused)" if self.near_ties else ""
            return f"{self.path}: conforms at {self.checked} positions{ties}"
        return f"{self.path}: {len(self.deviations)} of {self.checked} positions deviate, first {self.first.words()}"

    def evidence(self) -> dict:
        return {"positions_checked": self.checked, "deviations": len(self.deviations),
                "first_deviation": vars(self.first) if self.first else None,
                "near_ties": [vars(f) for f in self.near_ties[:5]], "near_ties_excused": len(self.near_ties)}


def deviating_side(spec: PathCheck, plain: PathCheck) -> str | None:
    """'both', 'speculative', 'plain', or None when both paths conform."""
    s, p = bool(spec.deviations), bool(plain.deviations)
    return "both" if s and p else "speculative" if s else "plain" if p else None


def verdict(control: str, spec: PathCheck, plain: PathCheck, epsilon: float, source: str) -> str | None:
    """The failure message, or None when both paths conform. It leads with
    the deviating side and each path's first deviation (reports cut long
    messages); how the law was computed comes last."""
    side = deviating_side(spec, plain)
    if side is None:
        return None
    return (f"{control}: deviating path: {side}; {spec.summary()}; {plain.summary()} - against the argmax of the "
            f"contract's processed logits from {source}, penalties over prompt + output so far, near ties below "
            f"{epsilon:g} nats excused")
