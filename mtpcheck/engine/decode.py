"""One request: prefill, then rounds of draft k -> verify k+1 -> commit -> roll back.

Invariants between rounds (checked by tests/test_rollback.py):
  target cache length == len(prompt + output) - 1: the last emitted token
  (correction or bonus) is pending, uncached, and leads the next verification;
  the draft cache holds no speculative entries (draft.py).
Speculation off runs the same loop with zero proposals per round.

A round is two actions, `propose` and `verify`, so that a scheduler can
interleave requests and, between them, take the optional lookahead action
(lookahead.py). The steps of a round are functions in round.py; `Engine`
holds the models and the seams a runtime has its bugs in (mtpcheck.mutants):
the acceptance rule (`rule`), the target law, the verification pass, the
randomness source, the drafter, the commit/stop rule, the reported
logprobs, the constraint step and the report.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mtpcheck.contracts import (
    GenerationRequest,
    GenerationResult,
    SpeculationReport,
    SpeculationRequest,
    SpeculationUnavailableError,
)
from mtpcheck.contracts.models import history_digest

from . import lookahead
from .acceptance import Verdict, get_rule
from .cache import cache_length
from .constraints import Cursor, TokenDFA, masked
from .draft import AssistantDrafter, DraftBlock, MtpDrafter
from .events import OutputState, StopMatcher, commit_tokens
from .model import Model
from .round import Round, count, logprob, propose, roll_back, target_laws, trace, uniforms
from .sampling import STREAM_TARGET, process, sample, uniform
from .state import Plan, RequestState, Snapshot

__all__ = ["MAX_DEPTH", "Engine", "Plan", "RequestState", "Snapshot"]

MAX_DEPTH = 8


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
        top_k_ties: str = "exactly_k",
    ):
        self.target, self.assistant, self.tokenizer = target, assistant, tokenizer
        self.top_k_ties = top_k_ties  # the target law's top-k convention (Capabilities.top_k_ties)
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
        hidden, logits = self.target(mx.array(st.history)[None], st.cache)
        if st.drafter is not None:
            st.drafter.observe(0, hidden[0])
        p = self.target_law(masked(np.array(logits[0, -1], dtype=np.float64), st.cursor.mask), st.req.sampling,
                            st.history)
        tok = sample(p, self.uniform(st.seed, STREAM_TARGET, len(st.history)))
        self.commit(st, [tok], [logprob(p, tok)])
        st.history.append(tok)
        st.set_cursor(st.cursor.advance(tok))
        if st.observer:
            st.observer(Snapshot(-1, list(st.history), st.cache, st.drafter, st.out, st.cursor))

    def step(self, st: RequestState) -> None:
        """One round: draft k, verify k+1 in one target pass, commit, roll back."""
        self.propose(st)
        self.verify(st)

    # -- a round, as actions ----------------------------------------------------
    def propose(self, st: RequestState) -> None:
        """Draft this round's block (reusing a promoted branch when there is one)."""
        st.inflight = propose(st, self.vocab_size)

    def verify(self, st: RequestState) -> None:
        """Verify the in-flight block, commit, roll back, resolve the branch."""
        f, st.inflight = st.inflight, None
        n = cache_length(st.cache)  # == len(history) - 1; history[n] is pending
        digest, events = history_digest(st.history), len(st.out.events)
        t0 = time.perf_counter()
        ps, hidden = self.target_pass(st.history, st.cache, f.block, st.req.sampling, st.cursor)
        au, tu = uniforms(self.uniform, st.seed, f.block)
        verdict: Verdict = self.rule.verify(ps, f.block.probs, f.block.tokens, au, tu)
        rnd = Round(block=f.block, ps=ps, au=au, tu=tu, verdict=verdict, pending=st.history[n], target_len=n,
                    draft_len=f.draft_len_before, digest=digest, events=events, draft_time=f.draft_time,
                    verify_time=time.perf_counter() - t0)

        c = self.commit(st, rnd.emitted, self.logprobs(rnd))
        rnd.committed = rnd.emitted[:c]
        st.history += rnd.committed
        roll_back(st.cache, st.drafter, rnd, hidden)
        st.set_cursor(self.cursor_after(st.cursor, rnd))
        if f.branch is not None:
            lookahead.resolve(st, verdict, f.branch, self.branch_outcome(st, f.block, verdict, f.branch))
        if st.plan.used:
            count(st.stats, rnd)
        if st.traces is not None:
            st.traces.append(trace(rnd, len(st.traces), st))
        if st.observer:
            st.observer(Snapshot(st.round, list(st.history), st.cache, st.drafter, st.out, st.cursor))
        st.round += 1

    def cancel(self, st: RequestState) -> None:
        """Stop the request: nothing more is committed or published; work in
        flight is dropped and its statistics are never counted."""
        if st.cancelled:
            return
        lookahead.cancel(st)
        st.inflight = None
        st.cancelled = True

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

    # -- seams: the engine's own steps, where mtpcheck.mutants puts its bugs -----
    def target_law(self, logits: np.ndarray, sp, history: list[int]) -> np.ndarray:
        """The target's processed law from one row of logits [V] (prefill and verification)."""
        return process(logits, sp, history, self.top_k_ties)

    def target_pass(self, history: list[int], cache: list, block: DraftBlock, sp, cursor: Cursor):
        """The verification pass: (ps [k+1, V], hidden [k+1, D]) for [pending, d_1..d_k]."""
        return target_laws(self.target, self.target_law, history, cache, block, sp, cursor)

    def uniform(self, seed: int, stream: int, position: int) -> float:
        """Position-addressed randomness (sampling.uniform)."""
        return uniform(seed, stream, position)

    def commit(self, st: RequestState, tokens: list[int], logprobs: list[float]) -> int:
        """The stop rule: commit the allowed prefix of tokens (events.commit_tokens); returns how many."""
        return commit_tokens(st.out, st.matcher, tokens, logprobs, st.req.max_tokens)

    def logprobs(self, rnd: Round) -> list[float]:
        """Each emitted token's logprob under the target law at its position."""
        return [logprob(rnd.ps[j], t) for j, t in enumerate(rnd.emitted)]

    def cursor_after(self, cursor: Cursor, rnd: Round) -> Cursor:
        """The request's constraint state moves by committed tokens only."""
        return cursor.advance_all(rnd.committed)

    def branch_outcome(self, st: RequestState, block: DraftBlock, verdict: Verdict, branch: DraftBlock) -> str:
        """The lookahead promotion rule (lookahead.outcome)."""
        return lookahead.outcome(st.done, block, verdict, branch)

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
