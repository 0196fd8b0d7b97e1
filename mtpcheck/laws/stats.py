"""Statistical tests that emitted tokens follow the target law.

Observations are (token, p) pairs: the token emitted at one position and the
processed target distribution p (float64) at that position, computed by the
backend's teacher-forced `target_distributions` on the emitted prefix. Each
observation may come from a different context; the tests pool them without
assuming a common law.

* `summarise` / `summarise_truncated` - what the tests read of each
  observation (its token's rank and masses, the rank-bin masses of its law),
  without the row: a sample of any vocabulary held in kilobytes. Every test
  accepts observations or their summary, with the same result.
* `zero_probability_violations` - tokens of target probability 0: an
  immediate failure, no statistics needed.
* `rank_gtest` - the main test: a G-test in rank space (see its docstring).
* `pit_ks` - randomized PIT + Kolmogorov-Smirnov, a cheap extra.
* `detectable_tv` / `samples_for_tv` - power: the smallest deviation the
  G-test detects with probability `power` at a sample size, and back.
* `SUITE_ALPHA`, `bonferroni`, `alpha_for` - the false-failure budget.

See docs/statistics.md for the reasoning and the measured figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import optimize, stats

__all__ = [
    "DEFAULT_POWER",
    "MIN_EXPECTED",
    "LawSummary",
    "SUITE_ALPHA",
    "Observation",
    "ObservationBatch",
    "Observations",
    "TestResult",
    "TopLawSummary",
    "alpha_for",
    "bonferroni",
    "boundary_excess",
    "boundary_mass",
    "detectable_tv",
    "filter_margins",
    "noncentrality",
    "observations",
    "pit_ks",
    "rank_gtest",
    "samples_for_tv",
    "summarise",
    "summarise_truncated",
    "zero_probability_violations",
]

SUITE_ALPHA = 1e-6
"""Total false-failure probability of one whole suite run (Bonferroni)."""

DEFAULT_POWER = 0.99
MIN_EXPECTED = 10.0
"""Every G-test bin gets at least this expected count (bins are merged).
10 rather than the textbook 5: the suite works at alpha 1e-6 and below,
where the chi-square tail of G with expected counts near 5 is measurably
too thin at small n (docs/statistics.md, "Calibration in the far tail")."""

Observation = tuple[int, Sequence[float] | np.ndarray]


class TestResult(BaseModel):
    """Outcome of one statistical test; JSON-serialisable (`as_dict`)."""

    __test__: ClassVar[bool] = False  # not a pytest test class
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    name: str
    alpha: float
    n: int = Field(description="observations that entered the test")
    statistic: float
    p_value: float
    df: int
    detectable_tv: float | None = Field(
        description="smallest total-variation deviation detected with power "
        ">= 0.99 at this n (see detectable_tv); None when the test has no "
        "such guarantee or could not run"
    )
    passed: bool
    note: str = ""
    n_dropped: int = Field(0, description="deterministic (one-hot) observations left out")
    details: dict[str, Any] = Field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types (strict JSON: an infinite statistic is "Infinity")."""
        return json.loads(self.model_dump_json())


# --------------------------------------------------------------------------
# alpha budget


def bonferroni(alpha_total: float, m: int) -> float:
    """Per-test alpha so that m tests together fail falsely with probability
    <= alpha_total (union bound; valid under any dependence)."""
    if m < 1:
        raise ValueError("m must be >= 1")
    if not 0.0 < alpha_total < 1.0:
        raise ValueError("alpha_total must be in (0, 1)")
    return alpha_total / m


def alpha_for(n_subtests: int) -> float:
    """Per-subtest alpha within a whole suite run of `n_subtests` tests."""
    return bonferroni(SUITE_ALPHA, n_subtests)


# --------------------------------------------------------------------------
# observations


def observations(
    tokens: Iterable[int], probs: Iterable[Sequence[float] | np.ndarray]
) -> list[Observation]:
    """Zip emitted tokens with their target distributions."""
    return [(int(t), np.asarray(p, dtype=np.float64)) for t, p in zip(tokens, probs, strict=True)]


@dataclass(frozen=True, eq=False)
class ObservationBatch:
    """Observations as arrays: tokens [n] and target laws probs [n, V] (one
    vocabulary). Accepted wherever an iterable of (token, p) pairs is, and
    much faster for large n."""

    tokens: np.ndarray
    probs: np.ndarray

    def __iter__(self) -> Iterator[Observation]:
        return iter(zip(np.asarray(self.tokens).tolist(), np.asarray(self.probs), strict=True))

    def __len__(self) -> int:
        return len(self.tokens)


Observations = Iterable[Observation] | ObservationBatch

BLOCK_BYTES = 1 << 24
"""Float64 law held at once while observations are summarised: the tests'
working memory is a few times this, whatever the sample size and vocabulary."""


def _rows_per_block(width: int) -> int:
    return max(1, BLOCK_BYTES // (8 * max(width, 1)))


def _blocks(obs: Observations) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(raw tokens [m], laws [m, Vmax] float64 zero-padded, row lengths [m]) a
    block at a time, so that the whole sample is never copied at once."""
    if isinstance(obs, ObservationBatch):
        probs = obs.probs if np.ndim(obs.probs) == 2 else np.array(obs.probs, dtype=np.float64, ndmin=2)
        raw = np.asarray(obs.tokens, dtype=np.int64).ravel()
        if probs.shape[0] != raw.shape[0]:
            raise ValueError("ObservationBatch: one token per distribution")
        step = _rows_per_block(probs.shape[1])
        for i in range(0, len(raw), step):
            P = np.array(probs[i : i + step], dtype=np.float64)
            yield raw[i : i + step], P, np.full(len(P), P.shape[1])
        return
    pairs = list(obs)
    rows = [np.asarray(p, dtype=np.float64).ravel() for _, p in pairs]
    raw = np.array([int(t) for t, _ in pairs], dtype=np.int64)
    vmax = max((len(r) for r in rows), default=0)
    step = _rows_per_block(vmax)
    for i in range(0, len(rows), step):
        chunk = rows[i : i + step]
        P = np.zeros((len(chunk), vmax))
        for j, r in enumerate(chunk):
            P[j, : len(r)] = r
        yield raw[i : i + step], P, np.array([len(r) for r in chunk])


def _width(obs: Observations) -> int:
    """The vocabulary of an empty sample (a batch keeps its width)."""
    return int(np.shape(obs.probs)[-1]) if isinstance(obs, ObservationBatch) and np.ndim(obs.probs) == 2 else 0


def _check_finite(P: np.ndarray) -> None:
    if not np.all(np.isfinite(P)) or np.any(P < 0):
        raise ValueError("target distributions must be finite and non-negative")


def _by_rank(P: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of P in rank order (descending, ties by lower token id) and
    each token's rank. Zeros rank last and add nothing to a sum, so only the
    largest k entries (k the widest support in the block) are ordered: the
    filtered laws' support is a few dozen tokens of V. A token of probability
    0 gets rank k (it fails before any rank is used)."""
    m, V = P.shape
    k = int((P > 0).sum(axis=1).max(initial=0))
    if k >= V // 2:
        order = np.argsort(-P, axis=1, kind="stable")
    else:
        top = np.argpartition(-P, k - 1, axis=1)[:, :k] if k else np.zeros((m, 0), dtype=np.int64)
        vals = np.take_along_axis(P, top, axis=1)
        order = np.take_along_axis(top, np.lexsort((top, -vals), axis=-1), axis=1)
    sorted_p = np.zeros_like(P)
    sorted_p[:, : order.shape[1]] = np.take_along_axis(P, order, axis=1)
    hit = order == tokens[:, None]
    ranks = np.where(hit.any(axis=1), np.argmax(hit, axis=1), order.shape[1])
    return sorted_p, ranks


@dataclass(frozen=True, eq=False)
class LawSummary:
    """What the whole-law tests read of each observation, without its row:
    a few numbers and the rank-bin masses (about log2 V of them), so that a
    sample of any vocabulary is held in kilobytes. Built by `summarise`;
    the tests give the results they give on the rows themselves."""

    zero: np.ndarray  # [n] bool: token outside the vocabulary or of target probability 0
    informative: np.ndarray  # [n] bool: more than one token of positive probability
    ranks: np.ndarray  # [n] int: the token's rank under its own p (descending, ties by lower id)
    mass: np.ndarray  # [n] float64: p[token]
    below: np.ndarray  # [n] float64: the p-mass ranked above the token (cumulated in rank order)
    below_id: np.ndarray  # [n] float64: the p-mass of lower token ids
    bins: np.ndarray  # [n, B] float64: p in rank order summed over the bins of `_base_edges(width)`
    width: int  # the vocabulary (the widest row)

    def __len__(self) -> int:
        return len(self.zero)

    def take(self, keep: np.ndarray) -> LawSummary:
        return LawSummary(self.zero[keep], self.informative[keep], self.ranks[keep], self.mass[keep],
                          self.below[keep], self.below_id[keep], self.bins[keep], self.width)

    @staticmethod
    def join(parts: Sequence[LawSummary]) -> LawSummary:
        """One summary of several samples' observations, in order (narrower
        vocabularies' missing bins hold no mass)."""
        width = max((s.width for s in parts), default=0)
        nbins = len(_base_edges(width)) - 1
        bins = [np.pad(s.bins, ((0, 0), (0, nbins - s.bins.shape[1]))) for s in parts]
        cat = lambda name: np.concatenate([getattr(s, name) for s in parts]) if parts else np.zeros(0)
        return LawSummary(cat("zero").astype(bool), cat("informative").astype(bool), cat("ranks").astype(np.int64),
                          cat("mass"), cat("below"), cat("below_id"),
                          np.concatenate(bins) if bins else np.zeros((0, nbins)), width)


def _summarise_block(raw: np.ndarray, P: np.ndarray, lengths: np.ndarray, offset: int) -> LawSummary:
    valid = (raw >= 0) & (raw < lengths)
    tokens = np.where(valid, raw, 0)
    _check_finite(P)
    sums = P.sum(axis=1)
    if np.any(np.abs(sums - 1.0) > 1e-6):
        bad = int(np.argmax(np.abs(sums - 1.0)))
        raise ValueError(f"observation {offset + bad}: target distribution sums to {sums[bad]!r}, not 1")
    P /= sums[:, None]
    rows = np.arange(len(tokens))
    mass = P[rows, tokens]
    sorted_p, ranks = _by_rank(P, tokens)
    edges = _base_edges(P.shape[1])
    return LawSummary(
        zero=~valid | (mass <= 0.0),
        informative=(P > 0).sum(axis=1) > 1,
        ranks=ranks,
        mass=mass,
        below=np.cumsum(sorted_p, axis=1)[rows, ranks] - mass,
        below_id=np.cumsum(P, axis=1)[rows, tokens] - mass,
        bins=np.add.reduceat(sorted_p, edges[:-1], axis=1),
        width=P.shape[1],
    )


def summarise(obs: Observations | LawSummary) -> LawSummary:
    """Observations (token, whole law) -> their LawSummary, a block of rows at
    a time. ValueError on a law that is negative, not finite or does not sum
    to 1 (within 1e-6; it is renormalised)."""
    if isinstance(obs, LawSummary):
        return obs
    parts, offset = [], 0
    for raw, P, lengths in _blocks(obs):
        parts.append(_summarise_block(raw, P, lengths, offset))
        offset += len(raw)
    if not parts:
        w = _width(obs)
        return LawSummary(np.zeros(0, bool), np.zeros(0, bool), np.zeros(0, np.int64), np.zeros(0), np.zeros(0),
                          np.zeros(0), np.zeros((0, len(_base_edges(w)) - 1)), w)
    return LawSummary.join(parts)


def zero_probability_violations(obs: Observations | LawSummary) -> list[int]:
    """Indices of observations whose token has target probability 0 (or lies
    outside the vocabulary). Any one is a failure: a lossless sampler never
    emits such a token."""
    return np.flatnonzero(summarise(obs).zero).tolist()


def filter_margin(raw: np.ndarray, token: int, sp) -> float:
    """How far `token` is from surviving sp's filters, relative: 0 when it
    survives, else the largest relative shortfall over top-k (its
    probability below the k-th), top-p (the smaller of: the mass ranked
    above it beyond top_p, and its probability below the crossing token's,
    which it replaces by overtaking it) and min-p (its probability below
    min_p * max), applied in the engine's order to `raw`, the law at
    temperature only (filters off), with the token kept through each. inf
    when raw gives it probability 0."""
    p = np.asarray(raw, dtype=np.float64).copy()
    if not 0 <= token < len(p) or p[token] <= 0:
        return math.inf
    worst, kept = 0.0, p > 0
    if sp.top_k is not None and sp.top_k < len(p):
        kth = np.sort(p)[-sp.top_k]
        worst = max(worst, (kth - p[token]) / kth)
        kept = p >= kth
        p = np.where(kept | (np.arange(len(p)) == token), p, 0.0)
        p /= p.sum()
    if sp.top_p is not None and sp.top_p < 1.0:
        above = p[p > p[token]].sum()  # the crossing token is kept: it survives while above < top_p
        crossing = _crossing(np.asarray(raw, dtype=np.float64)[kept], sp.top_p)
        worst = max(worst, min((above - sp.top_p) / sp.top_p, crossing / float(raw[token]) - 1.0))
        order = np.argsort(-p, kind="stable")
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), sp.top_p - 1e-12, side="left")) + 1]
        mask = np.zeros(len(p), dtype=bool)
        mask[keep] = True
        mask[token] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    if sp.min_p is not None and sp.min_p > 0.0:
        thr = sp.min_p * p.max()
        worst = max(worst, (thr - p[token]) / thr)
    return max(worst, 0.0)


def _crossing(kept: np.ndarray, top_p: float) -> float:
    """The smallest probability top-p keeps of `kept` (unnormalised): the crossing token's."""
    desc = np.sort(kept)[::-1]
    return float(desc[min(int(np.searchsorted(np.cumsum(desc) / desc.sum(), top_p - 1e-12)), len(desc) - 1)])


def filter_margins(raw: np.ndarray, sp) -> np.ndarray:
    """filter_margin for every token of one row at once, [V]: each token kept
    through top-k counts in the top-p normaliser, as the one-token form does;
    the min-p ratio to the top token needs no normaliser."""
    p = np.asarray(raw, dtype=np.float64)
    v = len(p)
    worst = np.zeros(v)
    keep = p > 0
    if sp.top_k is not None and sp.top_k < v:
        kth = np.partition(p, v - sp.top_k)[v - sp.top_k]
        worst = np.maximum(worst, (kth - p) / kth)
        keep &= p >= kth
    if sp.top_p is not None and sp.top_p < 1.0:
        asc = np.sort(p[keep])
        at_or_below = np.concatenate([[0.0], np.cumsum(asc)])[np.searchsorted(asc, p, side="right")]
        norm = asc.sum() + np.where(keep, 0.0, p)  # the token itself, when top-k dropped it
        with np.errstate(divide="ignore"):
            overtake = _crossing(p[keep], sp.top_p) / p - 1.0  # a token that overtakes the crossing one is kept
        worst = np.maximum(worst, np.minimum(((asc.sum() - at_or_below) / norm - sp.top_p) / sp.top_p, overtake))
    if sp.min_p is not None and sp.min_p > 0.0:
        thr = sp.min_p * p.max()
        worst = np.maximum(worst, (thr - p) / thr)
    worst = np.maximum(worst, 0.0)
    worst[p <= 0] = np.inf
    return worst


def boundary_mass(raw: np.ndarray, law: np.ndarray, sp, tolerance: float) -> float:
    """The most a correct float runtime emits boundary tokens at one position:
    with every token of target probability 0 that lies within `tolerance` of
    surviving the filters kept (ties and float flips, all at once), their share
    of the raw mass. A runtime that keeps some of them emits one less often."""
    raw = np.asarray(raw, dtype=np.float64)
    support = np.asarray(law) > 0
    zone = ~support & (filter_margins(raw, sp) <= tolerance)
    near = raw[zone].sum()
    return float(near / (raw[support].sum() + near)) if near > 0 else 0.0


def boundary_excess(count: int, masses: Sequence[float], alpha: float) -> TestResult:
    """Are there more boundary tokens than the boundary masses allow? Their
    count is a sum of independent Bernoulli(<= mass) draws, one per emitted
    position; its upper tail is at most Poisson's of the same mean at any
    count past mean + 1 (Anderson & Samuels), which gives the p-value."""
    mu = float(np.sum(masses))
    p = float(stats.poisson.sf(count - 1, mu)) if count >= mu + 1 else 1.0
    return TestResult(name="boundary-excess", alpha=alpha, n=len(masses), statistic=float(count), p_value=p, df=0,
                      detectable_tv=None, passed=p >= alpha,
                      note=f"{count} boundary tokens, at most {mu:.3g} expected from the boundary mass")


def _zero_result(name: str, alpha: float, n: int, bad: np.ndarray) -> TestResult:
    idx = np.flatnonzero(bad).tolist()
    return TestResult(
        name=name,
        alpha=alpha,
        n=n,
        statistic=math.inf,
        p_value=0.0,
        df=0,
        detectable_tv=None,
        passed=False,
        note=f"{len(idx)} token(s) of target probability 0 emitted (first at observation {idx[0]})",
        details={"zero_probability_indices": idx[:100]},
    )


# --------------------------------------------------------------------------
# the rank-space G-test


def _base_edges(vmax: int) -> list[int]:
    """Rank bins 0, 1, 2, 3-4, 5-8, 9-16, ... as edges [0, 1, 2, 3, 5, 9, 17, ...]."""
    edges = [0, 1, 2, 3]
    while edges[-1] < vmax:
        edges.append(2 * edges[-1] - 1)
    edges = [e for e in edges if e < vmax] + [vmax]
    return edges


def _merge(expected: np.ndarray, min_expected: float, n_bins: int | None) -> list[list[int]]:
    """Group consecutive base bins so that each group's expected count is >=
    min_expected (greedy from rank 0; a short tail joins the last group), then
    cap the number of groups at n_bins by merging the tail."""
    groups: list[list[int]] = []
    cur: list[int] = []
    mass = 0.0
    for b, e in enumerate(expected):
        cur.append(b)
        mass += e
        if mass >= min_expected:
            groups.append(cur)
            cur, mass = [], 0.0
    if cur:
        if groups:
            groups[-1].extend(cur)
        else:
            groups.append(cur)
    if n_bins is not None and len(groups) > n_bins:
        groups = groups[: n_bins - 1] + [sum(groups[n_bins - 1 :], [])]
    return groups


def rank_gtest(
    obs: Observations,
    n_bins: int | None = None,
    alpha: float = SUITE_ALPHA,
    *,
    min_expected: float = MIN_EXPECTED,
    power: float = DEFAULT_POWER,
) -> TestResult:
    """G-test that tokens follow their target laws, pooled across contexts in
    rank space.

    Each observation's token gets its rank under its own p (p sorted
    descending, ties broken by lower token id). Ranks are bucketed into bins
    0, 1, 2, 3-4, 5-8, 9-16, ...; adjacent bins are merged until each has an
    expected count >= `min_expected`, and at most `n_bins` bins are kept (the
    tail is merged) when given. The expected count of a bin is the sum over
    observations of each observation's own p-mass on the ranks of that bin,
    so contexts with different laws pool without a common law. The G
    statistic (scipy.stats.power_divergence, lambda_="log-likelihood"),
    divided by Williams' correction q = 1 + (bins + 1) / (6 n), is referred to
    chi-square with df = bins - 1; `statistic` is G / q, `details["g"]` is G.

    Under the null each observation's bin is an independent categorical
    draw; with heterogeneous laws the count covariance is below the
    multinomial one, so the chi-square reference is conservative (exact in
    the limit when all sorted laws coincide).

    One-hot (deterministic) observations carry no information and are left
    out (`n_dropped`). A token of probability 0 fails at once.
    """
    name = "rank_gtest"
    s = summarise(obs)
    n_all = len(s)
    if s.zero.any():
        return _zero_result(name, alpha, n_all, s.zero)
    s = s.take(s.informative)
    n = len(s)
    dropped = n_all - n
    if n_bins is not None and n_bins < 2:
        raise ValueError("n_bins must be >= 2")
    if n == 0:
        return TestResult(
            name=name, alpha=alpha, n=0, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
            passed=True, note="no informative observations: no test", n_dropped=dropped,
        )  # fmt: skip
    edges = _base_edges(s.width)
    base_expected = s.bins.sum(axis=0)
    base_observed = np.bincount(
        np.searchsorted(edges, s.ranks, side="right") - 1, minlength=len(edges) - 1
    )
    groups = _merge(base_expected, min_expected, n_bins)
    expected = np.array([base_expected[g].sum() for g in groups])
    observed = np.array([base_observed[g].sum() for g in groups])
    bins = [[edges[g[0]], edges[g[-1] + 1] - 1] for g in groups]
    details = {"bins": bins, "observed": observed.tolist(), "expected": expected.tolist()}
    if len(groups) < 2:
        return TestResult(
            name=name, alpha=alpha, n=n, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
            passed=True, n_dropped=dropped, details=details,
            note=f"fewer than 2 bins with expected count >= {min_expected}: no test",
        )  # fmt: skip
    expected = expected * (n / expected.sum())  # float rounding only; sum(p) == 1 per row
    g, _ = stats.power_divergence(observed, expected, lambda_="log-likelihood")
    df = len(groups) - 1
    g_w = float(g) / _williams(n, len(groups))
    p_value = float(stats.chi2.sf(g_w, df))
    details["g"] = float(g)
    tv = detectable_tv(n, len(groups), alpha, power)
    return TestResult(
        name=name,
        alpha=alpha,
        n=n,
        statistic=g_w,
        p_value=p_value,
        df=df,
        detectable_tv=tv,
        passed=bool(p_value > alpha),
        note=f"G-test over {len(groups)} rank bins; {dropped} deterministic observation(s) dropped",
        n_dropped=dropped,
        details=details,
    )


# --------------------------------------------------------------------------
# randomized PIT + KS


def pit_ks(
    obs: Observations,
    rng_seed: int = 0,
    alpha: float = SUITE_ALPHA,
    *,
    power: float = DEFAULT_POWER,
    order: str = "rank",
) -> TestResult:
    """Randomized probability integral transform, then KS against U(0, 1).

    order="id" takes the cdf in token-id order instead: the order in which
    inverse-cdf samplers map a uniform to a token, so uniforms shared between
    two draws show as PIT values out of place (SEED-STREAMS-INDEPENDENT).

    With tokens ordered by rank under their own p (descending, ties by
    lower id) and F the cdf in that order, u = F(r-1) + V * p[token] with
    V ~ U(0, 1) (seeded by `rng_seed`) is exactly U(0, 1) under the null for
    any p, so KS (scipy.stats.kstest) is exact. Less powerful than
    `rank_gtest` (needs roughly 2-4x the samples); kept as a cheap extra.

    KS gives no uniform total-variation guarantee: a deviation that
    alternates in sign over adjacent ranks has large TV and a tiny cdf
    distance. `detectable_tv` is therefore None; `details` carries
    `detectable_pit_sup`, the sup-distance between the PIT cdf and the
    identity detected with the given power, (c_alpha + c_beta) / sqrt(n) with
    c_x the upper-x quantile of the Kolmogorov distribution.
    """
    name = "pit_ks"
    s = summarise(obs)
    n_all = len(s)
    if s.zero.any():
        return _zero_result(name, alpha, n_all, s.zero)
    s = s.take(s.informative)
    n = len(s)
    dropped = n_all - n
    if n == 0:
        return TestResult(
            name=name, alpha=alpha, n=0, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
            passed=True, note="no informative observations: no test", n_dropped=dropped,
        )  # fmt: skip
    if order not in ("id", "rank"):
        raise ValueError(f"pit_ks: order={order!r}, expected 'rank' or 'id'")
    below = s.below_id if order == "id" else s.below
    v = np.random.default_rng(rng_seed).random(n)
    u = np.clip(below + v * s.mass, 0.0, 1.0)
    res = stats.kstest(u, "uniform")
    sup = (stats.kstwobign.isf(alpha) + stats.kstwobign.isf(1.0 - power)) / math.sqrt(n)
    return TestResult(
        name=name,
        alpha=alpha,
        n=n,
        statistic=float(res.statistic),
        p_value=float(res.pvalue),
        df=0,
        detectable_tv=None,
        passed=bool(res.pvalue > alpha),
        note=f"KS on randomized PIT ({order} order); {dropped} deterministic observation(s) dropped; "
        f"detects a PIT cdf sup-distance >= {sup:.4g} with power {power}",
        n_dropped=dropped,
        details={"detectable_pit_sup": sup, "rng_seed": rng_seed, "order": order},
    )


# --------------------------------------------------------------------------
# power


@lru_cache(maxsize=256)
def noncentrality(df: int, alpha: float, power: float = DEFAULT_POWER) -> float:
    """lambda with P(chi2_nc(df, lambda) > chi2.isf(alpha, df)) = power."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if not 0.0 < alpha < power < 1.0:
        raise ValueError("need 0 < alpha < power < 1")
    crit = stats.chi2.isf(alpha, df)
    f = lambda lam: stats.ncx2.sf(crit, df, lam) - power
    hi = max(1.0, crit)
    while f(hi) < 0.0:
        hi *= 2.0
    return float(optimize.brentq(f, 1e-12, hi, xtol=1e-10, rtol=1e-12))


def _williams(n: int, n_bins: int) -> float:
    """Williams' (1976) correction for a goodness-of-fit G: q = 1 + (k+1)/(6n)."""
    return 1.0 + (n_bins + 1) / (6.0 * n)


def detectable_tv(n: int, n_bins: int, alpha: float, power: float = DEFAULT_POWER) -> float:
    """Total-variation deviation that the rank G-test with `n_bins` bins
    (df = n_bins - 1) detects with probability >= `power` at level `alpha`
    from n observations, whatever its shape.

    Asymptotically (local alternatives) the G and Pearson statistics are
    noncentral chi-square with noncentrality n * chi2(r || p), where
    chi2(r || p) = sum_b (r_b - p_b)^2 / p_b is the chi-square divergence
    between the alternative r and the null p, both the pooled laws of the
    rank bin. Power `power` is reached once n * chi2(r || p) >= lambda * q,
    lambda from `noncentrality`, q = 1 + (n_bins + 1) / (6 n) the Williams
    factor `rank_gtest` divides G by (q -> 1; it adds ~1 sample).

    The bound used: TV(r, p) <= sqrt(chi2(r || p)) / 2, by Cauchy-Schwarz
    (sum |r-p| = sum (|r-p|/sqrt p) sqrt p <= sqrt(chi2) * sqrt(sum p)).
    Hence TV >= sqrt(lambda q / n) / 2 forces chi2 >= lambda q / n, and the test
    has power >= `power`. This is the worst case over shapes: equality needs
    |r - p| proportional to p on the support, and any other deviation of the
    same TV has a larger chi-square divergence and is detected sooner, so
    the figure is conservative. The same figure holds in the large-deviation
    view of G, whose noncentrality is 2 n KL(r || p): Pinsker's inequality
    KL >= 2 TV^2 gives 2 n KL >= 4 n TV^2 >= lambda q as well.

    The TV is that of the rank-bin law (pooled over observations), which is
    at most the token-level TV: deviations that only permute tokens within
    a bin, or that cancel between contexts, are not seen by this test.
    A value >= 1 means no deviation is guaranteed to be detected."""
    if n < 1:
        return math.inf
    lam = noncentrality(n_bins - 1, alpha, power)
    return 0.5 * math.sqrt(lam * _williams(n, n_bins) / n)


def samples_for_tv(tv: float, n_bins: int, alpha: float, power: float = DEFAULT_POWER) -> int:
    """Smallest n with detectable_tv(n, n_bins, alpha, power) <= tv."""
    if not 0.0 < tv <= 1.0:
        raise ValueError("tv must be in (0, 1]")
    lam = noncentrality(n_bins - 1, alpha, power)
    n = max(1, math.ceil(lam / (4.0 * tv * tv)))
    while detectable_tv(n, n_bins, alpha, power) > tv:  # guard float rounding of the ceil
        n += 1
    return n


# --------------------------------------------------------------------------
# truncated laws: the top N probabilities of each row, the rest one tail
#
# HTTP servers return the top N log-probabilities (vLLM: 20 by default), not
# the whole law. A truncated row holds those N probabilities (zeros
# elsewhere) and sums to 1 - m, m the tail mass. Both tests below coarsen
# the whole-law tests so that they stay exact under the null: ranks >= N
# pool into one tail bin (expected mass m), and the PIT of a tail token is
# uniform on [1 - m, 1]. The power this costs is in docs/statistics.md.


def truncate_laws(P: np.ndarray, top_n: int) -> np.ndarray:
    """Whole laws [n, V] -> their top-`top_n` rows (ties by lower id), zeros elsewhere."""
    P = np.array(P, dtype=np.float64, ndmin=2)
    if top_n >= P.shape[1]:
        return P
    order = np.argsort(-P, axis=1, kind="stable")
    out = np.zeros_like(P)
    keep = order[:, :top_n]
    rows = np.arange(len(P))[:, None]
    out[rows, keep] = P[rows, keep]
    return out


@dataclass(frozen=True, eq=False)
class TopLawSummary:
    """What the truncated tests read of each observation: its top-N masses
    in rank order and its tail, [n, N + 1], built by `summarise_truncated`."""

    zero: np.ndarray  # [n] bool: provably of probability 0 (see _truncated_zero)
    informative: np.ndarray  # [n] bool: more than one place for the token (listed tokens and the tail)
    ranks: np.ndarray  # [n] int: the token's rank in the top N, N for a tail token
    masses: np.ndarray  # [n, N + 1] float64: the top N in rank order, then the tail
    top_n: int

    def __len__(self) -> int:
        return len(self.zero)

    def take(self, keep: np.ndarray) -> TopLawSummary:
        return TopLawSummary(self.zero[keep], self.informative[keep], self.ranks[keep], self.masses[keep], self.top_n)

    @property
    def tail(self) -> np.ndarray:
        return self.masses[:, -1]

    @staticmethod
    def join(parts: Sequence[TopLawSummary], top_n: int) -> TopLawSummary:
        """One summary of several samples' observations (of one vocabulary), in order."""
        cat = lambda name: np.concatenate([getattr(s, name) for s in parts]) if parts else np.zeros(0)
        masses = np.concatenate([s.masses for s in parts]) if parts else np.zeros((0, top_n + 1))
        return TopLawSummary(cat("zero").astype(bool), cat("informative").astype(bool), cat("ranks").astype(np.int64),
                             masses, top_n)


def _truncated_zero(valid: np.ndarray, listed: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """A token of probability 0: outside the vocabulary, or outside the top N
    of a row whose tail is empty (a named top-N token always has p > 0)."""
    return ~valid | (~listed & (tail <= 0.0))


def _summarise_truncated_block(raw, P, offset, top_n) -> TopLawSummary:
    valid = (raw >= 0) & (raw < P.shape[1])
    tokens = np.where(valid, raw, 0)
    _check_finite(P)
    if np.any((P > 0).sum(axis=1) > top_n):
        raise ValueError(f"a truncated row holds more than top_n={top_n} nonzero probabilities")
    sums = P.sum(axis=1)
    if np.any(sums > 1.0 + 1e-6):
        bad = int(np.argmax(sums))
        raise ValueError(f"observation {offset + bad}: truncated law sums to {sums[bad]!r} > 1")
    tail = np.clip(1.0 - sums, 0.0, 1.0)
    tail[tail < 1e-9] = 0.0  # float rounding of a whole law
    listed = P[np.arange(len(tokens)), tokens] > 0
    sorted_p, ranks = _by_rank(P, tokens)
    return TopLawSummary(
        zero=_truncated_zero(valid, listed, tail),
        informative=((P > 0).sum(axis=1) + (tail > 0)) > 1,
        ranks=np.where(listed, ranks, top_n),
        masses=np.concatenate([sorted_p[:, :top_n], tail[:, None]], axis=1),
        top_n=top_n,
    )


def summarise_truncated(obs: Observations | TopLawSummary, top_n: int) -> TopLawSummary:
    """Observations (token, top-N law) -> their TopLawSummary, a block at a
    time. ValueError on a row that is negative, not finite, lists more than
    top_n tokens or sums above 1."""
    if top_n < 1:
        raise ValueError("top_n must be >= 1")
    if isinstance(obs, TopLawSummary):
        return obs
    parts, offset = [], 0
    for raw, P, _ in _blocks(obs):
        parts.append(_summarise_truncated_block(raw, P, offset, top_n))
        offset += len(raw)
    return TopLawSummary.join(parts, top_n)


def truncated_zero_probability_violations(obs: Observations | TopLawSummary, top_n: int) -> list[int]:
    """DIST-ZERO on truncated laws: only tokens that are provably of
    probability 0 (see :func:`_truncated_zero`) count."""
    return np.flatnonzero(summarise_truncated(obs, top_n).zero).tolist()


def _truncated_informative(obs, top_n: int, name: str, alpha: float):
    """The shared start of the truncated tests: a zero-probability token fails
    at once; deterministic rows are dropped; no row left is no test. Returns
    (an early TestResult or None, (the informative rows' summary, n, dropped))."""
    s = summarise_truncated(obs, top_n)
    n_all = len(s)
    if s.zero.any():
        return _zero_result(name, alpha, n_all, s.zero), (None,) * 3
    s = s.take(s.informative)
    n = len(s)
    dropped = n_all - n
    if n == 0:
        return TestResult(name=name, alpha=alpha, n=0, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
                          passed=True, note="no informative observations: no test", n_dropped=dropped), (None,) * 3
    return None, (s, n, dropped)


def truncated_rank_gtest(
    obs: Observations,
    top_n: int,
    n_bins: int | None = None,
    alpha: float = SUITE_ALPHA,
    *,
    min_expected: float = MIN_EXPECTED,
    power: float = DEFAULT_POWER,
) -> TestResult:
    """:func:`rank_gtest` on truncated laws: rank bins 0, 1, 2, 3-4, ... up to
    rank N-1, then one bin for every rank >= N with expected count the summed
    tail masses; bins merged as in :func:`rank_gtest`. Whole laws (tail 0
    everywhere) give the whole-law test cut at rank N."""
    name = "truncated_rank_gtest"
    early, (s, n, dropped) = _truncated_informative(obs, top_n, name, alpha)
    if early is not None:
        return early
    ranks, masses = s.ranks, s.masses
    edges = _base_edges(top_n) + [top_n + 1]  # ..., N (the tail bin)
    base_expected = np.add.reduceat(masses, edges[:-1], axis=1).sum(axis=0)
    base_observed = np.bincount(np.searchsorted(edges, ranks, side="right") - 1, minlength=len(edges) - 1)
    groups = _merge(base_expected, min_expected, n_bins)
    expected = np.array([base_expected[g].sum() for g in groups])
    observed = np.array([base_observed[g].sum() for g in groups])
    bins = [[edges[g[0]], edges[g[-1] + 1] - 1] for g in groups]
    details = {"bins": bins, "observed": observed.tolist(), "expected": expected.tolist(), "top_n": top_n,
               "tail_observed": int((ranks == top_n).sum()), "tail_expected": float(s.tail.sum())}
    if len(groups) < 2:
        return TestResult(name=name, alpha=alpha, n=n, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
                          passed=True, n_dropped=dropped, details=details,
                          note=f"fewer than 2 bins with expected count >= {min_expected}: no test")
    expected = expected * (n / expected.sum())
    g, _ = stats.power_divergence(observed, expected, lambda_="log-likelihood")
    df = len(groups) - 1
    g_w = float(g) / _williams(n, len(groups))
    p_value = float(stats.chi2.sf(g_w, df))
    details["g"] = float(g)
    return TestResult(
        name=name, alpha=alpha, n=n, statistic=g_w, p_value=p_value, df=df,
        detectable_tv=detectable_tv(n, len(groups), alpha, power), passed=bool(p_value > alpha),
        note=f"G-test over {len(groups)} rank bins of top-{top_n} laws (ranks >= {top_n} pooled); "
        f"{dropped} deterministic observation(s) dropped",
        n_dropped=dropped, details=details,
    )


def truncated_pit_ks(
    obs: Observations,
    top_n: int,
    rng_seed: int = 0,
    alpha: float = SUITE_ALPHA,
    *,
    power: float = DEFAULT_POWER,
) -> TestResult:
    """:func:`pit_ks` on truncated laws: a top-N token's PIT as before, a tail
    token's uniform on [1 - m, 1] (m its row's tail mass): still exactly U(0, 1)
    under the null, since the tail is reached with probability m."""
    name = "truncated_pit_ks"
    early, (s, n, dropped) = _truncated_informative(obs, top_n, name, alpha)
    if early is not None:
        return early
    ranks, masses = s.ranks, s.masses
    rows = np.arange(n)
    masses = masses / masses.sum(axis=1, keepdims=True)
    mass = masses[rows, ranks]
    below = np.cumsum(masses, axis=1)[rows, ranks] - mass
    v = np.random.default_rng(rng_seed).random(n)
    u = np.clip(below + v * mass, 0.0, 1.0)
    res = stats.kstest(u, "uniform")
    sup = (stats.kstwobign.isf(alpha) + stats.kstwobign.isf(1.0 - power)) / math.sqrt(n)
    return TestResult(
        name=name, alpha=alpha, n=n, statistic=float(res.statistic), p_value=float(res.pvalue), df=0,
        detectable_tv=None, passed=bool(res.pvalue > alpha),
        note=f"KS on randomized PIT of top-{top_n} laws (tail tokens uniform over the tail mass); "
        f"{dropped} deterministic observation(s) dropped",
        n_dropped=dropped, details={"detectable_pit_sup": sup, "rng_seed": rng_seed, "top_n": top_n},
    )
