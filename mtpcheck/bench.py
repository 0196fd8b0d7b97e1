"""Speculation on vs off on one loaded backend: the measurement behind
`mtpcheck bench` and the benchmark gates.

Repetitions are interleaved (off, on@1, ..., on@5, off, ...) so that drift of
a noisy machine hits every arm alike; figures are medians. The predicted
speedup follows Leviathan et al. (2023): expected tokens per round over the
cost of one round (k drafts plus one verification of k+1 positions), in
units of one plain decoding step, from the backend's own measured costs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from mtpcheck.contracts import GenerationRequest, SamplingParams


@dataclass
class Arm:
    depth: int  # 0 = speculation off
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    accept_lens: list[int] = field(default_factory=list)
    draft_lens: list[int] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    def tokens_per_s(self) -> float:
        return statistics.median(t / s for t, s in zip(self.tokens, self.seconds, strict=True))

    def per_round(self) -> float:
        """Tokens emitted per round: accepted proposals plus the correction or bonus."""
        return 1.0 + self.mean_accepted()

    def mean_accepted(self) -> float:
        return sum(self.accept_lens) / max(len(self.accept_lens), 1)

    def acceptance_by_position(self) -> list[float]:
        """P(proposal j accepted | j drafted), j = 1..depth."""
        out = []
        for j in range(1, self.depth + 1):
            drafted = sum(1 for d in self.draft_lens if d >= j)
            out.append(sum(1 for a, d in zip(self.accept_lens, self.draft_lens, strict=True) if d >= j and a >= j) / max(drafted, 1))
        return out


def measure(backend, prompt: list[int], depths=(1, 2, 3, 4, 5), reps: int = 5, max_tokens: int = 64,
            sampling: SamplingParams | None = None, warmup: int = 1) -> dict[int, Arm]:
    sp = sampling or SamplingParams(temperature=0.0)
    arms = {d: Arm(d) for d in (0, *depths)}
    for rep in range(warmup + reps):
        for d, arm in arms.items():
            spec = False if d == 0 else {"mode": "native_mtp", "num_draft_tokens": d}
            req = GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, sampling=sp, speculation=spec,
                                    stop_token_ids=[])
            t0 = time.perf_counter()
            res = backend.generate(req)
            dt = time.perf_counter() - t0
            if rep < warmup:
                continue
            s = res.speculation
            arm.seconds.append(dt)
            arm.tokens.append(len(res.tokens))
            arm.accept_lens += s.accept_lens
            arm.draft_lens += s.draft_lens
            arm.draft_s.append(s.draft_time_s)
            arm.verify_s.append(s.verify_time_s)
            arm.rounds.append(s.rounds)
    return arms


def summarise(arms: dict[int, Arm]) -> list[dict]:
    """One row per depth: realised and predicted speedup, efficiency, acceptance."""
    off = arms[0]
    t_plain = 1.0 / off.tokens_per_s()  # seconds per plain token
    rows = []
    for d, arm in sorted(arms.items()):
        if d == 0:
            continue
        rounds = max(sum(arm.rounds), 1)
        draft_per_round = sum(arm.draft_s) / rounds
        verify_per_round = sum(arm.verify_s) / rounds
        c = (draft_per_round / max(d, 1)) / t_plain  # one draft token, in plain steps
        v = verify_per_round / t_plain  # one verification, in plain steps
        predicted = arm.per_round() / (d * c + v) if (d * c + v) > 0 else float("nan")
        realised = arm.tokens_per_s() / off.tokens_per_s()
        rows.append({
            "depth": d, "tokens_per_s": arm.tokens_per_s(), "off_tokens_per_s": off.tokens_per_s(),
            "speedup": realised, "predicted_speedup": predicted, "efficiency": realised / predicted,
            "tokens_per_round": arm.per_round(), "mean_accepted": arm.mean_accepted(),
            "acceptance_by_position": arm.acceptance_by_position(), "draft_cost_c": c, "verify_cost_v": v,
        })
    return rows
