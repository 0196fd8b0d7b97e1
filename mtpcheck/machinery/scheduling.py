"""The checks of the scheduling clauses (mtpcheck/catalogue/scheduler.toml):
many requests on one loaded runtime, cancellation, lookahead, token
constraints; and the suite's way into a session (`open_session`, behind the
guarded backend's timeout).

The protocol itself - `SchedulerSession`, `SchedulingBackend`,
`ScheduledOutcome`, `LookaheadRecord`, `ConstraintStep`, `ConstraintSpec`,
`Grammar`, `GrammarEdge` - is a contract (mtpcheck/contracts/scheduling.py),
implemented by the reference engine and by any backend that declares the
capability `scheduler`; it is re-exported here, so that
``from mtpcheck.machinery.scheduling import ScheduledOutcome`` keeps working.
The suite drives a session one action at a time, either by the backend's own
fair policy (`step`) or by naming the request to advance (`advance`), so that
hypothesis can choose interleavings. Importing this module does not import
mlx.
"""

from __future__ import annotations

import queue
import threading
import weakref

import numpy as np

from mtpcheck.contracts import BackendError, GenerationRequest, GenerationResult, RoundTrace
from mtpcheck.contracts.scheduling import (
    ConstraintSpec,
    ConstraintStep,
    Grammar,
    GrammarEdge,
    LookaheadRecord,
    ScheduledOutcome,
    SchedulerSession,
    SchedulingBackend,
)


def compile_spec(spec: ConstraintSpec, vocab: int, eos: list[int], token_texts: list[str] | None = None):
    """The suite's own automaton for a spec: what a fresh constraint says."""
    from mtpcheck.engine.constraints import compile_constraint

    return compile_constraint(spec, vocab, eos, token_texts)


def open_session(backend, **options) -> SchedulerSession:
    """The session of a (possibly guarded) backend that declares `scheduler`;
    behind a guarded backend every call gets its timeout and outcomes are validated."""
    inner = getattr(backend, "backend", backend)
    if not isinstance(inner, SchedulingBackend):
        raise BackendError(f"backend {type(inner).__name__} declares the scheduler capability but has no open_scheduler()")
    if inner is backend:
        return inner.open_scheduler(**options)
    # opened on the session's own thread, under the timeout: an opener that hangs is named, not waited on
    return _GuardedSession(lambda: inner.open_scheduler(**options), backend.timeout)


class _GuardedSession:
    """Every call runs on one worker thread of its own (MLX ties lazy arrays to
    the thread that made them) and gets the guarded backend's timeout."""

    def __init__(self, opener, timeout: float | None):
        self._timeout = timeout
        self._jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, args=(self._jobs,), daemon=True, name="mtpcheck:session").start()
        weakref.finalize(self, self._jobs.put, None)  # stops the worker with the session
        self._session = self._run(opener, "open_scheduler")

    @staticmethod
    def _serve(jobs: queue.Queue) -> None:
        while (job := jobs.get()) is not None:
            fn, box, done = job
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            done.set()

    def _call(self, name: str, *args, **kwargs):
        fn = getattr(self._session, name)
        return self._run(lambda: fn(*args, **kwargs), name)

    def _run(self, job, name: str):
        from mtpcheck.machinery.harness import BackendTimeout

        box, done = {}, threading.Event()
        self._jobs.put((job, box, done))
        if not done.wait(self._timeout):
            raise BackendTimeout(f"{name}() did not return within {self._timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def __getattr__(self, name: str):
        getattr(self._session, name)  # AttributeError now, not in the worker
        return lambda *a, **kw: self._call(name, *a, **kw)

    def outcome(self, request_id: int) -> ScheduledOutcome:
        raw = self._call("outcome", request_id)
        return raw if isinstance(raw, ScheduledOutcome) else ScheduledOutcome.model_validate(raw)


def run_all(session: SchedulerSession) -> list[int]:
    """Step until idle; the ids served, in order."""
    served = []
    while (rid := session.step()) is not None:
        served.append(rid)
    return served


# -- checks: interleaving and cancellation ---------------------------------------


def interleave_problems(out: ScheduledOutcome, solo: GenerationResult) -> list[str]:
    """A request run beside others equals its solo run; a cancelled one
    published a prefix of it."""
    tag = f"request {out.request_id}"
    if out.cancelled:
        n = len(out.tokens)
        problems = [] if out.tokens == solo.tokens[:n] else [f"{tag} (cancelled): tokens are not a prefix of its solo run"]
        if out.events != solo.events[: len(out.events)]:
            problems.append(f"{tag} (cancelled): events are not a prefix of its solo run's")
        return problems
    problems = []
    if out.tokens != solo.tokens:
        i = next((i for i, (a, b) in enumerate(zip(out.tokens, solo.tokens, strict=False)) if a != b),
                 min(len(out.tokens), len(solo.tokens)))
        problems.append(f"{tag}: tokens differ from its solo run from index {i}")
    if out.logprobs != solo.logprobs:
        problems.append(f"{tag}: logprobs differ from its solo run")
    if out.events != solo.events or out.text != solo.text or out.finish_reason != solo.finish_reason:
        problems.append(f"{tag}: events, text or finish reason differ from its solo run")
    return problems


def report_problems(out: ScheduledOutcome, first_token_from_prefill: bool = True) -> list[str]:
    """Statistics agree with each other and with the committed stream, counted
    by the backend's declared schedule (as checks.stats_problems). Output
    ended by a stop or the budget may cut the last block; cancelled output
    holds only whole rounds."""
    s, tag = out.speculation, f"request {out.request_id}"
    problems = []
    if not (s.rounds == len(s.accept_lens) == len(s.draft_lens)):
        problems.append(f"{tag}: rounds={s.rounds}, {len(s.accept_lens)} accept_lens, {len(s.draft_lens)} draft_lens")
    if s.drafted != sum(s.draft_lens) or s.accepted != sum(s.accept_lens):
        problems.append(f"{tag}: drafted/accepted disagree with draft_lens/accept_lens")
    if s.used and out.tokens:
        full = int(first_token_from_prefill) + s.accepted + s.rounds
        cut = full - len(out.tokens)
        if cut < 0 or (out.cancelled and cut != 0) or cut > (s.accept_lens[-1] if s.accept_lens else 0):
            problems.append(f"{tag}: {len(out.tokens)} tokens but statistics imply {full} "
                            f"(cancelled={out.cancelled}: rounds verified after the cancel, or a rejected tail counted)")
    if not out.tokens and (s.rounds or s.drafted):
        problems.append(f"{tag}: no token published but {s.rounds} rounds counted")
    return problems


def event_problems(out: ScheduledOutcome, delivered: list, after_cancel: int | None = None) -> list[str]:
    """The callback got exactly the published events; none after the cancel."""
    tag = f"request {out.request_id}"
    problems = []
    if delivered != out.events:
        problems.append(f"{tag}: the callback received {len(delivered)} events, the outcome lists {len(out.events)}")
    if after_cancel is not None and len(delivered) != after_cancel:
        problems.append(f"{tag}: {len(delivered) - after_cancel} events published after cancel() returned")
    return problems


def fairness_problems(served: list[int], runnable: list[list[int]]) -> list[str]:
    """Round-robin bound: between two services of a request, every other
    request runnable throughout was served. runnable[i] is the set before step i."""
    problems = []
    last: dict[int, int] = {}
    for i, rid in enumerate(served):
        if rid not in runnable[i]:
            problems.append(f"step {i}: served request {rid}, which was not runnable")
        if rid in last:
            j = last[rid]
            waiting = set.intersection(*(set(r) for r in runnable[j : i + 1])) - {rid} - set(served[j + 1 : i])
            if waiting:
                problems.append(f"step {i}: request {rid} served twice while {sorted(waiting)} waited")
        last[rid] = i
    return problems


# -- checks: lookahead --------------------------------------------------------------


def lookahead_stats_problems(out: ScheduledOutcome, adaptive_after: int | None) -> list[str]:
    """Optional-work statistics agree with each other and with the records."""
    s, recs, tag = out.speculation, out.lookahead, f"request {out.request_id}"
    problems = []
    for i, r in enumerate(recs):
        if r.outcome == "pending":
            problems.append(f"{tag}: branch {i} never resolved")
        elif r.consumed_as_bonus + r.reused + r.discarded != len(r.tokens):
            problems.append(f"{tag}: branch {i}: consumed {r.consumed_as_bonus} + reused {r.reused} + "
                            f"discarded {r.discarded} != drafted {len(r.tokens)}")
        if r.consumed_as_bonus != (r.outcome == "promoted"):
            problems.append(f"{tag}: branch {i} ({r.outcome}) consumed {r.consumed_as_bonus} as the bonus")
    totals = {
        "lookahead_drafted": sum(len(r.tokens) for r in recs),
        "lookahead_consumed_as_bonus": sum(r.consumed_as_bonus for r in recs),
        "lookahead_reused": sum(r.reused for r in recs),
        "lookahead_discarded": sum(r.discarded for r in recs),
        "bonus_matches": sum(r.outcome == "promoted" for r in recs),
        "bonus_mismatches": sum(r.outcome == "mismatch" for r in recs),
    }
    problems += [f"{tag}: {k}={getattr(s, k)}, the branch records say {v}" for k, v in totals.items() if getattr(s, k) != v]
    if s.lookahead_drafted != s.lookahead_consumed_as_bonus + s.lookahead_reused + s.lookahead_discarded:
        problems.append(f"{tag}: lookahead drafted {s.lookahead_drafted} != consumed + reused + discarded")
    if s.lookahead_consumed_as_bonus != s.bonus_matches:
        problems.append(f"{tag}: {s.lookahead_consumed_as_bonus} consumed as bonus but {s.bonus_matches} bonus matches")
    return problems + _adaptive_problems(out, adaptive_after)


def _adaptive_problems(out: ScheduledOutcome, N: int | None) -> list[str]:
    """Disabled exactly when, after >= N resolved branches, nothing was reused
    or discards outnumbered reuses; no branch drafted after that."""
    tag = f"request {out.request_id}"
    reused = discarded = 0
    trip = None
    for i, r in enumerate(out.lookahead):
        reused, discarded = reused + r.reused, discarded + r.discarded
        if N is not None and i + 1 >= N and (reused == 0 or discarded > reused):
            trip = i
            break
    if out.speculation.adaptive_disabled != (trip is not None):
        return [f"{tag}: adaptive_disabled={out.speculation.adaptive_disabled}, the rule (N={N}) says {trip is not None}"]
    if trip is not None and len(out.lookahead) > trip + 1:
        return [f"{tag}: {len(out.lookahead) - trip - 1} branches drafted after lookahead disabled itself"]
    return []


def promotion_problems(out: ScheduledOutcome, req: GenerationRequest) -> list[str]:
    """Re-check every branch against the trace of its parent round (and of the
    round that reused it)."""
    tag, s, trace = f"request {out.request_id}", out.speculation, out.trace or []
    if out.lookahead and s.draft_kind != "assistant":
        return [f"{tag}: {len(out.lookahead)} lookahead branches with draft kind {s.draft_kind!r} (assistant only)"]
    problems = []
    for i, r in enumerate(out.lookahead):
        if r.round >= len(trace):
            if r.outcome not in ("dropped", "cancelled"):
                problems.append(f"{tag}: branch {i} resolved as {r.outcome} but its parent round was never verified")
            continue
        problems += [f"{tag}: branch {i}: {p}" for p in _branch_problems(r, trace, req, s.num_draft_tokens, out)]
    return problems


def _branch_problems(r: LookaheadRecord, trace: list[RoundTrace], req, depth: int, out) -> list[str]:
    t = trace[r.round]
    k = len(t.proposals)
    if t.proposals != r.parent_proposals or t.position != r.parent_position or r.position != t.position + k:
        return ["drafted from a history that is not its parent block's (prefixes disagree)"]
    if not 1 <= len(r.tokens) <= max(depth, 1):
        return [f"{len(r.tokens)} tokens at depth {depth}"]
    full = t.accepted == k and t.next_kind == "bonus"
    terminal = r.round == len(trace) - 1 and out.finish_reason is not None  # the round that ended the output
    if r.outcome in ("dropped", "cancelled"):
        return [] if r.consumed_as_bonus + r.reused == 0 else [f"{r.outcome} yet {r.consumed_as_bonus + r.reused} tokens used"]
    if r.bonus != t.next_token:
        return [f"resolved against next token {r.bonus}, the parent round's is {t.next_token}"]
    want = ("terminal" if terminal else "parent_rejected" if not full
            else "promoted" if t.next_token == r.tokens[0] else "mismatch")
    if r.outcome != want:
        return [f"outcome {r.outcome}, the rules say {want} (accepted {t.accepted}/{k}, "
                f"next {t.next_kind} {t.next_token}, branch starts {r.tokens[0]})"]
    if want != "promoted":
        return [] if r.reused == 0 else [f"{want} yet {r.reused} proposals reused"]
    return _reuse_problems(r, trace, req, depth, bool(out.constraint_steps))


def _reuse_problems(r: LookaheadRecord, trace: list[RoundTrace], req, depth: int, constrained: bool) -> list[str]:
    if r.round + 1 >= len(trace):
        return [] if r.reused == 0 else [f"{r.reused} proposals reused by a round that never ran"]
    nxt = trace[r.round + 1]
    reused = r.tokens[1 : 1 + r.reused]
    if nxt.proposals[: r.reused] != reused:
        return [f"reused {reused}, the next round proposed {nxt.proposals[: r.reused]}"]
    if r.reused and not np.array_equal(np.array(nxt.draft_probs[: r.reused]), np.array(r.probs[1 : 1 + r.reused])):
        return ["a reused proposal's draft law differs from the one it was drawn from"]
    if r.reused + r.extended != len(nxt.proposals):
        return [f"reused {r.reused} + extended {r.extended} != {len(nxt.proposals)} proposals in the next round"]
    budget = req.max_tokens - (nxt.position - len(req.prompt_tokens)) - 1  # position - P tokens were out
    if len(nxt.proposals) < min(depth, budget) and not constrained:
        return [f"the next round proposed {len(nxt.proposals)}, not extended back to depth {min(depth, budget)}"]
    return []


def equivalence_problems(on: ScheduledOutcome, off: ScheduledOutcome) -> list[str]:
    """Lookahead on and off: the same tokens, events, and (when traced) rounds."""
    problems = []
    if on.tokens != off.tokens or on.events != off.events:
        problems.append(f"request {on.request_id}: output with lookahead differs from output without")
    if on.trace is not None and off.trace is not None and on.trace != off.trace:
        i = next((i for i, (a, b) in enumerate(zip(on.trace, off.trace, strict=False)) if a != b), len(on.trace))
        problems.append(f"request {on.request_id}: round {i} differs with lookahead (proposals, laws or decisions)")
    if off.lookahead or off.speculation.lookahead_drafted:
        problems.append(f"request {off.request_id}: lookahead work reported with lookahead disabled")
    return problems


# -- checks: constraints ------------------------------------------------------------


def constraint_emit_problems(out: ScheduledOutcome, dfa) -> list[str]:
    """No emitted token violates the constraint."""
    bad = dfa.violations(out.tokens)
    if not bad:
        return []
    # after the first wrong token the automaton is dead: every later token "violates" it as a knock-on
    later = f"; the {len(bad) - 1} violations after it are knock-ons of that token" if len(bad) > 1 else ""
    return [f"request {out.request_id}: token {bad[0]} ({out.tokens[bad[0]]}) is the first that violates the constraint{later}"]


def constraint_rollback_problems(out: ScheduledOutcome, dfa) -> list[str]:
    """After every commit the state equals a fresh automaton fed the committed tokens."""
    problems = []
    if out.tokens and len(out.constraint_steps) != out.speculation.rounds + 1 and out.speculation.used:
        problems.append(f"request {out.request_id}: {len(out.constraint_steps)} constraint steps for "
                        f"{out.speculation.rounds} rounds and the prefill")
    wrong = dfa.violations(out.tokens)
    first_state = None
    for step in out.constraint_steps:
        want = dfa.signature(dfa.walk(out.tokens[: step.committed]))
        if step.signature != want:
            earlier = [i for i in wrong if i < step.committed]
            if earlier:  # the state is judged against tokens the constraint already rejects
                why = f"a knock-on of token {earlier[0]} ({out.tokens[earlier[0]]}), the first wrong token"
            elif first_state is not None:
                why = f"a knock-on of the first wrong state, after {first_state} committed tokens"
            else:
                why = "a rejected proposal advanced it?"
                first_state = step.committed
            problems.append(f"request {out.request_id}: after {step.committed} committed tokens the constraint "
                            f"state is not that of a fresh automaton fed them ({why})")
    return problems


def constraint_mask_problems(out: ScheduledOutcome, dfa) -> list[str]:
    """Draft and target laws are masked at their exact histories; no proposal
    is drafted at a grammar-complete state."""
    problems, committed = [], 1
    wrong = dfa.violations(out.tokens)
    for t in out.trace or []:
        if wrong and wrong[0] < committed:  # the history itself breaks the constraint: masks after it are moot
            problems.append(f"round {t.round} and later: not checked, a knock-on of token {wrong[0]} "
                            f"({out.tokens[wrong[0]]}), the first wrong token")
            break
        state = dfa.walk(out.tokens[:committed])
        for j in range(len(t.proposals) + 1):
            if state < 0:
                break
            allowed = dfa.allowed(state)
            if np.asarray(t.target_probs[j])[~allowed].sum() > 0:
                problems.append(f"round {t.round}: target law {j} has mass on tokens the constraint forbids there")
            if j < len(t.proposals):
                if dfa.complete(state):
                    problems.append(f"round {t.round}: proposal {j} drafted past a grammar-complete boundary")
                if np.asarray(t.draft_probs[j])[~allowed].sum() > 0:
                    problems.append(f"round {t.round}: draft law {j} has mass on tokens the constraint forbids there")
                state = dfa.advance(state, t.proposals[j])
        committed += len(t.committed)
    return [f"request {out.request_id}: {p}" for p in problems]


__all__ = [
    # the protocol (mtpcheck.contracts.scheduling), re-exported
    "ConstraintSpec",
    "ConstraintStep",
    "Grammar",
    "GrammarEdge",
    "LookaheadRecord",
    "ScheduledOutcome",
    "SchedulerSession",
    "SchedulingBackend",
    # the suite's side
    "compile_spec",
    "constraint_emit_problems",
    "constraint_mask_problems",
    "constraint_rollback_problems",
    "equivalence_problems",
    "event_problems",
    "fairness_problems",
    "interleave_problems",
    "lookahead_stats_problems",
    "open_session",
    "promotion_problems",
    "report_problems",
    "run_all",
]
