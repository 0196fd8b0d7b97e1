"""A numpy-only backend with an engineered near-tie (for tests/test_triage.py;
not a test module): at output index FLIP_AT its top-2 logits are `gap` nats
apart and the speculative path takes the runner-up - what a float runtime's
batched verification does to a near-tie. gap=2 makes the same flip structural."""

from __future__ import annotations

import numpy as np

from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport

V, FLIP_AT = 50, 4


def logits(history, gap):
    z = np.random.default_rng([len(history), *history[-2:]]).normal(size=V)
    if len(history) == FIRST + FLIP_AT:
        top = np.argsort(z)[-2:]
        z[top[1]] = z[top[0]] + gap  # the top two logits `gap` apart
    return z


FIRST = 3  # prompt length the tests use



def full_rounds(n: int, d: int) -> tuple[list[int], list[int]]:
    """(accept_lens, draft_lens) of n tokens in rounds that accept every proposal (the first token from the
    prefill): statistics that add up and show speculation exercised."""
    acc, emitted = [], 1
    while emitted < n and d:
        acc.append(min(d, n - emitted - 1))
        emitted += acc[-1] + 1
    return acc, list(acc)

class FakeTie:
    def __init__(self, gap="1e-4", depth="2"):
        self.gap, self.depth = float(gap), int(depth)

    def capabilities(self):
        return Capabilities(name="fake-tie", version="0", vocab_size=V, mtp_kinds=["embedded"], max_depth=self.depth,
                            acceptance_rule="exact_match", target_distributions=True,
                            logit_dtype="float16", context_length=64)

    def generate(self, req):
        from mtpcheck.contracts import check_prompt_length

        check_prompt_length(req.prompt_tokens, 64)
        spec = req.speculation is not None and req.speculation.mode != "off"
        hist, out = list(req.prompt_tokens), []
        for i in range(req.max_tokens):
            order = np.argsort(logits(hist, self.gap))
            t = int(order[-2] if spec and i == FLIP_AT else order[-1])
            out.append(t)
            hist.append(t)
        d = (req.speculation.num_draft_tokens or self.depth) if spec else 0
        acc, dr = full_rounds(len(out), d)
        report = SpeculationReport(requested=spec, used=spec, mode="native_mtp" if spec else "off", runtime="fake",
                                   num_draft_tokens=d, reason=None if spec else "not_requested",
                                   message=None if spec else "off", rounds=len(acc), drafted=sum(dr),
                                   accepted=sum(acc), accept_lens=acc, draft_lens=dr)
        return GenerationResult(tokens=out, text="", finish_reason="length", speculation=report)

    def target_distributions(self, prompt, continuation, sampling):
        seq = list(prompt) + list(continuation)
        rows = []
        for i in range(len(continuation)):
            z = logits(seq[: len(prompt) + i], self.gap)
            p = np.exp(z - z.max())
            rows.append(p / p.sum())
        return np.stack(rows)


def load(**options):
    return FakeTie(**options)
