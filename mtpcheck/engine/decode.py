"""One request: prefill, then rounds of draft k -> verify k+1 -> commit -> roll back.

Invariants between rounds (checked by tests/test_rollback.py):
  target cache length == len(prompt + output) - 1: the last emitted token
  (correction or bonus) is pending, uncached, and leads the next verification;
  the draft cache holds no speculative entries (draft.py).
Speculation off runs the same loop with zero proposals per round.
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

    @property
    def done(self) -> bool:
        return self.out.finish_reason is not None


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

    # -- generation -----------------------------------------------------------
    def generate(self, req: GenerationRequest, observer: Callable[[Snapshot], None] | None = None) -> GenerationResult:
        state = self.start(req, observer)
        while not state.done:
            self.step(state)
        return self.result(state)

    def start(self, req: GenerationRequest, observer: Callable[[Snapshot], None] | None = None) -> RequestState:
        """Plan, then prefill: the first token comes from the target alone."""
        plan = self.plan(req)
        for t in req.prompt_tokens:
            if t >= self.vocab_size:
                raise ValueError(f"prompt_tokens: token id {t} is outside the vocabulary (size {self.vocab_size})")
        sp = req.sampling
        eos = self.eos_ids if req.stop_token_ids is None else tuple(req.stop_token_ids)
        st = RequestState(
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
        )
        hidden, logits = self.target(mx.array(st.history)[None], st.cache)
        if st.drafter is not None:
            st.drafter.observe(0, hidden[0])
        p = process(np.array(logits[0, -1], dtype=np.float64), sp, st.history)
        tok = sample(p, uniform(st.seed, STREAM_TARGET, len(st.history)))
        commit_tokens(st.out, st.matcher, [tok], [_logprob(p, tok)], req.max_tokens)
        st.history.append(tok)
        if observer:
            observer(Snapshot(-1, list(st.history), st.cache, st.drafter, st.out))
        return st

    def step(self, st: RequestState) -> None:
        """One round: draft k, verify k+1 in one target pass, commit, roll back."""
        req, sp, cache, drafter, history = st.req, st.req.sampling, st.cache, st.drafter, st.history
        n = cache_length(cache)  # == len(history) - 1; history[n] is pending
        k = min(st.plan.depth, req.max_tokens - len(st.out.tokens) - 1) if st.plan.used else 0
        draft_len_before = drafter.length if drafter else 0
        digest_before = history_digest(history)
        t0 = time.perf_counter()
        block = drafter.draft(history, n, k, sp, st.seed) if k > 0 else _empty_block(n, self.vocab_size)
        t1 = time.perf_counter()
        verdict, ps, au, tu, hidden = self._verify(history, cache, block, sp, st.seed)
        t2 = time.perf_counter()

        emitted = block.tokens[: verdict.accepted] + [verdict.next_token]
        n_events = len(st.out.events)
        c = commit_tokens(st.out, st.matcher, emitted, [_logprob(ps[j], t) for j, t in enumerate(emitted)], req.max_tokens)
        history += emitted[:c]
        trim_cache(cache, n + c)  # inputs x_n, d_1..d_{c-1} stay; the last emitted is pending
        if drafter is not None:
            drafter.after_verify(n, n + c, hidden)

        stats = st.stats
        if st.plan.used:
            stats.rounds += 1
            stats.accept_lens.append(verdict.accepted)
            stats.draft_lens.append(k)
            stats.bonus += verdict.next_kind == "bonus" and c == len(emitted)
            stats.corrections += verdict.next_kind == "correction" and c == len(emitted)
            stats.draft_time += t1 - t0
            stats.verify_time += t2 - t1
        if st.traces is not None:
            st.traces.append(
                RoundTrace(
                    round=len(st.traces),
                    position=n + 1,
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
                    draft_len_before=draft_len_before,
                    draft_len_after=drafter.length if drafter else 0,
                    sampler_digest_before=digest_before,
                    sampler_digest_after=history_digest(history),
                    events=list(range(n_events, len(st.out.events))),
                )
            )
        if st.observer:
            st.observer(Snapshot(st.round, list(history), cache, drafter, st.out))
        st.round += 1

    def result(self, st: RequestState) -> GenerationResult:
        return GenerationResult(
            tokens=st.out.tokens,
            text=st.out.text_published,
            finish_reason=st.out.finish_reason,
            logprobs=st.out.logprobs if st.req.logprobs else None,
            events=st.out.events,
            speculation=self._report(st.plan, st.stats),
            trace=st.traces,
            seed=st.seed,
        )

    def _verify(self, history, cache, block: DraftBlock, sp, seed):
        """One target pass over [pending, d_1..d_k] -> the rule's verdict."""
        k = len(block.tokens)
        hidden, logits = self.target(mx.array([history[-1]] + block.tokens)[None], cache)  # [1, k+1, V]
        rows = np.array(logits[0], dtype=np.float64)
        ps = np.stack([process(rows[j], sp, history + block.tokens[:j]) for j in range(k + 1)])  # [k+1, V]
        positions = range(block.position, block.position + k + 1)
        au = np.array([uniform(seed, STREAM_ACCEPT, pos) for pos in positions[:k]])
        tu = np.array([uniform(seed, STREAM_TARGET, pos) for pos in positions])
        verdict: Verdict = self.rule.verify(ps, block.probs, block.tokens, au, tu)
        return verdict, ps, au, tu, hidden[0]

    def _report(self, plan: Plan, s: Stats) -> SpeculationReport:
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
            draft_time_s=s.draft_time,
            verify_time_s=s.verify_time,
        )


def _empty_block(n: int, vocab: int) -> DraftBlock:
    return DraftBlock([], np.zeros((0, vocab)), [], n + 1)


def _logprob(p: np.ndarray, tok: int) -> float:
    return math.log(p[tok]) if p[tok] > 0 else -math.inf
