"""The token-resolution test of DIST-CONTEXT: one multinomial G-test per
repeated context, summed over contexts.

The pooled rank G-test (`stats.rank_gtest`) sees a bug only through the
rank-bin law averaged over contexts. A bias that tilts output towards the
draft's favourite tokens (which sit at different target ranks in different
contexts) cancels there. Here each context keeps its own cells: a context
reached n times is n draws from its target law p, compared token by token.

Null: given how often a context is reached, the tokens drawn there are
independent draws from its p (what happened before the context decides only
whether it is reached; what is drawn there decides only what comes after).
Each context's G (bins merged to expected >= MIN_EXPECTED, Williams-corrected)
is asymptotically chi-square with (its bins - 1) df, and independent contexts
add: the sum is referred to chi-square with the summed df.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from .stats import MIN_EXPECTED, SUITE_ALPHA, TestResult, _merge, _williams

__all__ = ["ContextDraws", "context_gtest"]

# a truncated law (top-N probabilities of a runtime) leaves 1 - sum(p) to the
# tokens it does not list; below this the law is whole and float rounding only
TAIL_EPS = 1e-9


@dataclass(frozen=True)
class ContextDraws:
    """Tokens drawn at one context and that context's target law."""

    label: str  # for messages: which prompt, which prefix
    tokens: np.ndarray  # (n,) int: the token emitted at this context, once per visit
    p: np.ndarray  # (V,) float64: the processed target law here (may be top-N truncated)


def _cells(d: ContextDraws) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Observed and expected counts per cell: tokens of positive p in
    descending p (ties by token id), then a tail cell for what a truncated
    law does not list. Returns observed, expected, token id per cell (-1 = tail)."""
    p = np.asarray(d.p, dtype=np.float64)
    n = len(d.tokens)
    support = np.flatnonzero(p > 0)
    order = support[np.lexsort((support, -p[support]))]
    counts = np.bincount(d.tokens, minlength=len(p))
    observed, expected, ids = counts[order].astype(float), n * p[order], order.tolist()
    tail = max(0.0, 1.0 - float(p[support].sum()))
    if tail > TAIL_EPS:
        observed = np.append(observed, n - observed.sum())
        expected, ids = np.append(expected, n * tail), ids + [-1]
    return observed, expected, ids


def context_gtest(draws: Sequence[ContextDraws], alpha: float = SUITE_ALPHA, *,
                  min_expected: float = MIN_EXPECTED) -> TestResult:
    """Summed per-context G-test (see module docstring). Contexts whose
    merged cells number fewer than two (too few visits, or a near one-hot
    law) carry no test and are counted in `details["contexts_skipped"]`. A
    token of probability 0 under a whole law fails at once."""
    name = "context_gtest"
    g_total, df_total, n_total, used, skipped, parts = 0.0, 0, 0, 0, 0, []
    for d in draws:
        p = np.asarray(d.p, dtype=np.float64)
        tokens = np.asarray(d.tokens, dtype=np.int64)
        whole = 1.0 - float(p[p > 0].sum()) <= TAIL_EPS
        zero = tokens[p[tokens] <= 0] if whole else np.array([], dtype=np.int64)
        if len(zero):
            return TestResult(name=name, alpha=alpha, n=len(tokens), statistic=float("inf"), p_value=0.0, df=0,
                              detectable_tv=None, passed=False,
                              note=f"{d.label}: token {int(zero[0])} has target probability 0 "
                                   f"({len(zero)} of {len(tokens)} draws)")
        observed, expected, ids = _cells(ContextDraws(d.label, tokens, p))
        groups = _merge(expected, min_expected, None)
        if len(groups) < 2 or expected[groups[-1]].sum() < min_expected:
            skipped += 1
            continue
        o = np.array([observed[g].sum() for g in groups])
        e = np.array([expected[g].sum() for g in groups])
        g_c, _ = stats.power_divergence(o, e * (o.sum() / e.sum()), lambda_="log-likelihood")
        g_c = float(g_c) / _williams(len(tokens), len(groups))
        df_c = len(groups) - 1
        g_total, df_total, n_total, used = g_total + g_c, df_total + df_c, n_total + len(tokens), used + 1
        # the cell furthest above its expectation names the tilt in a message
        excess = (observed - expected) / len(tokens)
        top = int(np.argmax(excess))
        parts.append({"context": d.label, "n": len(tokens), "g": round(g_c, 3), "df": df_c,
                      "z": round((g_c - df_c) / np.sqrt(2 * df_c), 2),
                      "tv": round(0.5 * float(np.abs(excess).sum()), 4),
                      "most_over": {"token": ids[top], "observed": round(observed[top] / len(tokens), 4),
                                    "target": round(expected[top] / len(tokens), 4)}})
    details = {"contexts_used": used, "contexts_skipped": skipped,
               "top_contexts": sorted(parts, key=lambda r: -r["z"])[:5]}
    if df_total == 0:
        return TestResult(name=name, alpha=alpha, n=0, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
                          passed=True, details=details,
                          note=f"no context reached often enough for two cells of expected count >= {min_expected}: no test")
    p_value = float(stats.chi2.sf(g_total, df_total))
    return TestResult(name=name, alpha=alpha, n=n_total, statistic=g_total, p_value=p_value, df=df_total,
                      detectable_tv=None, passed=bool(p_value > alpha), details=details,
                      note=f"G summed over {used} contexts ({skipped} with too few visits skipped)")
