"""The proposal law as ground truth: the law each proposal of a finished
request was drawn from, replayed from its emitted tokens and its report.

A proposal at output index i was drawn given the emitted prefix (the round's
accepted proposals are emitted tokens) and, for an embedded head, its depth
in the round (depth >= 2 reads the head's own hidden state). So the report's
accept_lens and draft_lens fix every law: the replay runs the clean drafters
of mtpcheck.engine.draft with each draw forced to the emitted token, on the
engine's models, with no mutant or sampler of the engine involved.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mtpcheck.contracts import GenerationRequest

from .constraints import FREE, masked
from .draft import AssistantDrafter, MtpDrafter
from .sampling import process


def draft_laws(engine, req: GenerationRequest, tokens: Sequence[int], accept_lens: Sequence[int],
               draft_lens: Sequence[int]) -> np.ndarray:
    """[len(tokens), V]: row i the processed law of the proposal at output
    index i (the round's accepted proposals and its first rejected one);
    zeros where no proposal stood (the prefill token, corrections after a
    full block, bonus tokens, rounds without a draft)."""
    tokens = [int(t) for t in tokens]
    out = np.zeros((len(tokens), engine.vocab_size))
    plan = engine.plan(req)
    if not plan.used or not tokens:
        return out
    sp, prompt = req.sampling, list(req.prompt_tokens)
    model = engine.target
    drafter = MtpDrafter(model) if plan.drafter == "mtp" else AssistantDrafter(engine.assistant)
    forced: dict[int, int] = {}  # logical position -> the emitted token drawn there

    def draw(logits, sp, history, seed, pos, cursor):
        q = process(masked(np.array(logits, dtype=np.float64), cursor.mask), sp, history)
        return forced.get(pos, int(np.argmax(q))), q, 0.0  # the rejected proposal is never fed: any token

    drafter.draw = draw  # the engine's seam (mutants use it too); here on a fresh, clean drafter
    history, cache = list(prompt), model.make_cache()
    hidden, _ = model(mx.array(history)[None], cache)
    drafter.observe(0, hidden[0])
    history.append(tokens[0])  # first_token_from_prefill
    e = 1
    for a, d in zip(accept_lens, draft_lens, strict=False):
        if e >= len(tokens):
            break
        n = len(history) - 1  # target cache length; history[n] is pending
        tried = min(a + 1, d, len(tokens) - e)  # accepted proposals, then the first rejected one
        forced.clear()
        forced.update({len(prompt) + e + j: tokens[e + j] for j in range(min(a, tried))})
        if tried:
            block = drafter.draft(history, n, tried, sp, 0, FREE)
            out[e : e + tried] = block.probs
        c = min(a + 1, len(tokens) - e)  # emitted this round
        # the target on [pending, accepted...]: the rows the drafter reads after verification
        hidden, _ = model(mx.array([history[-1]] + tokens[e : e + c - 1])[None], cache)
        drafter.after_verify(n, n + c, hidden[0])
        history += tokens[e : e + c]
        e += c
    return out
