"""Rules every result obeys, whatever the call and whichever clause asked for
it: the statistics add up, the budget and stops hold, a stream ends once.

The harness (mtpcheck.machinery.harness.Guarded) applies them to every result
it hands a suite test - of generate, generate_batch, generate_n, a stream
assembled, a stream abandoned - and the plugin reports a broken rule under the
clause that owns it, naming the call, not as a failure of the calling test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from mtpcheck.contracts import Capabilities, GenerationRequest, GenerationResult, StreamChunk
from mtpcheck.machinery.checks import finish_problems, stats_problems, text_difference
from mtpcheck.machinery.exercise import unobserved


class Violation(NamedTuple):
    clause: str
    problem: str


def _stops(req: GenerationRequest, caps: Capabilities) -> set[int]:
    return set(caps.eos_token_ids if req.stop_token_ids is None else req.stop_token_ids)


def output_problems(tokens: list[int], text: str, req: GenerationRequest, caps: Capabilities) -> list[Violation]:
    """STOP-IN-BLOCK as one output shows it: no more than max_tokens tokens,
    nothing after the first stop token, no stop string in the text (it ends
    before the stop string)."""
    out = []
    if len(tokens) > req.max_tokens:
        out.append(f"{len(tokens)} tokens emitted, max_tokens was {req.max_tokens}")
    stops = _stops(req, caps)
    first = next((i for i, t in enumerate(tokens) if t in stops), None)
    if first is not None and first < len(tokens) - 1:
        out.append(f"stop token {tokens[first]} at index {first}, then {len(tokens) - 1 - first} more tokens")
    hit = next((s for s in req.stop if s in text), None)
    if hit is not None:
        out.append(f"the text holds the stop string {hit!r} (it must end before it)")
    return [Violation("STOP-IN-BLOCK", p) for p in out]


def text_problem(tokens: list[int], text: str, req: GenerationRequest, caps: Capabilities,
                 decode: Callable[[list[int]], str]) -> str | None:
    """The text is the output tokens decoded, stop tokens left out, cut before
    the first stop string. The model's EOS ids may be left out of the text
    even where the request's stop tokens do not name them (a runtime that
    skips special tokens), must be where the backend declares
    stop_text="special_tokens_skipped", and may not be where it declares
    "special_tokens_kept"; an incomplete UTF-8 sequence may be held back at
    the end."""
    stops = _stops(req, caps)
    kept = [t for t in tokens if t not in stops]
    try:
        eos = set(caps.eos_token_ids)
        with_eos = lambda: decode(kept)  # noqa: E731
        without_eos = lambda: decode([t for t in kept if t not in eos])  # noqa: E731
        if caps.stop_text == "special_tokens_kept":
            wants = [with_eos()]
        elif caps.stop_text == "special_tokens_skipped":
            wants = [without_eos()]
        else:  # undeclared: either, where an EOS the stops do not remove is in the output
            wants = [with_eos()] + ([without_eos()] if eos - stops and set(kept) & eos else [])
    except Exception:  # a failing decode() is judged by the clauses that call it
        return None
    cut = [w[: min((w.find(s) for s in req.stop if s in w), default=len(w))] for w in wants]
    if text.rstrip("\ufffd") in {w.rstrip("\ufffd") for w in cut}:
        return None
    w = cut[0]
    return (f"text is not the output tokens decoded: {len(text)} characters, the {len(tokens)} tokens decode to "
            f"{len(w)}; {text_difference(text, w)}")


def observed_stats_problems(res: GenerationResult, req: GenerationRequest, caps: Capabilities) -> list[str]:
    """STATS-CONSISTENT's problems of one result, as far as it was observed: a
    result with no round statistics at all (exercise.unobserved) on its finish only."""
    return finish_problems(res, req, caps) if unobserved(res, caps) else stats_problems(res, req, caps)


def result_violations(res: GenerationResult, req: GenerationRequest, caps: Capabilities,
                      decode: Callable[[list[int]], str] | None = None) -> list[Violation]:
    """The rules one result must obey: STATS-CONSISTENT's (statistics, finish
    reasons) and STOP-IN-BLOCK's that one output can show (with `decode`, the
    backend's detokenizer, its text too)."""
    out = [Violation("STATS-CONSISTENT", p) for p in observed_stats_problems(res, req, caps)] + output_problems(res.tokens, res.text, req, caps)
    why = decode and text_problem(res.tokens, res.text, req, caps, decode)
    return out + ([Violation("STOP-IN-BLOCK", why)] if why else [])


def stream_violations(chunks: list[StreamChunk], req: GenerationRequest, caps: Capabilities,
                      complete: bool = True, decode: Callable[[list[int]], str] | None = None) -> list[Violation]:
    """A stream's chunks, assembled: the finish reason on its last chunk only
    (on a complete stream, there), the output rules, the streamed text (with
    `decode`, on a finished stream: the tokens it carried, decoded), and the
    finish rules (STATS-CONSISTENT's) once it has finished."""
    tokens = [t for c in chunks for t in c.tokens]
    ends = [i for i, c in enumerate(chunks) if c.finish_reason is not None]
    out = []
    if ends and ends != [len(chunks) - 1] or complete and not ends:
        out.append(Violation("STREAM-COMMIT-ONLY", f"finish_reason set on chunks {ends} of {len(chunks)}; "
                                                   "expected on the last chunk only"))
    out += output_problems(tokens, "".join(c.text for c in chunks), req, caps)
    why = decode and ends and text_problem(tokens, "".join(c.text for c in chunks), req, caps, decode)
    if why:
        out.append(Violation("STREAM-COMMIT-ONLY", f"streamed {why}"))
    if ends:
        done = GenerationResult.model_construct(tokens=tokens, finish_reason=chunks[ends[-1]].finish_reason)
        out += [Violation("STATS-CONSISTENT", p) for p in finish_problems(done, req, caps)]
    return out
