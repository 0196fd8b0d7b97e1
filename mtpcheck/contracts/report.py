"""The JSON report of a suite run (--mtp-json, `mtpcheck run --json`): its
models are an interface like the request and result, so their schema is
published in contracts/schemas/ (RunReport.schema.json). Written by
mtpcheck.machinery.report."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .models import Capabilities

SCHEMA_VERSION = 6
Outcome = Literal["failed", "error", "xpassed", "xfailed", "passed", "skipped"]
Reason = Literal["interrupted", "maxfail", "subset", "collection error", "backend failed to load", "internal error",
                 "crashed", "unfinished"]


# -- the report's models (the published schema) ---------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Exercise(_Model):
    """What the speculative results a test received say was drafted and
    accepted (their reports, summed): the evidence that speculation ran."""

    requests: int = Field(description="results of requests that asked for speculation")
    unaccelerated: int = Field(description="of those, declared unaccelerated (a control outside "
                                           "speculative_sampling_controls): not counted below")
    used: int = Field(description="reports that say used")
    unobserved: int = Field(0, description="of those, reports with no round statistics at all (a runtime that counts"
                                           " per response, not per sample): speculation claimed, nothing observed")
    rounds: int
    drafted: int
    accepted: int
    rejected: int = Field(description="drafted - accepted")
    bonus_tokens: int
    corrections: int
    declared_off: list[str] = Field(default_factory=list, description="the controls declared unaccelerated")


class ExerciseMargin(_Model):
    """How thin a passing test's exercise was: the fewest of what its clauses
    need. A rerun at the same rate holds none with probability about exp(-count)."""

    count: int = Field(description="accepted (or rejected) proposals, whichever is fewer of those the clauses need")
    what: Literal["accepted", "rejected"]
    drafted: int


class ExerciseRedraw(_Model):
    """A seeded test that passed on a sample holding nothing of what its
    clauses need, drawn once more at a moved base seed: the first sample.
    The test's outcome, `exercise` and `evidence` are the redrawn sample's."""

    seed: int = Field(description="the first sample's base seed (the run's)")
    redraw_seed: int = Field(description="the base seed of the redrawn sample")
    exercise: Exercise = Field(description="what the first sample's speculative results drafted and accepted")
    message: str = Field(description="why the first sample did not count: 'speculation not exercised: ...'")
    evidence: list[dict[str, Any]] = Field(default_factory=list, description="the first sample's mtp_record(...) calls")


class BrokenRule(_Model):
    """A result that broke a rule every result obeys (mtpcheck.machinery.invariants),
    with the call that produced it."""

    clause: str = Field(description="the clause that owns the rule")
    call: str = Field(description="the backend call, e.g. 'generate_batch()' or 'generate_stream() abandoned after 2"
                                  " chunks'")
    request: int | None = Field(description="the result's place in the call's list (generate_batch, generate_n); null:"
                                            " a one-result call")
    problems: list[str]
    max_tokens: int
    temperature: float
    seed: int | None
    depth: int | None = Field(description="the requested num_draft_tokens; null: the backend's default or none")


class TestRecord(_Model):
    __test__ = False  # not a pytest test class
    clauses: list[str]
    outcome: Outcome
    message: str = ""
    duration_s: float
    evidence: list[dict[str, Any]] = Field(default_factory=list, description="mtp_record(...) calls, in order")
    exercise: Exercise | None = Field(None, description="null: the test received no speculative result")
    exercise_margin: ExerciseMargin | None = Field(
        None, description="a test that passed its exercise check: its thinnest need; below 14 the run names it thin")
    exercise_redraw: ExerciseRedraw | None = Field(
        None, description="set where the first sample exercised nothing and the seeded test was drawn again")
    deviating_side: Literal["speculative", "plain", "both"] | None = Field(
        None, description="the side a failing test named: the speculative path, the plain path, or both (a finding"
        " of the runtime, not of speculation); null where it named none")
    found_in: str | None = Field(
        None, description="set on a record of broken result rules (its id is '<found_in> => <clause>'): the test"
        " whose backend calls returned the results; that test's own outcome is its own clauses' verdict")
    broken_rules: list[BrokenRule] = Field(
        default_factory=list, description="the results that broke the clause's rules in that test (the first 10)")
    broken_count: int = Field(0, description="how many results broke them in all")


class ClauseRecord(_Model):
    title: str
    kind: str
    outcome: Outcome = Field(description="the worst outcome of its tests; passed with skipped tests is passed")
    tests: dict[str, Outcome]
    notes: list[str] = Field(description="messages of the tests that decided the outcome")
    evidence: list[dict[str, Any]]
    exercise: Exercise | None = Field(None, description="its tests' exercise, summed; null: no speculative result")
    deviating_sides: list[Literal["speculative", "plain", "both"]] = Field(
        default_factory=list, description="the sides its tests named, each once")


class BackendRecord(_Model):
    name: str
    options: dict[str, str]
    capabilities: Capabilities | None = Field(description="null when the backend failed to load")


class NotRun(_Model):
    clauses: dict[str, str] = Field(default_factory=dict, description="clause id -> why none of its tests ran")
    tests: list[str] = Field(default_factory=list, description="collected (or deselected) node ids that did not run")


class RunReport(_Model):
    """The JSON report of one suite run (--mtp-json, `mtpcheck run --json`)."""

    schema_version: Literal[6] = SCHEMA_VERSION
    complete: bool = Field(description="every collected suite test ran, none deselected, and the run was not cut short")
    incomplete_reasons: list[Reason] = Field(default_factory=list, description="empty when complete")
    exit_status: int = Field(description="pytest's exit status: 0 passed, 1 failed, 2 interrupted, 3 internal, 4 usage")
    backend: BackendRecord
    versions: dict[str, str | None]
    profile: str
    seed: int
    duration_s: float
    clauses: dict[str, ClauseRecord]
    not_run: NotRun
    tests: dict[str, TestRecord]
    summary: dict[str, int] = Field(description="clauses per outcome")
    running: list[str] = Field(default_factory=list, description=(
        "tests running when this file was written: set only in the provisional report written before each "
        "test (reason 'unfinished'); a file left like that means the process died in them"))
    crashed: list[str] = Field(default_factory=list, description=(
        "tests whose process died under them (an xdist worker crash; reason 'crashed'): no verdict, "
        "the rest of the run went on in a fresh worker"))


REPORT_MODELS = {"RunReport": RunReport}
