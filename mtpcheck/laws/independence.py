"""Independence of random streams, judged from emitted tokens alone.

Seed 000: "Target and draft random streams are independent." Two black-box
consequences are tested here, both by counting *coincidences* whose
conditional probability under independence is known (or bounded) at each
step from the processed target laws:

* `agreement_series` - under two different seeds, the token emitted at
  position n + lag of one run equals the token at position n of the other.
  Independent runs agree with probability `sum_x pA(x) pB(x)` given both
  prefixes; shared draws (seed + position keys, truncated seeds, ...) make
  them agree far more often.
* `closeness_series` - the same pairs of positions, through randomized PIT
  values (`pit_values`): under a lossless sampler each run's PIT values are
  i.i.d. U(0, 1) and two independent runs' are independent, so two of them
  lie within delta of each other with probability 2 delta - delta^2
  exactly. A sampler that inverts the cdf with a shared uniform puts both
  PIT values next to that uniform even where the laws (and so the tokens)
  differ: far more power than token agreement on such samplers, while
  agreement covers samplers that share noise some other way (Gumbel-max).
* `acceptance_series` - with exact-match acceptance a proposal is accepted
  iff it equals the target's own draw. A draft drawn independently of the
  target's randomness equals it with probability `sum_x q(x) p(x) <= max p`,
  whatever the draft law q; a draft that reuses the target's uniform lands
  on the target's draw far more often.

`together_test` (UNSEEDED-INDEPENDENT) needs no law at all: identical
unseeded requests served together against the same requests served alone,
an exact permutation test on identical outputs (its docstring).

`coincidence_test` turns such series into a test with a known null and no
asymptotics: for each lambda of a grid, `prod exp(lambda h) / (1 - pi +
pi e^lambda)` over the series is a nonnegative (super)martingale with
expectation <= 1 under the null whatever the dependence of pi on the past
(pi is predictable: it depends only on tokens revealed before). Averages of
such e-values over the grid and over series are e-values again, and
Markov's inequality gives P(E >= 1/alpha) <= alpha. So p = min(1, 1/E) is a
valid p-value, exact in the sense of needing no distributional
approximation (conservative, never optimistic). See docs/statistics.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from fractions import Fraction

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from .stats import TestResult

__all__ = ["EMPIRICAL_ALPHA", "LAMBDAS", "acceptance_series", "agreement_series", "closeness_series",
           "coincidence_test", "identical_pairs", "log_evalue", "pit_values", "series_p_value", "series_test",
           "together_law", "together_test"]

# Bets on "more coincidences than the null allows": small lambdas win on a
# weak excess over many steps, large ones on a strong excess over few.
LAMBDAS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


def log_evalue(hits: np.ndarray, probs: np.ndarray, lambdas: Sequence[float] = LAMBDAS) -> float:
    """log of the grid-averaged test martingale of one series. `probs[i]` is
    the null probability (or an upper bound) of `hits[i] == 1` given the past."""
    h = np.asarray(hits, dtype=np.float64)
    pi = np.clip(np.asarray(probs, dtype=np.float64), 0.0, 1.0)
    if not len(h):
        return 0.0
    lam = np.asarray(lambdas, dtype=np.float64)[:, None]
    logs = (lam * h[None] - np.log1p(pi[None] * np.expm1(lam))).sum(axis=1)
    return float(logsumexp(logs) - math.log(len(lambdas)))


def agreement_series(tokens_a: Sequence[int], laws_a: np.ndarray, tokens_b: Sequence[int], laws_b: np.ndarray,
                     lag: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (a[n + lag], b[n]): hits = tokens agree, probs = sum_x pA(x) pB(x).
    Walking n upwards, each pair's tokens are new (a[:lag] count as known at
    the start), so the probability is predictable."""
    a, b = np.asarray(tokens_a), np.asarray(tokens_b)
    if lag < 0:
        return agreement_series(tokens_b, laws_b, tokens_a, laws_a, -lag)
    n = max(0, min(len(a) - lag, len(b)))
    hits = (a[lag : lag + n] == b[:n]).astype(np.float64)
    la, lb = np.asarray(laws_a, dtype=np.float64)[lag : lag + n], np.asarray(laws_b, dtype=np.float64)[:n]
    probs = np.einsum("nv,nv->n", la, lb)
    tail_a, tail_b = np.clip(1.0 - la.sum(axis=1), 0.0, 1.0), np.clip(1.0 - lb.sum(axis=1), 0.0, 1.0)
    if np.any(tail_a > 1e-9) or np.any(tail_b > 1e-9):
        probs = probs + _unlisted_bound(la, lb, tail_a, tail_b)
    return hits, np.minimum(probs, 1.0)


def _unlisted_bound(la: np.ndarray, lb: np.ndarray, tail_a: np.ndarray, tail_b: np.ndarray) -> np.ndarray:
    """Top-N rows (a server's logprobs) leave the unlisted tokens' mass out of
    sum_x pA(x) pB(x). An unlisted token's probability is at most the smallest
    listed one of its row (m), so the missing part is at most
    mB * (A's mass on tokens B does not list) + mA * (B's mass on tokens A does
    not list) + min(mA tailB, mB tailA): an upper bound keeps the null valid."""
    inf = np.inf

    def smallest(rows):
        m = np.where(rows > 0, rows, inf).min(axis=1)
        return np.where(np.isfinite(m), m, 1.0)

    ma, mb = smallest(la), smallest(lb)
    a_only = np.where((la > 0) & (lb <= 0), la, 0.0).sum(axis=1)
    b_only = np.where((lb > 0) & (la <= 0), lb, 0.0).sum(axis=1)
    return mb * a_only + ma * b_only + np.minimum(ma * tail_b, mb * tail_a)


def pit_values(tokens: Sequence[int], laws: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Randomized PIT in token-id order: F(x - 1) + V p(x), V ~ U(0, 1) from the
    suite's own generator. Exactly U(0, 1) and i.i.d. along a run whose tokens
    follow their laws (the PIT of a sequential process)."""
    t = np.asarray(tokens, dtype=np.int64)
    laws = np.asarray(laws, dtype=np.float64)
    idx = np.arange(len(t))
    below = np.cumsum(laws, axis=1)[idx, t] - laws[idx, t]
    return below + laws[idx, t] * rng.random(len(t))


def closeness_series(pit_a: np.ndarray, pit_b: np.ndarray, lag: int, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (a[n + lag], b[n]) of PIT values: hits = within delta, probs =
    2 delta - delta^2 (two independent uniforms). Each value enters once per
    lag, so the hits are i.i.d. under the null."""
    if lag < 0:
        return closeness_series(pit_b, pit_a, -lag, delta)
    n = max(0, min(len(pit_a) - lag, len(pit_b)))
    hits = (np.abs(np.asarray(pit_a)[lag : lag + n] - np.asarray(pit_b)[:n]) <= delta).astype(np.float64)
    return hits, np.full(n, 2 * delta - delta * delta)


def acceptance_series(n_tokens: int, laws: np.ndarray, accept_lens: Sequence[int], draft_lens: Sequence[int],
                      first_token_from_prefill: bool = True, q_laws: np.ndarray | None = None,
                      rule: str = "exact_match") -> tuple[np.ndarray, np.ndarray]:
    """Proposals as trials, from the report and the emitted tokens: round r
    tries proposals j = 0..min(a_r, d_r - 1) (each accepted one, then the
    first rejected one), proposal j standing at output index e_r + j (e_r
    tokens emitted before the round). hits = accepted; probs = the chance of
    acceptance with independent streams: without the proposal law, max_x p(x)
    at that index (the most an exact-match draft can match the target's
    draw); with it (q_laws), exactly sum_x min(p, q) (rejection) or
    sum_x p q (exact match)."""
    hits, probs = [], []
    emitted = int(first_token_from_prefill)
    for a, d in zip(accept_lens, draft_lens, strict=False):
        for j in range(min(a + 1, d)):
            i = emitted + j
            if i >= n_tokens:
                break
            hits.append(1.0 if j < a else 0.0)
            if q_laws is None:
                probs.append(float(np.max(laws[i])))
            else:
                both = np.minimum(laws[i], q_laws[i]) if rule == "rejection" else laws[i] * q_laws[i]
                probs.append(float(min(1.0, both.sum())))
        emitted += a + 1
    return np.asarray(hits), np.asarray(probs)


def role_laws(p: np.ndarray, q: np.ndarray, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """The law of the emitted token given its role, for one proposal drawn
    from q against target law p with the draft's and the target's randomness
    independent: (given accepted, given rejected). Rejection: min(p, q) and
    (p - q)+; exact match: p q and p (1 - q); each normalised (all zeros where
    the role has probability zero: a token emitted in it is impossible)."""
    if rule == "rejection":
        acc, rej = np.minimum(p, q), np.maximum(p - q, 0.0)
    elif rule == "exact_match":
        acc, rej = p * q, p * (1.0 - q)
    else:
        raise ValueError(f"role_laws: no role laws for acceptance rule {rule!r}")
    return tuple(x / x.sum() if x.sum() > 0 else x for x in (acc, rej))


def role_observations(tokens: Sequence[int], p_laws: np.ndarray, q_laws: np.ndarray, accept_lens: Sequence[int],
                      draft_lens: Sequence[int], rule: str, first_token_from_prefill: bool = True) -> list[tuple]:
    """(token, law given its role, role) for every token the report places in
    a round. A round of a accepted of d proposals emits a accepted proposals,
    then a correction (a < d) or a bonus (a = d) drawn from p; a round with no
    draft emits one plain token from p. Given the past (tokens and roles) and
    its own role, each token follows its role's law; so, as in DIST-EQUIV, the
    pooled observations are a sequence of draws from predictable laws."""
    obs, e = [], int(first_token_from_prefill)
    for a, d in zip(accept_lens, draft_lens, strict=False):
        for j in range(a + 1):
            i = e + j
            if i >= len(tokens):
                break
            if j < d:
                acc, rej = role_laws(p_laws[i], q_laws[i], rule)
                obs.append((int(tokens[i]), acc, "accepted") if j < a else (int(tokens[i]), rej, "correction"))
            else:
                obs.append((int(tokens[i]), p_laws[i], "bonus" if d else "plain"))
        e += a + 1
    return obs


def coincidence_test(name: str, series: Mapping[str, tuple[np.ndarray, np.ndarray]], alpha: float) -> TestResult:
    """One test over several series (e.g. seed pairs x lags): E = mean of their
    e-values (valid under any dependence between series), p = min(1, 1/E).
    `details` names each series' hits against their null expectation."""
    if not series:
        return TestResult(name=name, alpha=alpha, n=0, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
                          passed=True, note="no coincidence series")
    series = {str(k): v for k, v in series.items()}
    logs = {k: log_evalue(h, p) for k, (h, p) in series.items()}
    log_e = float(logsumexp(list(logs.values())) - math.log(len(logs)))
    p_value = float(min(1.0, math.exp(-log_e)))
    n = int(sum(len(h) for h, _ in series.values()))
    worst = max(logs, key=logs.get)
    h, p = series[worst]
    details = {k: {"n": len(series[k][0]), "hits": int(series[k][0].sum()), "expected": float(series[k][1].sum()),
                   "log10_e": logs[k] / math.log(10)} for k in series}
    note = f"strongest: {worst}, {int(h.sum())} coincidences where independence allows {p.sum():.1f} of {len(h)}"
    return TestResult(name=name, alpha=alpha, n=n, statistic=log_e, p_value=p_value, df=0, detectable_tv=None,
                      passed=p_value > alpha, note=note, details=details)


def series_p_value(hits: np.ndarray, probs: np.ndarray) -> tuple[float, str]:
    """A valid p-value of one series for "more coincidences than the null",
    and how it was made. A series whose null probability is one constant
    (PIT closeness: i.i.d. Bernoulli(2 delta - delta^2) under the null) gets
    the exact binomial tail; one whose probability moves with the past
    (token agreement) gets 1 / E of its test martingale (Markov)."""
    h, p = np.asarray(hits, dtype=np.float64), np.asarray(probs, dtype=np.float64)
    if not len(h):
        return 1.0, "empty"
    if np.ptp(p) == 0.0:
        k = int(round(h.sum()))
        return float(stats.binom.sf(k - 1, len(h), float(p[0]))) if k else 1.0, "binomial tail"
    return float(min(1.0, math.exp(-log_evalue(h, p)))), "1/E"


def series_test(name: str, series: Mapping[str, tuple[np.ndarray, np.ndarray]], alpha: float) -> TestResult:
    """SEED-INDEPENDENT's combination: each series' own valid p-value
    (`series_p_value`), then Bonferroni over the K series, p = min(1, K min p_k).
    A collision lights up one pair shape at one alignment, so the strongest
    series pays only log K against the others (the mean of e-values,
    `coincidence_test`, paid the same log K and, through Markov's bound, far
    more on the series whose exact tail is known). Valid under any
    dependence between series."""
    if not series:
        return TestResult(name=name, alpha=alpha, n=0, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
                          passed=True, note="no coincidence series")
    series = {str(k): v for k, v in series.items()}
    ps = {k: series_p_value(h, p) for k, (h, p) in series.items()}
    worst = min(ps, key=lambda k: ps[k][0])
    p_value = float(min(1.0, len(series) * ps[worst][0]))
    n = int(sum(len(h) for h, _ in series.values()))
    h, p = series[worst]
    details = {k: {"n": len(series[k][0]), "hits": int(series[k][0].sum()), "expected": float(series[k][1].sum()),
                   "p_value": ps[k][0], "method": ps[k][1]} for k in series}
    note = (f"strongest: {worst}, {int(h.sum())} coincidences where independence allows {p.sum():.1f} of {len(h)} "
            f"(p {ps[worst][0]:.3g} by {ps[worst][1]}, x {len(series)} series)")
    return TestResult(name=name, alpha=alpha, n=n, statistic=-math.log10(max(ps[worst][0], 1e-300)), p_value=p_value,
                      df=0, detectable_tv=None, passed=p_value > alpha, note=note, details=details)


def identical_pairs(outputs: Sequence[Hashable]) -> int:
    """Pairs of equal outputs among `outputs`."""
    return sum(c * (c - 1) // 2 for c in Counter(outputs).values())


def together_law(together: Sequence[Hashable], alone: Sequence[Hashable]) -> dict[int, int]:
    """The permutation law of identical_pairs(together) given the pooled
    outputs of one stratum: {pairs: labellings}, over the C(n, k) ways to call
    k of the n = len(together) + len(alone) outputs "together". Exact: the
    equality classes are walked one by one, choosing how many of each fall
    in the together group (a multivariate hypergeometric, in integers)."""
    k = len(together)
    ways: dict[tuple[int, int], int] = {(0, 0): 1}
    for c in Counter([*together, *alone]).values():
        grown: dict[tuple[int, int], int] = {}
        for (taken, pairs), w in ways.items():
            for x in range(min(c, k - taken) + 1):
                key = (taken + x, pairs + x * (x - 1) // 2)
                grown[key] = grown.get(key, 0) + w * math.comb(c, x)
        ways = grown
    return {pairs: w for (taken, pairs), w in ways.items() if taken == k}


def _convolve(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for x, u in a.items():
        for y, v in b.items():
            out[x + y] = out.get(x + y, 0) + u * v
    return out


def _copies_reach(together_n: int, alone: Sequence[Hashable]) -> list[tuple[float, float]]:
    """(probability, p-value factor) of one stratum when its `together_n`
    outputs are copies of one output v: the factor is the chance that a
    random labelling puts together_n copies of one output together,
    sum over classes C(c, k) / C(n, k). v is drawn by a plug-in of the law
    from the alone outputs: each of them with probability 1 / (m + 1), an
    output none of them equals with 1 / (m + 1) (m = len(alone))."""
    k, m = together_n, len(alone)
    classes = Counter(alone)
    total = math.comb(k + m, k)

    def factor(sizes) -> float:
        return float(Fraction(sum(math.comb(c, k) for c in sizes), total))

    out = [(1 / (m + 1), factor([k, *classes.values()]))]
    for v, c in classes.items():
        out.append((c / (m + 1), factor([c + k, *(d for u, d in classes.items() if u != v)])))
    return out


def together_test(name: str, strata: Mapping[str, tuple[Sequence[Hashable], Sequence[Hashable]]],
                  alpha: float) -> TestResult:
    """UNSEEDED-INDEPENDENT: do outputs served together coincide more often
    than outputs of the same requests served alone? Each stratum is (the
    outputs of k identical unseeded requests served together, those of the
    same request served alone). If serving together changes nothing, the
    outputs of a stratum are i.i.d. and every labelling of k of them as
    "together" is equally likely given the pooled outputs; the statistic,
    identical pairs among the together outputs summed over strata, then has
    the exact law of `together_law` convolved over strata, whatever the
    output law (the requests served alone are the empirical null: no ground
    truth). p = that law's upper tail at the observed count, exact.

    `details["power"]`: the chance that complete sharing (each stratum's
    together outputs copies of one output) would reach alpha, with the copied
    output drawn by a plug-in of the law from the alone outputs
    (`_copies_reach`): near 1 for a law with entropy, near 0 for a
    near-deterministic one, where outputs coincide anyway."""
    if not strata:
        return TestResult(name=name, alpha=alpha, n=0, statistic=0.0, p_value=1.0, df=0, detectable_tv=None,
                          passed=True, note="no strata")
    law, observed, total, details = {0: 1}, 0, 1, {}
    reach = {1.0: 1.0}  # p-value of complete sharing -> probability
    for key, (together, alone) in strata.items():
        together, alone = list(together), list(alone)
        t = identical_pairs(together)
        law = _convolve(law, together_law(together, alone))
        total *= math.comb(len(together) + len(alone), len(together))
        observed += t
        grown: dict[float, float] = {}
        options = _copies_reach(len(together), alone)
        for p_so_far, w in reach.items():
            for prob, f in options:
                grown[p_so_far * f] = grown.get(p_so_far * f, 0.0) + w * prob
        reach = grown
        details[str(key)] = {"together": len(together), "alone": len(alone), "together_pairs": t,
                             "alone_pairs": identical_pairs(alone)}
    p_value = float(Fraction(sum(w for x, w in law.items() if x >= observed), total))
    expected = float(Fraction(sum(x * w for x, w in law.items()), total))
    power = float(sum(w for p, w in reach.items() if p <= alpha))
    alone_pairs = sum(d["alone_pairs"] for d in details.values())
    note = (f"{observed} identical pairs among outputs served together, {expected:.2f} expected from the same "
            f"requests served alone ({alone_pairs} identical pairs among those), over {len(strata)} strata")
    n = int(sum(d["together"] + d["alone"] for d in details.values()))
    return TestResult(name=name, alpha=alpha, n=n, statistic=float(observed), p_value=p_value, df=0,
                      detectable_tv=None, passed=p_value > alpha, note=note,
                      details={"strata": details, "expected": expected, "power": power})


# The empirical null's level: unrelated seeds of the runtime that coincide beyond the
# target law's allowance at this level show that its output law, not its seeds, makes
# the excess (see docs/statistics.md, "An empirical null").
EMPIRICAL_ALPHA = 1e-3
