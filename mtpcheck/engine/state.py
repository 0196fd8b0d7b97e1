"""What one request owns between actions: its plan, output, caches, counters
and lookahead branches. Plain records: the round functions (round.py,
lookahead.py) read and update them; the scheduler interleaves them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mtpcheck.contracts import GenerationRequest

from .constraints import Cursor
from .draft import DraftBlock
from .events import OutputState, StopMatcher


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

    def count(self, rec: BranchRecord, adaptive_after: int | None) -> None:
        """A branch is resolved: tally where its tokens went. The adaptive rule
        turns lookahead off, after `adaptive_after` branches, once it
        discards more than it reuses."""
        self.reused += rec.reused
        self.discarded += rec.discarded
        self.resolved += 1
        N = adaptive_after
        if N is not None and self.resolved >= N and (self.reused == 0 or self.discarded > self.reused):
            self.disabled = True


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

    def set_cursor(self, cursor: Cursor) -> None:
        """The committed constraint state, logged at each commit for the suite."""
        self.cursor = cursor
        if cursor.dfa is not None:
            self.constraint_log.append((len(self.out.tokens), cursor.state))
