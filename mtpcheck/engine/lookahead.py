"""Lookahead: optional work while a block awaits verification (seed 000).

A branch is one continuation drafted from a cloned assistant assuming the
block is fully accepted; its first token guesses the bonus. Verification
resolves it: promoted only after full acceptance with the target's bonus
equal to its first token; the next propose then reuses its remaining
proposals and extends them from the saved assistant frontier back to full
depth. Draft draws are position-addressed, so a reused branch holds exactly
the proposals the normal path would draw: lookahead changes optional work,
never output.

Every branch token ends in exactly one of consumed (as the bonus), reused
(as a next-block proposal) or discarded; `LookaheadStats` keeps the tally
and the adaptive rule turns lookahead off when it mostly discards.
"""

from __future__ import annotations

import time

from .acceptance import Verdict
from .cache import trim_cache
from .draft import AssistantDrafter, DraftBlock
from .state import BranchRecord, RequestState


def room_after(st: RequestState, block: DraftBlock) -> int:
    """Tokens still allowed after the block is fully accepted with its bonus."""
    return st.req.max_tokens - len(st.out.tokens) - len(block.tokens) - 1


def possible(st: RequestState) -> bool:
    """Only the external assistant drafts ahead: it can be cloned; an
    embedded head's state is the target's own."""
    f = st.inflight
    if f is None or f.branch is not None or not f.block.tokens:
        return False
    # a next block must exist to reuse proposals in; output may end at a complete state
    return (st.plan.used and isinstance(st.drafter, AssistantDrafter) and not st.look.disabled
            and room_after(st, f.block) >= 2 and not st.cursor.advance_all(f.block.tokens).complete)


def draft(st: RequestState) -> bool:
    """Draft one branch from a clone of the assistant, as if the in-flight
    block were fully accepted. False when nothing was drafted."""
    if not possible(st):
        return False
    block = st.inflight.block
    hist = st.history + block.tokens  # the history full acceptance would commit
    cursor = st.cursor.advance_all(block.tokens)
    frontier = st.drafter.clone()
    t0 = time.perf_counter()
    branch = frontier.extend(hist, DraftBlock.empty(len(hist), frontier.model.args.vocab_size),
                             min(st.plan.depth, room_after(st, block)), st.req.sampling, st.seed, cursor)
    st.stats.draft_time += time.perf_counter() - t0
    branch.frontier = frontier
    st.inflight.branch = branch
    st.look.drafted += len(branch.tokens)
    st.records.append(BranchRecord(st.round, block.position, list(block.tokens), branch.position,
                                   list(branch.tokens), branch.probs.tolist()))
    return True


def drop(st: RequestState) -> bool:
    """Discard the branch before verification (it is optional work)."""
    if st.inflight is None or st.inflight.branch is None:
        return False
    st.inflight.branch = None
    finish(st, "dropped")
    return True


def cancel(st: RequestState) -> None:
    """A cancelled request accounts for its pending and promoted branches."""
    if st.inflight is not None and st.inflight.branch is not None:
        finish(st, "cancelled")
    if st.promoted is not None:
        st.promoted = None
        finish(st, "promoted")


def outcome(done: bool, block: DraftBlock, verdict: Verdict, branch: DraftBlock) -> str:
    """The promotion rule: only after full acceptance, with prefixes agreeing
    and the bonus equal to the branch's first token; a terminal bonus discards."""
    if done:
        return "terminal"
    if verdict.accepted < len(block.tokens) or branch.position != block.position + len(block.tokens):
        return "parent_rejected"
    return "promoted" if verdict.next_token == branch.tokens[0] else "mismatch"


def resolve(st: RequestState, verdict: Verdict, branch: DraftBlock, result: str) -> None:
    """Settle the latest branch after its parent's verification."""
    rec = st.records[-1]
    rec.bonus = verdict.next_token
    if result != "promoted":
        finish(st, result)
        return
    rec.outcome, rec.consumed_as_bonus = result, 1
    st.look.consumed += 1
    st.look.matches += 1
    st.promoted = branch  # its remaining proposals are counted at the next propose


def reuse(st: RequestState, n: int, k: int) -> DraftBlock:
    """The promoted branch less its first token (the bonus), cut to k, then
    extended from the saved frontier back to k proposals; the frontier
    becomes the request's drafter."""
    branch, st.promoted = st.promoted, None
    rest = DraftBlock(branch.tokens[1:], branch.probs[1:], branch.uniforms[1:], branch.position + 1, branch.frontier)
    r = min(len(rest.tokens), k)
    frontier = branch.frontier
    trim_cache(frontier.cache, n + r)  # fed exactly what normal drafting of r proposals feeds
    st.drafter = frontier
    rec = st.records[-1]
    rec.reused, rec.discarded = r, len(rest.tokens) - r
    block = rest.head(r)
    block = frontier.extend(st.history, block, k, st.req.sampling, st.seed, st.cursor.advance_all(block.tokens))
    rec.extended = len(block.tokens) - r
    st.look.count(rec, st.adaptive_after)
    return block


def finish(st: RequestState, result: str) -> None:
    """Discard the rest of the latest branch (everything not consumed)."""
    rec = st.records[-1]
    rec.outcome = result
    st.look.mismatches += result == "mismatch"
    rec.discarded = len(rec.tokens) - rec.consumed_as_bonus
    st.look.count(rec, st.adaptive_after)
