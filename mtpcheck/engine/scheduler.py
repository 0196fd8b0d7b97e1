"""Many requests over one Engine: fair action selection, optional lookahead,
cancellation, per-request constraints.

A request's life is a sequence of actions on its own RequestState:
  prefill, then per round: propose -> [lookahead] -> verify.
Each request owns its sampler settings, constraint cursor, stop matcher,
callback, caches and random roots (its seed), and every draw is keyed by
(seed, stream, logical position), so which actions of other requests run
in between cannot change its output.

Fairness: least recently served. Each `step` runs one action of the runnable
request whose last action is oldest (ties: submission order); a new request
queues behind those already waiting. With R runnable requests none waits
more than R - 1 actions between two of its own (round-robin).

Lookahead (assistant drafter only): after `propose`, when the options allow
it, the request's next action drafts one optional branch before `verify`
(lookahead.draft). `SchedulerOptions.with_lookahead(False)` disables
only that action; `adaptive_after` is the per-request adaptive rule's N.

Cancellation: `cancel` drops the in-flight block and branch; nothing more of
the request is published; its statistics count only verified rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from mtpcheck.contracts import GenerationRequest
from mtpcheck.contracts.scheduling import (
    ConstraintSpec,
    ConstraintStep,
    LookaheadRecord,
    ScheduledOutcome,
)

from . import lookahead as branch  # the module; `lookahead` is also an action's flag here
from .constraints import TokenDFA, compile_constraint
from .decode import Engine
from .state import RequestState


@dataclass(frozen=True)
class SchedulerOptions:
    lookahead: bool = True
    adaptive_after: int | None = 8  # resolved branches before lookahead may turn itself off; None: never

    def with_lookahead(self, on: bool) -> SchedulerOptions:
        return replace(self, lookahead=on)


@dataclass
class Job:
    id: int
    state: RequestState
    callback: Callable[[object], None] | None
    published: int = 0  # events handed to the callback
    last_served: int = 0


class Scheduler:
    """Implements mtpcheck.contracts.scheduling.SchedulerSession for the reference engine."""

    def __init__(self, engine: Engine, options: SchedulerOptions | None = None):
        self.engine = engine
        self.options = options or SchedulerOptions()
        self.jobs: dict[int, Job] = {}
        self.clock = 0

    # -- requests ---------------------------------------------------------------
    def submit(self, request: GenerationRequest, constraint: ConstraintSpec | TokenDFA | None = None,
               callback: Callable[[object], None] | None = None) -> int:
        dfa = self._compile(constraint, request) if isinstance(constraint, ConstraintSpec) else constraint
        st = self.engine.admit(request, constraint=dfa)  # raises now on a bad request
        st.adaptive_after = self.options.adaptive_after
        rid = len(self.jobs)
        self.clock += 1
        self.jobs[rid] = Job(rid, st, callback, last_served=self.clock)
        return rid

    def runnable(self) -> list[int]:
        return [j.id for j in self.jobs.values() if not j.state.done]

    def cancel(self, request_id: int) -> None:
        st = self.jobs[request_id].state
        if st.out.finish_reason is None:
            self.engine.cancel(st)

    def drop_branch(self, request_id: int) -> bool:
        return branch.drop(self.jobs[request_id].state)

    # -- actions ----------------------------------------------------------------
    def step(self) -> int | None:
        """One action of the least recently served runnable request."""
        ready = [self.jobs[i] for i in self.runnable()]
        if not ready:
            return None
        job = min(ready, key=lambda j: (j.last_served, j.id))
        self.advance(job.id, self.options.lookahead)
        return job.id

    def advance(self, request_id: int, lookahead: bool = True) -> str:
        job = self.jobs[request_id]
        action = self.next_action(job.state, lookahead)
        e, st = self.engine, job.state
        {"prefill": e.prefill, "propose": e.propose, "lookahead": branch.draft, "verify": e.verify,
         "none": lambda st: None}[action](st)
        self.clock += 1
        job.last_served = self.clock
        self._publish(job)
        return action

    def next_action(self, st: RequestState, lookahead: bool = True) -> str:
        if st.done:
            return "none"
        if not st.out.tokens:
            return "prefill"
        if st.inflight is None:
            return "propose"
        if lookahead and self.options.lookahead and branch.possible(st):
            return "lookahead"
        return "verify"

    def run(self) -> dict[int, ScheduledOutcome]:
        while self.step() is not None:
            pass
        return {rid: self.outcome(rid) for rid in self.jobs}

    # -- results ----------------------------------------------------------------
    def _publish(self, job: Job) -> None:
        """Hand newly committed events to the callback; a cancelled request commits none."""
        events = job.state.out.events
        if job.callback is not None:
            for ev in events[job.published :]:
                job.callback(ev)
        job.published = len(events)

    def outcome(self, request_id: int) -> ScheduledOutcome:
        st = self.jobs[request_id].state
        dfa = st.cursor.dfa
        return ScheduledOutcome(
            request_id=request_id,
            cancelled=st.cancelled,
            finish_reason=st.out.finish_reason,
            tokens=st.out.tokens,
            logprobs=st.out.logprobs if st.req.logprobs else None,
            text=st.out.text_published,
            events=st.out.events,
            speculation=self.engine.report(st),
            trace=st.traces,
            seed=st.seed,
            lookahead=[LookaheadRecord(**asdict(r)) for r in st.records],
            constraint_steps=[ConstraintStep(committed=n, state=s, signature=dfa.signature(s)) for n, s in st.constraint_log],
        )

    def _compile(self, spec: ConstraintSpec, req: GenerationRequest) -> TokenDFA:
        e = self.engine
        eos = list(e.eos_ids if req.stop_token_ids is None else req.stop_token_ids)
        return compile_constraint(spec, e.vocab_size, eos, e.token_texts() if spec.strings is not None else None)
