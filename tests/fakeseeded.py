"""A numpy-only seeded backend for pytester runs of the suite (not a test module).

Position-addressed seeded sampling with exact-match semantics: plain and
speculative decoding draw each token from the same law at the same uniform,
so they agree - except where `flip` makes the speculative path take another
token at output index FLIP_AT: `near` the CDF neighbour (what a float
runtime's rounding can do), `far` the token farthest from it in the CDF (a
bug). max_depth=0 or drafters="" declare a backend that cannot speculate."""

from __future__ import annotations

import numpy as np

from mtpcheck.contracts import (
    Capabilities,
    FinishEvent,
    GenerationResult,
    SpeculationReport,
    SpeculationUnavailableError,
    TokenEvent,
)
from mtpcheck.engine.sampling import STREAM_TARGET, process, sample, uniform

V = 64
FLIP_AT = 3


def logits(history) -> np.ndarray:
    return np.random.default_rng([len(history), *history[-2:]]).normal(size=V) * 2.0


def neighbour(p: np.ndarray, a: int) -> int:
    up = [t for t in range(a + 1, V) if p[t] > 0]
    down = [t for t in range(a - 1, -1, -1) if p[t] > 0]
    return (up or down)[0]


def farthest(p: np.ndarray, a: int) -> int:
    nz = np.flatnonzero(p > 0)
    return int(nz[-1] if a < V // 2 else nz[0])



def full_rounds(n: int, d: int) -> tuple[list[int], list[int]]:
    """(accept_lens, draft_lens) of n tokens in rounds that accept every proposal (the first token from the
    prefill): statistics that add up and show speculation exercised."""
    acc, emitted = [], 1
    while emitted < n and d:
        acc.append(min(d, n - emitted - 1))
        emitted += acc[-1] + 1
    return acc, list(acc)

class FakeSeeded:
    def __init__(self, max_depth=3, drafters="embedded", flip="none", tol=None, context=None):
        self.max_depth, self.kinds, self.flip, self.tol = int(max_depth), [k for k in drafters.split(",") if k], flip, tol and float(tol)
        self.context = int(context) if context else None
        self.speculative_requests = []

    def capabilities(self):
        return Capabilities(name="fake-seeded", version="0", vocab_size=V, eos_token_ids=[], mtp_kinds=self.kinds,
                            max_depth=self.max_depth, acceptance_rule="exact_match", seeded_determinism=True,
                            position_addressed_target_sampling=True, target_distributions=True,
                            speculative_sampling_controls=["temperature", "top_p", "seed"],
                            seed_cdf_tolerance=self.tol, context_length=self.context)

    def generate(self, req):
        from mtpcheck.contracts import check_prompt_length

        check_prompt_length(req.prompt_tokens, self.context)
        s = req.speculation
        want = s is not None and s.mode != "off"
        reason = None
        if want:
            if not self.kinds:
                reason = "drafter_unavailable"
            elif (s.num_draft_tokens or 1) > self.max_depth:
                reason = "depth_exceeds_capability"
            if reason and s.require_acceleration:
                raise SpeculationUnavailableError(reason, "cannot speculate")
        used = want and reason is None
        seed = req.sampling.seed or 0
        hist, out = list(req.prompt_tokens), []
        for i in range(req.max_tokens):
            p = process(logits(hist), req.sampling, hist)
            t = sample(p, uniform(seed, STREAM_TARGET, len(hist)))
            if used and i == FLIP_AT and self.flip != "none":
                t = neighbour(p, t) if self.flip == "near" else farthest(p, t)
            out.append(t)
            hist.append(t)
        d = (s.num_draft_tokens or 1) if used else 0
        acc, dr = full_rounds(len(out), d)
        report = SpeculationReport(
            requested=want, used=used, mode="native_mtp" if want else "off", runtime="fake", num_draft_tokens=d,
            acceptance_rule="exact_match" if used else None,
            reason=None if used else (reason or "not_requested"), message=None if used else "not speculating",
            rounds=len(acc), drafted=sum(dr), accepted=sum(acc), accept_lens=acc, draft_lens=dr,
            acceptance_rate=1.0 if sum(dr) else None)
        events = [TokenEvent(index=i, token=t) for i, t in enumerate(out)] + [FinishEvent(reason="length")]
        return GenerationResult(tokens=out, text="", finish_reason="length", events=events, speculation=report,
                                seed=seed)

    def target_distributions(self, prompt, continuation, sampling):
        from mtpcheck.contracts import check_prompt_length

        check_prompt_length(prompt, self.context)
        seq = list(prompt) + list(continuation)
        return np.stack([process(logits(seq[: len(prompt) + i]), sampling, seq[: len(prompt) + i])
                         for i in range(len(continuation))])


def load(**options):
    return FakeSeeded(**options)
