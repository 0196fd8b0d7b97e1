"""One request: prefill, then rounds of draft k -> verify k+1 -> commit -> roll back.

Invariants between rounds (checked by tests/test_rollback.py):
  target cache length == len(prompt + output) - 1: the last emitted token
  (correction or bonus) is pending, uncached, and leads the next verification;
  the draft cache holds no speculative entries (draft.py).
Speculation off runs the same loop with zero proposals per round.

A round is two actions, `propose` and `verify`, so that a scheduler can
interleave requests and, between them, take the optional `lookahead` action:
draft one continuation from a cloned assistant assuming the block is fully
accepted (seed 000). `verify` resolves that branch: it is promoted only after
full acceptance with the target's bonus equal to its first token; the next
`propose` then reuses its remaining proposals and extends them from the saved
assistant frontier back to full depth. Draft draws are position-addressed,
so a reused branch holds exactly the proposals the normal path would draw:
lookahead changes optional work, never output.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from mtpcheck.contracts import (
    GenerationRequest,
    GenerationResult,
    RoundTrace,
    SpeculationReport,
    SpeculationRequest,
    SpeculationUnavailableError,
)
from mtpcheck.contracts.models import history_digest

from .acceptance import Verdict, get_rule
from .cache import cache_length, trim_cache
from .constraints import Cursor, TokenDFA, masked
from .draft import AssistantDrafter, DraftBlock, MtpDrafter
from .events import OutputState, StopMatcher, commit_tokens
from .model import Model
from .sampling import STREAM_ACCEPT, STREAM_TARGET, process, sample, uniform

MAX_DEPTH = 8


@dataclass
class Plan:
    """What will actually run for one request."""

    requested: bool
    used: bool
    mode: str
    depth: int
    drafter: str | None
    reason: str | None = None
    message: str | None = None


@dataclass
class Snapshot:
    """Handed to an observer after prefill (round -1) and after every round."""

    round: int
    history: list[int]
    target_cache: list
    drafter: object | None
    out: OutputState
    cursor: Cursor | None = None


@dataclass
class Stats:
    rounds: int = 0
    accept_lens: list[int] = field(default_factory=list)
    draft_lens: list[int] = field(default_factory=list)
    bonus: int = 0
    corrections: int = 0
    draft_time: float = 0.0
    verify_time: float = 0.0


@dataclass
class LookaheadStats:
    """Optional work. Every branch token ends in exactly one of consumed
    (as the bonus), reused (as a next-block proposal) or discarded."""

    drafted: int = 0
    consumed: int = 0
    reused: int = 0
    discarded: int = 0
    matches: int = 0
    mismatches: int = 0
    resolved: int = 0  # branches whose every token is accounted for
    disabled: bool = False  # by the adaptive rule


@dataclass
class BranchRecord:
    """One lookahead branch, for the suite to re-check (mtpcheck.contracts.scheduling.LookaheadRecord)."""

    round: int  # the parent round
    parent_position: int
    parent_proposals: list[int]
    position: int  # of tokens[0], the bonus guess
    tokens: list[int]
    probs: list[list[float]]
    outcome: str = "pending"  # promoted | mismatch | parent_rejected | terminal | dropped | cancelled
    bonus: int | None = None  # the target's next token at the parent's resolution
    consumed_as_bonus: int = 0
    reused: int = 0
    discarded: int = 0
    extended: int = 0  # proposals drafted from the frontier to restore depth


@dataclass
class InFlight:
    """A proposed block awaiting verification."""

    block: DraftBlock
    draft_len_before: int
    draft_time: float
    branch: DraftBlock | None = None  # optional lookahead branch, frontier inside


@dataclass
class RequestState:
    """Everything one request owns: the scheduler interleaves these."""

    req: GenerationRequest
    plan: Plan
    seed: int
    matcher: StopMatcher
    out: OutputState
    history: list[int]  # prompt + committed output; history[-1] is pending
    cache: list
    drafter: object | None
    traces: list | None
    observer: Callable[[Snapshot], None] | None = None
    stats: Stats = field(default_factory=Stats)
    round: int = 0
    cursor: Cursor = field(default_factory=lambda: Cursor(None))  # committed constraint state
    constraint_log: list[tuple[int, int]] = field(default_factory=list)  # (output tokens, state) per commit
    inflight: InFlight | None = None
    promoted: DraftBlock | None = None  # a branch whose first token was consumed as the bonus
    look: LookaheadStats = field(default_factory=LookaheadStats)
    records: list[BranchRecord] = field(default_factory=list)
    adaptive_after: int | None = None  # resolved branches before the adaptive rule applies
    cancelled: bool = False

    @property
    def done(self) -> bool:
        return self.out.finish_reason is not None or self.cancelled


class Engine:
    """The reference engine: one loaded target (+ head) and optional assistant,
    speculation on or off per call."""

    name = "mlx"

    def __init__(
        self,
        target: Model,
        assistant: Model | None = None,
        tokenizer=None,
        eos_ids: tuple[int, ...] = (),
        acceptance: str = "rejection",
        default_speculation: SpeculationRequest | None = None,
    ):
        self.target, self.assistant, self.tokenizer = target, assistant, tokenizer
        self.eos_ids = tuple(eos_ids)
        self.rule = get_rule(acceptance)
        self.default_speculation = default_speculation or SpeculationRequest(
            mode="native_mtp", drafter="mtp" if target.args.mtp_layers else "assistant", num_draft_tokens=3
        )
        self.vocab_size = target.args.vocab_size

    # -- planning -------------------------------------------------------------
    def plan(self, req: GenerationRequest) -> Plan:
        """Resolve the speculation block against this engine; raise before any
        generation when acceleration is required but impossible."""
        spec = req.speculation or self.default_speculation
        if spec.mode == "off":
            return Plan(False, False, "off", 0, None, "not_requested", "speculation is off for this call")
        drafter = spec.drafter or self.default_speculation.drafter
        depth = spec.num_draft_tokens or self.default_speculation.num_draft_tokens or 3
        if drafter not in ("mtp", "assistant"):
            raise ValueError(f"speculation.drafter: unknown drafter {drafter!r}; known: 'mtp', 'assistant'")
        reason = message = None
        if drafter == "mtp" and not self.target.args.mtp_layers:
            reason, message = "drafter_unavailable", "the target checkpoint carries no MTP head"
        elif drafter == "assistant" and self.assistant is None:
            reason, message = "drafter_unavailable", "no external assistant is loaded"
        elif depth > MAX_DEPTH:
            reason, message = "depth_exceeds_capability", f"num_draft_tokens={depth} exceeds the engine's maximum {MAX_DEPTH}"
        elif blockers := req.sampling.speculation_blockers():
            reason = "sampling_control_unsupported"
            message = f"{', '.join(blockers)} need target-only decoding; ran unaccelerated"
        if reason is not None:
            if spec.require_acceleration:
                raise SpeculationUnavailableError(reason, message)
            return Plan(True, False, spec.mode, depth, drafter, reason, message)
        return Plan(True, True, spec.mode, depth, drafter)

    def make_drafter(self, plan: Plan):
        if not plan.used:
            return None
        return MtpDrafter(self.target) if plan.drafter == "mtp" else AssistantDrafter(self.assistant)

    def decode_text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def token_texts(self) -> list[str] | None:
        """Each token's own text, decoded once (constraints over strings); None without a tokenizer."""
        if self.tokenizer is None:
            return None
        if getattr(self, "_token_texts", None) is None:
            self._token_texts = [self.decode_text([i]) for i in range(self.vocab_size)]
        return self._token_texts

    # -- generation -----------------------------------------------------------
    def generate(self, req: GenerationRequest, observer: Callable[[Snapshot], None] | None = None,
                 constraint: TokenDFA | None = None) -> GenerationResult:
        state = self.start(req, observer, constraint)
        while not state.done:
            self.step(state)
        return self.result(state)

    def start(self, req: GenerationRequest, observer: Callable[[Snapshot], None] | None = None,
              constraint: TokenDFA | None = None) -> RequestState:
        """Plan, then prefill: the first token comes from the target alone."""
        st = self.admit(req, observer, constraint)
        self.prefill(st)
        return st

    def admit(self, req: GenerationRequest, observer: Callable[[Snapshot], None] | None = None,
              constraint: TokenDFA | None = None) -> RequestState:
        """Validate and plan; raises before any generation. No model work."""
        plan = self.plan(req)
        for t in req.prompt_tokens:
            if t >= self.vocab_size:
                raise ValueError(f"prompt_tokens: token id {t} is outside the vocabulary (size {self.vocab_size})")
        sp = req.sampling
        eos = self.eos_ids if req.stop_token_ids is None else tuple(req.stop_token_ids)
        if constraint is not None and not constraint.end_ids <= set(eos):
            raise ValueError(f"constraint end tokens {sorted(constraint.end_ids)} must be stop tokens of the request {list(eos)}")
        return RequestState(
            req=req,
            plan=plan,
            seed=sp.seed if sp.seed is not None else int.from_bytes(os.urandom(7), "little"),
            matcher=StopMatcher(self.decode_text if self.tokenizer else None, req.stop, eos),
            out=OutputState(prompt_len=len(req.prompt_tokens)),
            history=list(req.prompt_tokens),
            cache=self.target.make_cache(),
            drafter=self.make_drafter(plan),
            traces=[] if req.trace else None,
            observer=observer,
            cursor=Cursor.of(constraint),
        )

    def prefill(self, st: RequestState) -> None:
        sp = st.req.sampling
        hidden, logits = self.target(mx.array(st.history)[None], st.cache)
        if st.drafter is not None:
            st.drafter.observe(0, hidden[0])
        p = self.target_law(masked(np.array(logits[0, -1], dtype=np.float64), st.cursor.mask), sp, st.history)
        tok = sample(p, self.uniform(st.seed, STREAM_TARGET, len(st.history)))
        self._commit(st, [tok], [_logprob(p, tok)])
        st.history.append(tok)
        self._commit_cursor_state(st, st.cursor.advance(tok))
        if st.observer:
            st.observer(Snapshot(-1, list(st.history), st.cache, st.drafter, st.out, st.cursor))

    def step(self, st: RequestState) -> None:
        """One round: draft k, verify k+1 in one target pass, commit, roll back."""
        self.propose(st)
        self.verify(st)

    # -- a round, as actions ----------------------------------------------------
    def propose(self, st: RequestState) -> None:
        """Draft this round's block (reusing a promoted branch when there is one)."""
        n = len(st.history) - 1  # == target cache length; history[n] is pending
        k = min(st.plan.depth, st.req.max_tokens - len(st.out.tokens) - 1) if st.plan.used else 0
        before = st.drafter.length if st.drafter else 0
        t0 = time.perf_counter()
        if st.promoted is not None:
            block = self._reuse(st, n, k)
        elif k > 0:
            block = st.drafter.draft(st.history, n, k, st.req.sampling, st.seed, st.cursor)
        else:
            block = DraftBlock.empty(n + 1, self.vocab_size)
        st.inflight = InFlight(block, before, time.perf_counter() - t0)

    def lookahead_possible(self, st: RequestState) -> bool:
        """Only the external assistant drafts ahead: it can be cloned; an
        embedded head's state is the target's own."""
        f = st.inflight
        if f is None or f.branch is not None or not f.block.tokens:
            return False
        room = self._room_after(st, f.block)
        # a next block must exist to reuse proposals in; output may end at a complete state
        return (st.plan.used and isinstance(st.drafter, AssistantDrafter) and not st.look.disabled
                and room >= 2 and not st.cursor.advance_all(f.block.tokens).complete)

    def _room_after(self, st: RequestState, block: DraftBlock) -> int:
        """Tokens still allowed after the block is fully accepted with its bonus."""
        return st.req.max_tokens - len(st.out.tokens) - len(block.tokens) - 1

    def lookahead(self, st: RequestState) -> bool:
        """Optional action while the block awaits verification: draft one
        continuation from a cloned assistant, assuming full acceptance; its
        first token guesses the bonus. False when nothing was drafted."""
        if not self.lookahead_possible(st):
            return False
        block = st.inflight.block
        hist = st.history + block.tokens  # the history full acceptance would commit
        room = self._room_after(st, block)
        cursor = st.cursor.advance_all(block.tokens)
        frontier = st.drafter.clone()
        t0 = time.perf_counter()
        branch = frontier.extend(hist, DraftBlock.empty(len(hist), self.vocab_size), min(st.plan.depth, room),
                                 st.req.sampling, st.seed, cursor)
        st.stats.draft_time += time.perf_counter() - t0
        branch.frontier = frontier
        st.inflight.branch = branch
        st.look.drafted += len(branch.tokens)
        st.records.append(BranchRecord(st.round, block.position, list(block.tokens), branch.position,
                                       list(branch.tokens), branch.probs.tolist()))
        return True

    def drop_branch(self, st: RequestState) -> bool:
        """Discard the optional branch before verification (it is optional work)."""
        if st.inflight is None or st.inflight.branch is None:
            return False
        st.inflight.branch = None
        self._finish_branch(st, "dropped")
        return True

    def cancel(self, st: RequestState) -> None:
        """Stop the request: nothing more is committed or published; work in
        flight is dropped and its statistics are never counted."""
        if st.cancelled:
            return
        if st.inflight is not None and st.inflight.branch is not None:
            self._finish_branch(st, "cancelled")
        if st.promoted is not None:
            st.promoted = None
            self._finish_branch(st, "promoted")
        st.inflight = None
        st.cancelled = True

    def verify(self, st: RequestState) -> None:
        """Verify the in-flight block, commit, roll back, resolve the branch."""
        sp, cache, drafter, history = st.req.sampling, st.cache, st.drafter, st.history
        f, st.inflight = st.inflight, None
        block = f.block
        n = cache_length(cache)  # == len(history) - 1; history[n] is pending
        digest_before = history_digest(history)
        t1 = time.perf_counter()
        verdict, ps, au, tu, hidden = self._verify(history, cache, block, sp, st.seed, st.cursor)
        t2 = time.perf_counter()

        emitted = block.tokens[: verdict.accepted] + [verdict.next_token]
        n_events = len(st.out.events)
        c = self._commit(st, emitted, self._emitted_logprobs(ps, block, emitted))
        history += emitted[:c]
        trim_cache(cache, n + c)  # inputs x_n, d_1..d_{c-1} stay; the last emitted is pending
        if drafter is not None:
            drafter.after_verify(n, n + c, hidden)
        self._commit_cursor_state(st, self._committed_cursor(st.cursor, block, verdict, emitted[:c]))
        if f.branch is not None:
            self._resolve_branch(st, block, verdict, f.branch)

        k = len(block.tokens)
        stats = st.stats
        if st.plan.used:
            stats.rounds += 1
            stats.accept_lens.append(verdict.accepted)
            stats.draft_lens.append(k)
            stats.bonus += verdict.next_kind == "bonus" and c == len(emitted)
            stats.corrections += verdict.next_kind == "correction" and c == len(emitted)
            stats.draft_time += f.draft_time
            stats.verify_time += t2 - t1
        if st.traces is not None:
            st.traces.append(
                RoundTrace(
                    round=len(st.traces),
                    position=block.position,
                    pending_token=history[n],
                    proposals=block.tokens,
                    draft_probs=block.probs.tolist(),
                    target_probs=ps.tolist(),
                    draft_uniforms=block.uniforms,
                    accept_uniforms=au.tolist(),
                    target_uniforms=tu.tolist(),
                    accepted=verdict.accepted,
                    next_token=verdict.next_token,
                    next_kind=verdict.next_kind,
                    next_law=verdict.next_law.tolist(),
                    committed=emitted[:c],
                    target_len_before=n,
                    target_len_after=cache_length(cache),
                    draft_len_before=f.draft_len_before,
                    draft_len_after=drafter.length if drafter else 0,
                    sampler_digest_before=digest_before,
                    sampler_digest_after=history_digest(history),
                    events=list(range(n_events, len(st.out.events))),
                )
            )
        if st.observer:
            st.observer(Snapshot(st.round, list(history), cache, drafter, st.out, st.cursor))
        st.round += 1

    def result(self, st: RequestState) -> GenerationResult:
        return GenerationResult(
            tokens=st.out.tokens,
            text=st.out.text_published,
            finish_reason=st.out.finish_reason,
            logprobs=st.out.logprobs if st.req.logprobs else None,
            events=st.out.events,
            speculation=self.report(st),
            trace=st.traces,
            seed=st.seed,
        )

    # -- lookahead resolution ---------------------------------------------------
    def branch_outcome(self, st: RequestState, block: DraftBlock, verdict: Verdict, branch: DraftBlock) -> str:
        """Promote only after full acceptance, with prefixes agreeing and the
        bonus equal to the branch's first token; a terminal bonus discards."""
        if st.done:
            return "terminal"
        if verdict.accepted < len(block.tokens) or branch.position != block.position + len(block.tokens):
            return "parent_rejected"
        return "promoted" if verdict.next_token == branch.tokens[0] else "mismatch"

    def _resolve_branch(self, st: RequestState, block: DraftBlock, verdict: Verdict, branch: DraftBlock) -> None:
        outcome = self.branch_outcome(st, block, verdict, branch)
        st.records[-1].bonus = verdict.next_token
        if outcome != "promoted":
            self._finish_branch(st, outcome)
            return
        st.records[-1].outcome, st.records[-1].consumed_as_bonus = outcome, 1
        st.look.consumed += 1
        st.look.matches += 1
        st.promoted = branch  # its remaining proposals are counted at the next propose

    def _reuse(self, st: RequestState, n: int, k: int) -> DraftBlock:
        """The promoted branch less its first token (the bonus), cut to k, then
        extended from the saved frontier back to k proposals."""
        branch, st.promoted = st.promoted, None
        rest = DraftBlock(branch.tokens[1:], branch.probs[1:], branch.uniforms[1:], branch.position + 1, branch.frontier)
        r = min(len(rest.tokens), k)
        block = rest.head(r)
        frontier = branch.frontier
        trim_cache(frontier.cache, n + r)  # fed exactly what normal drafting of r proposals feeds
        st.drafter = frontier
        rec = st.records[-1]
        rec.reused, rec.discarded = r, len(rest.tokens) - r
        block = frontier.extend(st.history, block, k, st.req.sampling, st.seed, st.cursor.advance_all(block.tokens))
        rec.extended = len(block.tokens) - r
        self._count_resolution(st, rec)
        return block

    def _finish_branch(self, st: RequestState, outcome: str) -> None:
        """Discard the rest of the latest branch (everything not consumed)."""
        rec = st.records[-1]
        rec.outcome = outcome
        st.look.mismatches += outcome == "mismatch"
        rec.discarded = len(rec.tokens) - rec.consumed_as_bonus
        self._count_resolution(st, rec)

    def _count_resolution(self, st: RequestState, rec: BranchRecord) -> None:
        look = st.look
        look.reused += rec.reused
        look.discarded += rec.discarded
        look.resolved += 1
        N = st.adaptive_after
        if N is not None and look.resolved >= N and (look.reused == 0 or look.discarded > look.reused):
            look.disabled = True

    # -- randomness and commit (seams that mtpcheck.mutants overrides) -----------
    def uniform(self, seed: int, stream: int, position: int) -> float:
        """Position-addressed randomness (sampling.uniform)."""
        return uniform(seed, stream, position)

    def _emitted_logprobs(self, ps: np.ndarray, block: DraftBlock, emitted: list[int]) -> list[float]:
        """Logprob of each emitted token under the target law at its position."""
        return [_logprob(ps[j], t) for j, t in enumerate(emitted)]

    def _commit(self, st: RequestState, emitted: list[int], logprobs: list[float]) -> int:
        """Commit the allowed prefix of a round's tokens (events.commit_tokens); returns how many."""
        return commit_tokens(st.out, st.matcher, emitted, logprobs, st.req.max_tokens)

    # -- constraint state -------------------------------------------------------
    def _committed_cursor(self, cursor: Cursor, block: DraftBlock, verdict: Verdict, committed: list[int]) -> Cursor:
        """The request's constraint state moves by committed tokens only."""
        return cursor.advance_all(committed)

    def _commit_cursor_state(self, st: RequestState, cursor: Cursor) -> None:
        st.cursor = cursor
        if cursor.dfa is not None:
            st.constraint_log.append((len(st.out.tokens), cursor.state))

    def target_law(self, logits: np.ndarray, sp, history: list[int]) -> np.ndarray:
        """The target's processed law from one row of logits [V] (prefill and verification)."""
        return process(logits, sp, history)

    def _verify(self, history, cache, block: DraftBlock, sp, seed, cursor: Cursor):
        """One target pass over [pending, d_1..d_k] -> the rule's verdict. Each
        row is masked at its exact history (a transaction-local cursor)."""
        k = len(block.tokens)
        hidden, logits = self.target(mx.array([history[-1]] + block.tokens)[None], cache)  # [1, k+1, V]
        rows = np.array(logits[0], dtype=np.float64)
        cursors = [cursor]
        for d in block.tokens:  # a forbidden proposal (p = 0) is surely rejected: rows after it go unused
            c = cursors[-1]
            cursors.append(c.advance(d) if c.mask is None or c.mask[d] else c)
        ps = np.stack([self.target_law(masked(rows[j], cursors[j].mask), sp, history + block.tokens[:j])
                       for j in range(k + 1)])  # [k+1, V]
        positions = range(block.position, block.position + k + 1)
        au = np.array([self.uniform(seed, STREAM_ACCEPT, pos) for pos in positions[:k]])
        tu = np.array([self.uniform(seed, STREAM_TARGET, pos) for pos in positions])
        verdict: Verdict = self.rule.verify(ps, block.probs, block.tokens, au, tu)
        return verdict, ps, au, tu, hidden[0]

    def report(self, st: RequestState) -> SpeculationReport:
        plan, s, look = st.plan, st.stats, st.look
        drafted, accepted = sum(s.draft_lens), sum(s.accept_lens)
        return SpeculationReport(
            requested=plan.requested,
            used=plan.used,
            mode=plan.mode,
            drafter=plan.drafter if plan.requested else None,
            num_draft_tokens=plan.depth if plan.used else 0,
            draft_kind=plan.drafter if plan.used else None,
            runtime="mtpcheck-reference",
            acceptance_rule=self.rule.name,
            reason=plan.reason,
            message=plan.message,
            rounds=s.rounds,
            drafted=drafted,
            accepted=accepted,
            accept_lens=s.accept_lens,
            draft_lens=s.draft_lens,
            acceptance_rate=(accepted / drafted) if drafted else None,
            bonus_tokens=s.bonus,
            corrections=s.corrections,
            lookahead_drafted=look.drafted,
            lookahead_consumed_as_bonus=look.consumed,
            lookahead_reused=look.reused,
            lookahead_discarded=look.discarded,
            bonus_matches=look.matches,
            bonus_mismatches=look.mismatches,
            adaptive_disabled=look.disabled,
            draft_time_s=s.draft_time,
            verify_time_s=s.verify_time,
        )


def _logprob(p: np.ndarray, tok: int) -> float:
    return math.log(p[tok]) if p[tok] > 0 else -math.inf
