"""Ground truth of a request constraint (CONSTRAINT-LANGUAGE): the suite's
own automaton for a `choice` and the exact law of the whole output under it.

The law is the plain path's: at every prefix the target law masked to the
tokens that keep the text a prefix of some choice (an end token once it is
one) and renormalised, multiplied along each token path. A finite language
with prefix-free strings has finitely many paths, so the law is enumerated,
not sampled. Masking commutes with temperature, not with top-k, top-p, min-p
or penalties (where the runtime masks in its sampler chain is its own
choice), so only temperature is allowed here.
"""

from __future__ import annotations

import numpy as np

from mtpcheck.contracts import GenerationRequest, SamplingParams

MAX_PATHS = 5000  # a guard against a choice that a fine vocabulary splits too many ways


def choice_dfa(backend, request: GenerationRequest):
    """The suite's automaton for the request's choice, over the backend's per-token texts."""
    from mtpcheck.engine.constraints import TokenDFA

    caps = backend.capabilities()
    texts = [backend.decode([i]) for i in range(caps.vocab_size)]
    eos = caps.eos_token_ids if request.stop_token_ids is None else request.stop_token_ids
    return TokenDFA.from_strings(request.constraint.choice, texts, eos)


def path_law(backend, prompt: list[int], dfa, sp: SamplingParams) -> dict[tuple[int, ...], float]:
    """{token path up to (not including) the end token: probability} of every
    complete output under the constraint, on the plain path."""
    if sp.top_k or (sp.top_p or 1.0) < 1.0 or sp.min_p or sp.speculation_blockers():
        raise ValueError("path_law: masking commutes with temperature alone; no filters or penalties")
    out: dict[tuple[int, ...], float] = {}
    todo = [((), dfa.start, 1.0)]
    while todo:
        path, state, prob = todo.pop()
        law = backend.target_distributions(prompt, [*path, 0], sp)[-1]  # the law after `path`
        allowed = law * dfa.allowed(state)
        z = allowed.sum()
        if not z > 0:
            raise ValueError(f"the target gives every token the constraint allows after {list(path)} probability 0")
        for t in np.flatnonzero(allowed):
            p = prob * allowed[t] / z
            if int(t) in dfa.end_ids and dfa.complete(state):
                out[path] = out.get(path, 0.0) + p
            else:
                todo.append(((*path, int(t)), dfa.advance(state, int(t)), p))
        if len(out) + len(todo) > MAX_PATHS:
            raise ValueError(f"the constraint has more than {MAX_PATHS} token paths: choose shorter strings")
    return out


def output_path(tokens: list[int], end_ids) -> tuple[int, ...]:
    """An output's token path without its final end token (runtimes differ in returning it)."""
    return tuple(tokens[:-1] if tokens and tokens[-1] in set(end_ids) else tokens)
