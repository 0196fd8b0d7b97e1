"""Fixed-context sampling for DIST-CONTEXT (docs/statistics.md, "Targeted contexts").

Many short seeded requests on one prompt reach the same few contexts again
and again: the prompt plus the prefill token (or the prompt alone, when round
0 emits the first token) is where the first proposal is verified, so the
first speculative position repeats as often as the prefill token does. The
tokens drawn there are compared with the target law cell by cell
(`laws.context_gtest.context_gtest`).

Three stages, each a fresh sample tested at its own share of alpha (union
bound; docs/statistics.md):

A. pilot: every prompt, a few requests each;
B. targeted: the prompts whose stage-A statistic stood out most (largest
   standardised excess (G - df) / sqrt(2 df)) get many requests;
C. escalation: when B's p-value is suspicious, B's prompts get
   `escalate` times more, tested together with B.

Targets come from stage A's tokens only and B and C are fresh draws, so the
choice cannot bias B's or C's test under the null.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mtpcheck.contracts import Capabilities, GenerationRequest, GenerationResult, SamplingParams
from mtpcheck.laws.context_gtest import ContextDraws, context_gtest
from mtpcheck.laws.stats import TestResult

Draw = tuple[str, list[int], GenerationResult]  # (prompt name, prompt ids, result)


def lead(caps: Capabilities) -> int:
    """Tokens before the first speculative position: the prefill token, if any."""
    return 1 if caps.first_token_from_prefill else 0


def short_max_tokens(caps: Capabilities) -> int:
    """Room for the first speculative position and one more: the first round
    drafts (engines cap a draft at the budget less the bonus token)."""
    return lead(caps) + 2


def draw(backend, caps: Capabilities, prompts: dict[str, list[int]], per_prompt: dict[str, int],
         sp: SamplingParams, spec: dict, seeds: Callable[[], int]) -> list[Draw]:
    """Short seeded requests: per_prompt[name] of them on each named prompt,
    through generate_batch when the backend declares it."""
    todo = [(name, prompts[name]) for name, k in per_prompt.items() for _ in range(k)]
    reqs = [GenerationRequest(prompt_tokens=p, max_tokens=short_max_tokens(caps),
                              sampling=sp.model_copy(update={"seed": seeds()}), speculation=spec) for _, p in todo]
    results = backend.generate_batch(reqs) if caps.generate_batch else [backend.generate(r) for r in reqs]
    return [(name, p, res) for (name, p), res in zip(todo, results, strict=True)]


def context_draws(laws: Callable[[list[int], list[int]], np.ndarray], draws: Sequence[Draw], first: int,
                  min_visits: int = 10, positions: int = 1,
                  excuse: Callable[[list[int], list[int], int], bool] | None = None) -> dict[str, list[ContextDraws]]:
    """Group emitted tokens by context (prompt + emitted prefix) at output
    positions first .. first + positions - 1; per prompt name, one
    ContextDraws per context reached at least `min_visits` times (rarer ones
    cannot fill two cells of the pilot's expected count 5, so their laws are
    not fetched). The default, the first speculative position alone, is
    where a short request's proposal is verified: the token after it is a
    bonus or a plain draw, which adds degrees of freedom and no signal for an
    acceptance bug (docs/statistics.md, 'Targeted contexts'). `excuse(prompt,
    prefix, token)`: a token of target probability 0 it accepts (a float flip
    of a filter decision) is left out."""
    seen: dict[tuple, list[int]] = defaultdict(list)
    names: dict[tuple, str] = {}
    for name, prompt, res in draws:
        for pos in range(first, min(len(res.tokens), first + positions)):
            key = (tuple(prompt), tuple(res.tokens[:pos]))
            seen[key].append(res.tokens[pos])
            names[key] = name
    out: dict[str, list[ContextDraws]] = defaultdict(list)
    for (prompt, prefix), toks in seen.items():
        if len(toks) < min_visits:
            continue
        law = np.asarray(laws(list(prompt), [*prefix, toks[0]]), dtype=np.float64)[len(prefix)]
        if excuse is not None:
            flips = {t for t in set(toks) if (not 0 <= t < len(law) or law[t] <= 0)
                     and excuse(list(prompt), list(prefix), t)}
            toks = [t for t in toks if t not in flips]
        label = f"{names[(prompt, prefix)]} + {list(prefix)}"
        out[names[(prompt, prefix)]].append(ContextDraws(label, np.asarray(toks, dtype=np.int64), law))
    return dict(out)


def acceptance_by_prompt(draws: Sequence[Draw]) -> dict[str, float | None]:
    """Reported accepted / drafted per prompt (None where nothing was drafted):
    evidence only; the targets are chosen by the pilot's statistic."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, _, res in draws:
        acc[name][0] += res.speculation.accepted
        acc[name][1] += res.speculation.drafted
    return {name: (a / d if d else None) for name, (a, d) in acc.items()}


def pick_targets(scores: dict[str, float], k: int) -> list[str]:
    """The k prompts of largest standardised excess (ties: name order)."""
    return [name for name, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def split(total: int, names: Sequence[str]) -> dict[str, int]:
    """total requests over names, as evenly as integers allow."""
    base, extra = divmod(total, max(len(names), 1))
    return {n: base + (i < extra) for i, n in enumerate(names)}


@dataclass
class Staged:
    """What the three stages drew and found (see the module docstring)."""

    stages: list[dict] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    acceptance: dict[str, float | None] = field(default_factory=dict)
    targets: list[str] = field(default_factory=list)
    failed: tuple[str, TestResult] | None = None
    failed_requests: dict[str, int] = field(default_factory=dict)  # per prompt, in the failing stage
    used: bool = True  # speculation ran on the pilot's requests


def staged_test(sample: Callable[[dict[str, int]], list[Draw]], laws: Callable[[list[int], list[int]], np.ndarray],
                prompts: Sequence[str], first: int, pilot: int, runs: int, alpha: float, *, targets: int = 2,
                escalate: int = 2, suspicious: float = 1e-3, pilot_min_expected: float = 5.0,
                excuse: Callable[[list[int], list[int], int], bool] | None = None) -> Staged:
    """Pilot, targeted stage and escalation, each tested at `alpha` (the
    caller gives each a third of its share). A pilot that tests nothing
    (no context with two cells of the expected count: n = 0) cannot reject,
    so it spends no alpha: its share goes to the targeted stage, tested at
    2 * alpha (the targeted draws are fresh, so whatever the pilot saw, the
    three stages' false alarms still add up to at most 3 * alpha).
    `sample(per_prompt)` draws fresh short requests; `laws(prompt,
    continuation)` is target_distributions."""

    def test(draws, level=alpha):
        groups = context_draws(laws, draws, first, excuse=excuse)
        return groups, context_gtest([d for ds in groups.values() for d in ds], alpha=level)

    out = Staged()
    pilot_draws = sample({name: pilot for name in prompts})
    out.acceptance = acceptance_by_prompt(pilot_draws)
    out.used = any(res.speculation.used for _, _, res in pilot_draws)
    groups, a = test(pilot_draws)
    out.stages.append({"stage": "pilot", "prompts": len(prompts), "requests": len(pilot_draws), **brief(a)})
    for name, gs in groups.items():
        r = context_gtest(gs, min_expected=pilot_min_expected)
        if r.df:
            out.scores[name] = round((r.statistic - r.df) / (2 * r.df) ** 0.5, 3)
    if not a.passed:
        # the plain path is judged on at least the targeted stage's sample: a pilot's contexts are sparse
        out.failed, out.failed_requests = ("pilot", a), split(max(runs, pilot * len(prompts)), prompts)
    if out.failed or not out.scores:
        return out
    out.targets = pick_targets(out.scores, targets)
    draws_b = sample(split(runs, out.targets))
    _, b = test(draws_b, alpha if a.n else 2 * alpha)  # an empty pilot's share moves on
    out.stages.append({"stage": "targeted", "prompts": out.targets, "requests": len(draws_b), **brief(b)})
    if not b.passed:
        out.failed, out.failed_requests = ("targeted", b), split(runs, out.targets)
    elif b.p_value <= suspicious and escalate > 1:
        draws_c = draws_b + sample(split((escalate - 1) * runs, out.targets))
        _, c = test(draws_c)
        out.stages.append({"stage": "escalated", "prompts": out.targets, "requests": len(draws_c), **brief(c)})
        if not c.passed:
            out.failed, out.failed_requests = ("escalated", c), split(escalate * runs, out.targets)
    return out


def plain_test(sample_plain: Callable[[dict[str, int]], list[Draw]],
               laws: Callable[[list[int], list[int]], np.ndarray], out: Staged, first: int, alpha: float,
               excuse: Callable[[list[int], list[int], int], bool] | None = None) -> TestResult:
    """The failing stage's requests again with speculation off, judged by the
    same test: a plain path that fails it too makes the deviation not
    speculation's. Drawn only after a failure."""
    groups = context_draws(laws, sample_plain(out.failed_requests), first, excuse=excuse)
    return context_gtest([d for ds in groups.values() for d in ds], alpha=alpha)


def brief(r: TestResult) -> dict:
    return {"p_value": r.p_value, "alpha": r.alpha, "g": r.statistic, "df": r.df, "n": r.n,
            "contexts": r.details.get("contexts_used", 0), "note": r.note}
