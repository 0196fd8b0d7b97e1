"""The optional scheduling protocol: what a backend that declares the
capability `scheduler` implements, and what its sessions return.

`backend.open_scheduler(...) -> SchedulerSession`; the session is driven one
action at a time, either by the backend's own fair policy (`step`) or by the
suite naming the request to advance (`advance`). What a session returns for
a request is a `ScheduledOutcome`: a GenerationResult's fields plus the
records the white-box clauses re-check (lookahead branches, constraint
states); a request's constraint is a `ConstraintSpec`.

These are contracts, like the request and the result: the reference engine
(mtpcheck/engine/scheduler.py) implements them and the suite's checks
(mtpcheck/machinery/scheduling.py, which re-exports every name here) judge
them, neither importing the other (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .models import Event, GenerationRequest, GenerationResult, RoundTrace, SpeculationReport


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- constraints ---------------------------------------------------------------


class GrammarEdge(_Strict):
    src: int
    tokens: list[int]
    dst: int


class Grammar(_Strict):
    """A tiny grammar: a deterministic automaton over token ids."""

    start: int = 0
    edges: list[GrammarEdge]
    accepting: list[int]


class ConstraintSpec(_Strict):
    """Exactly one of: allowed token-id sequences, allowed strings (needs the
    `text` capability), or a grammar. At a complete state the end tokens
    (default: the request's stop tokens) are allowed as well."""

    sequences: list[list[int]] | None = None
    strings: list[str] | None = None
    grammar: Grammar | None = None
    end_token_ids: list[int] | None = None

    @model_validator(mode="after")
    def _one_form(self):
        if sum(x is not None for x in (self.sequences, self.strings, self.grammar)) != 1:
            raise ValueError("give exactly one of sequences, strings, grammar")
        return self


# -- what a session returns ----------------------------------------------------


class LookaheadRecord(_Strict):
    """One optional branch: drafted from a cloned assistant assuming its parent
    block (trace round `round`) is fully accepted; tokens[0] guesses the bonus."""

    round: int
    parent_position: int
    parent_proposals: list[int]
    position: int
    tokens: list[int]
    probs: list[list[float]] = Field(..., description="[len(tokens)][V] processed draft law of each token")
    outcome: Literal["pending", "promoted", "mismatch", "parent_rejected", "terminal", "dropped", "cancelled"]
    bonus: int | None = None
    consumed_as_bonus: int = 0
    reused: int = 0
    discarded: int = 0
    extended: int = 0


class ConstraintStep(_Strict):
    """The request's constraint state after a commit (prefill or a round).
    `signature` = blake2b-8 of repr((sorted allowed token ids, complete))."""

    committed: int = Field(..., description="output tokens committed so far")
    state: int
    signature: str


class ScheduledOutcome(_Strict):
    request_id: int
    cancelled: bool
    finish_reason: Literal["stop", "length"] | None
    tokens: list[int]
    logprobs: list[float] | None = None
    text: str
    events: list[Event] = Field(default_factory=list, description="everything published, in order")
    speculation: SpeculationReport
    trace: list[RoundTrace] | None = None
    seed: int | None = None
    lookahead: list[LookaheadRecord] = Field(default_factory=list)
    constraint_steps: list[ConstraintStep] = Field(default_factory=list)

    def as_result(self) -> GenerationResult:
        if self.finish_reason is None:
            raise ValueError(f"request {self.request_id} has not finished (cancelled={self.cancelled})")
        return GenerationResult(tokens=self.tokens, text=self.text, finish_reason=self.finish_reason,
                                logprobs=self.logprobs, events=self.events, speculation=self.speculation,
                                trace=self.trace, seed=self.seed)


# -- the protocol ----------------------------------------------------------------


@runtime_checkable
class SchedulerSession(Protocol):
    def submit(self, request: GenerationRequest, constraint: ConstraintSpec | None = None,
               callback: Callable[[object], None] | None = None) -> int:
        """Validate (raise now on a bad request) and queue; returns the request id.
        The callback receives each event when it is published."""
        ...

    def runnable(self) -> list[int]:
        """Requests with work left, in submission order."""
        ...

    def step(self) -> int | None:
        """One action chosen by the backend's fair policy; the id served, None when idle."""
        ...

    def advance(self, request_id: int, lookahead: bool = True) -> str:
        """One action of this request ("prefill", "propose", "lookahead",
        "verify", or "none" when finished); lookahead=False skips the optional branch."""
        ...

    def drop_branch(self, request_id: int) -> bool:
        """Discard the request's optional branch, if any (optional work)."""
        ...

    def cancel(self, request_id: int) -> None:
        """Nothing of this request is published after this returns."""
        ...

    def outcome(self, request_id: int) -> ScheduledOutcome: ...


@runtime_checkable
class SchedulingBackend(Protocol):
    def open_scheduler(self, lookahead: bool = True, adaptive_after: int | None = 8) -> SchedulerSession:
        """A fresh session on the loaded runtime. `lookahead=False` disables only
        the optional branch; `adaptive_after=None` keeps lookahead on whatever it earns."""
        ...


__all__ = [
    "ConstraintSpec",
    "ConstraintStep",
    "Grammar",
    "GrammarEdge",
    "LookaheadRecord",
    "ScheduledOutcome",
    "SchedulerSession",
    "SchedulingBackend",
]
