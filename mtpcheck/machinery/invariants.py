"""Rules every result obeys, whatever the call and whichever clause asked for
it: the statistics add up, the budget and stops hold, a stream ends once.

The harness (mtpcheck.machinery.harness.Guarded) applies them to every result
it hands a suite test - of generate, generate_batch, generate_n, a stream
assembled, a stream abandoned - and the plugin reports a broken rule under the
clause that owns it, naming the call, not as a failure of the calling test.
"""

from __future__ import annotations

from typing import NamedTuple

from mtpcheck.contracts import Capabilities, GenerationRequest, GenerationResult, StreamChunk
from mtpcheck.machinery.checks import finish_problems, stats_problems
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


def result_violations(res: GenerationResult, req: GenerationRequest, caps: Capabilities) -> list[Violation]:
    """The rules one result must obey: STATS-CONSISTENT's (statistics, finish
    reasons) and STOP-IN-BLOCK's that one output can show."""
    stats = finish_problems(res, req, caps) if unobserved(res) else stats_problems(res, req, caps)
    return [Violation("STATS-CONSISTENT", p) for p in stats] + output_problems(res.tokens, res.text, req, caps)


def stream_violations(chunks: list[StreamChunk], req: GenerationRequest, caps: Capabilities,
                      complete: bool = True) -> list[Violation]:
    """A stream's chunks, assembled: the finish reason on its last chunk only
    (on a complete stream, there), the output rules, and the finish rules
    (STATS-CONSISTENT's) once it has finished."""
    tokens = [t for c in chunks for t in c.tokens]
    ends = [i for i, c in enumerate(chunks) if c.finish_reason is not None]
    out = []
    if ends and ends != [len(chunks) - 1] or complete and not ends:
        out.append(Violation("STREAM-COMMIT-ONLY", f"finish_reason set on chunks {ends} of {len(chunks)}; "
                                                   "expected on the last chunk only"))
    out += output_problems(tokens, "".join(c.text for c in chunks), req, caps)
    if ends:
        done = GenerationResult.model_construct(tokens=tokens, finish_reason=chunks[ends[-1]].finish_reason)
        out += [Violation("STATS-CONSISTENT", p) for p in finish_problems(done, req, caps)]
    return out
