"""The wire contracts every backend speaks: requests, results, reports, traces.

Models forbid unknown keys so that a malformed request fails at once with a
message naming the field (seed 001: "a malformed block raises immediately
rather than becoming a silent no-op").
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def history_digest(tokens: list[int]) -> str:
    """Digest of a committed token history: the sampler state of a history-
    derived sampler. Traces report it; the suite recomputes it."""
    return hashlib.blake2b(",".join(map(str, tokens)).encode(), digest_size=8).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


SEED_LIMIT = 2**63  # seeds travel as int64 in the engines and numpy generators


class SamplingParams(_Strict):
    """Sampling controls. Processing order (engine/sampling.py): logit bias,
    penalties, temperature, top-k, top-p, min-p; temperature 0 is greedy."""

    temperature: float = Field(1.0, ge=0.0, description="0 means greedy (argmax, lowest id on ties)")
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)

    def speculation_blockers(self) -> list[str]:
        """Controls that speculation cannot honour here (seed 001): non-neutral
        penalties and logit bias need target-only decoding."""
        out = []
        if self.repetition_penalty not in (None, 1.0):
            out.append("repetition_penalty")
        if self.presence_penalty not in (None, 0.0):
            out.append("presence_penalty")
        if self.frequency_penalty not in (None, 0.0):
            out.append("frequency_penalty")
        if self.logit_bias:
            out.append("logit_bias")
        return out


class SpeculationRequest(_Strict):
    """The request block of seed 001. `True`/`False` are shorthands for
    `{"mode": "native_mtp"}` / `{"mode": "off"}`."""

    mode: Literal["native_mtp", "off"] = "native_mtp"
    drafter: str | None = Field(None, description="'mtp' (embedded heads), 'assistant', or a path")
    num_draft_tokens: int | None = Field(None, ge=1, description="proposals per round, seed token excluded")
    require_acceleration: bool = False

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if value is True:
            return {"mode": "native_mtp"}
        if value is False:
            return {"mode": "off"}
        return value

    @classmethod
    def coerce(cls, value: SpeculationRequest | bool | dict | None) -> SpeculationRequest | None:
        if value is None or isinstance(value, SpeculationRequest):
            return value
        return cls.model_validate(value)


class OutputConstraint(_Strict):
    """A language the whole output belongs to, given through the request as
    servers take it (structured output): `choice`, one of these strings and
    then an end token (the request's stop tokens, default the EOS ids). vLLM
    `structured_outputs: {"choice": [...]}`; llama.cpp `grammar: root ::= "a" |
    "b"`. Judged by CONSTRAINT-LANGUAGE (capability request_constraints)."""

    choice: list[Annotated[str, Field(min_length=1)]] = Field(..., min_length=1)

    @field_validator("choice")
    @classmethod
    def _prefix_free(cls, value: list[str]) -> list[str]:
        # a string that extends another would let the output go on past an end: one reading of "complete"
        for a in value:
            for b in value:
                if a != b and b.startswith(a):
                    raise ValueError(f"choice strings must be prefix-free: {a!r} is a prefix of {b!r}")
        return value


class GenerationRequest(_Strict):
    prompt_tokens: list[Annotated[int, Field(ge=0)]] = Field(..., min_length=1)
    max_tokens: int = Field(64, ge=1)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    stop_token_ids: list[int] | None = Field(None, description="None: the backend's EOS ids")
    speculation: SpeculationRequest | None = Field(None, description="None: the backend's loaded default")
    trace: bool = Field(False, description="ask for a per-round RoundTrace (white-box checks)")
    logprobs: bool = True
    constraint: OutputConstraint | None = Field(
        None, description="the output's language (structured output); only for backends declaring request_constraints")

    @field_validator("speculation", mode="before")
    @classmethod
    def _spec_shorthand(cls, value: Any) -> Any:
        return SpeculationRequest.coerce(value)


SpeculationReason = Literal[
    "not_requested",
    "sampling_control_unsupported",
    "drafter_unavailable",
    "depth_exceeds_capability",
    "adaptive_disabled",
]


class SpeculationReport(_Strict):
    """What actually ran (seed 001's `metadata["speculation"]`)."""

    requested: bool
    used: bool
    mode: Literal["native_mtp", "off"]
    drafter: str | None = None
    num_draft_tokens: int = 0
    draft_kind: Literal["mtp", "assistant", "model_free"] | None = None
    runtime: str
    acceptance_rule: str | None = None
    reason: SpeculationReason | None = Field(None, description="named reason whenever used is False")
    message: str | None = Field(None, description="human words whenever used is False")
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accept_lens: list[int] = Field(default_factory=list, description="accepted proposals per round")
    draft_lens: list[int] = Field(default_factory=list, description="proposals per round")
    acceptance_rate: float | None = None
    bonus_tokens: int = 0
    corrections: int = 0
    lookahead_drafted: int = 0
    lookahead_consumed_as_bonus: int = 0
    lookahead_reused: int = 0
    lookahead_discarded: int = 0
    bonus_matches: int = 0
    bonus_mismatches: int = 0
    adaptive_disabled: bool = False
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0


class RoundTrace(_Strict):
    """One round, white-box: enough to re-derive every decision.

    Probability vectors are the *processed* distributions, float64, length V.
    Positions are logical positions in prompt + output."""

    round: int
    position: int = Field(..., description="logical position of the first proposal")
    pending_token: int = Field(..., description="uncached input that leads verification")
    proposals: list[int]
    draft_probs: list[list[float]] = Field(..., description="[k][V] law each proposal was drawn from")
    target_probs: list[list[float]] = Field(..., description="[k+1][V] target law at each position")
    draft_uniforms: list[float]
    accept_uniforms: list[float]
    target_uniforms: list[float] = Field(..., description="[k+1] target-stream uniforms at each position")
    accepted: int
    next_token: int | None = Field(None, description="correction or bonus; None if the block was cut")
    next_kind: Literal["correction", "bonus", "none"]
    next_law: list[float] | None = Field(None, description="[V] law the next token was drawn from")
    committed: list[int] = Field(..., description="tokens committed this round, after stop/budget cuts")
    target_len_before: int
    target_len_after: int
    draft_len_before: int
    draft_len_after: int
    sampler_digest_before: str
    sampler_digest_after: str
    events: list[int] = Field(default_factory=list, description="indices of events published this round")


class TokenEvent(_Strict):
    kind: Literal["token"] = "token"
    index: int
    token: int
    logprob: float | None = None


class TextEvent(_Strict):
    kind: Literal["text"] = "text"
    text: str


class StopEvent(_Strict):
    kind: Literal["stop"] = "stop"
    matched: str = Field(..., description="'eos:<id>' or the stop string")


class FinishEvent(_Strict):
    kind: Literal["finish"] = "finish"
    reason: Literal["stop", "length"]


Event = Annotated[TokenEvent | TextEvent | StopEvent | FinishEvent, Field(discriminator="kind")]


class GenerationResult(_Strict):
    tokens: list[int]
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: list[float] | None = None
    events: list[Event] = Field(default_factory=list)
    speculation: SpeculationReport
    trace: list[RoundTrace] | None = None
    seed: int | None = Field(None, description="the seed actually used")


class Capabilities(_Strict):
    """What a backend declares. A missing capability turns the clauses that
    need it into skips naming it, never into passes."""

    name: str
    version: str
    vocab_size: int = Field(..., ge=2)
    eos_token_ids: list[int] = Field(default_factory=list)
    mtp_kinds: list[Literal["embedded", "assistant", "model_free"]] = Field(default_factory=list)
    max_depth: int = Field(0, ge=0)
    drafting: Literal["fixed", "up_to_k"] = Field(
        "fixed",
        description="fixed: every round drafts min(depth, room) proposals; up_to_k: a round drafts 0..depth"
        " (n-gram / prompt-lookup drafters that find no match, confidence thresholds). REPORT-DEPTH checks what the"
        " policy promises: never more than the depth, exactly min(depth, room) where fixed",
    )
    depths: list[int] | None = Field(
        None,
        description="the only depths a request may ask for, when the runtime fixes its depth at launch (vLLM, SGLang, "
        "one speculative server); None: every depth 1..max_depth. Clauses that need another depth skip, naming it",
    )
    acceptance_rule: Literal["rejection", "exact_match", "unknown"] = "unknown"
    first_token_from_prefill: bool = Field(
        True,
        description="the first output token is the target's own, sampled after the prompt prefill and before round 0,"
        " so emitted tokens = 1 + accepted + rounds; False: round 0 verifies the first proposals and emits the first"
        " token, so emitted tokens = accepted + rounds (each less a cut of the last block)",
    )
    round_statistics: Literal["observed", "replayed", "inferred"] = Field(
        "observed",
        description="how the report's per-round statistics (accept_lens, draft_lens) are obtained: observed (the"
        " runtime's own per-round counters), replayed (reconstructed from what the runtime shows per token, e.g. a"
        " stream's running counters), inferred (a part, typically draft_lens, filled in from the declared drafting"
        " policy, min(depth, room)). REPORT-DEPTH and REPORT-HONEST's round rule judge only observed or replayed"
        " rounds: inferred ones restate the declaration and say 'not judged'",
    )
    seeded_determinism: bool = False
    position_addressed_target_sampling: bool = False
    speculative_sampling_controls: list[str] = Field(
        default_factory=lambda: ["temperature"], description="controls honoured with speculation on"
    )
    unsupported_controls: list[str] = Field(
        default_factory=list,
        description="sampling controls the runtime cannot do at all, on either path (transformers has no presence /"
        " frequency penalty; an API without logit_bias): the items that need one skip, naming it",
    )
    target_distributions: bool = False
    draft_distributions: bool = Field(
        False,
        description="draft_distributions(request, tokens, accept_lens, draft_lens) gives the law each proposal of a"
        " finished request was drawn from, float [len(tokens), V] (row i: the proposal at output index i, zeros where"
        " none stood), computed from the drafter the runtime declares, as target_distributions is from the target:"
        " SEED-STREAMS-INDEPENDENT's ground truth under either acceptance rule",
    )
    raw_logits: bool = Field(
        False,
        description="target_logits(prompt, continuation) gives the target's unprocessed logits, float [len(continuation),"
        " V]: row i the next-token logits after prompt + continuation[:i] (teacher-forced, speculation off), before"
        " any logit bias, penalty, temperature or filter. CTRL-CONTRACT computes the contract's processed law from"
        " them; without it the additive controls are derived from target_distributions and repetition_penalty skips",
    )
    truncated_laws: int | None = Field(
        None, ge=1,
        description="target_distributions gives only the top N probabilities of each row (zeros elsewhere; the row"
        " sums to 1 - the tail mass), as HTTP servers return top-N log-probabilities: the statistical clauses pool"
        " ranks beyond N into one bin. None: whole laws",
    )
    logprobs: bool = False
    traces: bool = False
    text: bool = False
    scheduler: bool = False
    lookahead: bool = False
    constraints: bool = False
    parallel_samples: bool = Field(
        False,
        description="generate_n(request, n) serves n samples of one request in one call, as OpenAI's `n`: a list of n"
        " GenerationResults; with a seed the n samples reproduce as a whole. SEED-SAMPLES-INDEPENDENT judges them",
    )
    max_parallel_samples: int | None = Field(
        None, ge=2,
        description="the most samples one generate_n call serves (llama.cpp: one per parallel slot); null: no limit."
        " The suite asks at most this many, and says so in the test's record",
    )
    request_constraints: bool = Field(
        False,
        description="GenerationRequest.constraint is honoured through the runtime's own API (vLLM structured outputs,"
        " llama.cpp grammars), with speculation: CONSTRAINT-LANGUAGE judges it black-box. `constraints` is the"
        " white-box hook (a constraint automaton handed to the scheduler)",
    )
    streaming: bool = Field(
        False, description="generate_stream(request) yields StreamChunk objects in arrival order (a library's"
        " streaming interface, e.g. mlx-lm's stream_generate)",
    )
    checkpoint_evidence: bool = Field(False, description="checkpoints() gives the target/assistant folders it runs")
    generate_batch: bool = Field(
        False, description="generate_batch(requests) serves several requests at once and returns their results in"
        " order, each as generate() would; the statistical clauses then draw their samples through it",
    )
    concurrent: bool = Field(
        False, description="generate_batch serves its requests together, in flight at once, as the runtime serves"
        " concurrent users (HTTP: concurrent connections; a library: its batch API; the reference: its scheduler),"
        " requests joining while others run and leaving when done. CONCURRENT-EQUALS-SOLO then checks that each"
        " request gives what it gives alone, and the report says the statistical samples were drawn concurrently."
        " False with generate_batch: a speed path that serves the requests one after another",
    )
    penalty_history: Literal["prompt_and_output", "output_only"] = Field(
        "prompt_and_output",
        description="The history presence_penalty and frequency_penalty count, a convention runtimes legitimately"
        " differ on: prompt_and_output (Hugging Face's processors, the reference) or output_only (OpenAI's"
        " definition: sampled tokens only; vLLM, OpenVINO GenAI). CTRL-CONTRACT and REPORT-NO-SILENT-FALLBACK judge"
        " the runtime against the convention it declares; a runtime that matches neither fails them."
        " repetition_penalty counts prompt and output under both",
    )
    top_k_ties: Literal["exactly_k", "keep_ties"] = Field(
        "exactly_k",
        description="Which tokens top-k keeps when several tie with the k-th most probable, a convention runtimes"
        " legitimately differ on: exactly_k (k tokens: a sort or partial sort; the reference, mlx-lm, llama.cpp,"
        " OpenVINO GenAI) or keep_ties (every token at least as probable as the k-th: a threshold, as Hugging"
        " Face's TopKLogitsWarper and vLLM). Ground truth (target_distributions) follows the declaration. Which"
        " tied token survives exactly_k, and ties with the top-p crossing token, stay with the precision rule: a"
        " float runtime's passes break exact ties at random, so such a token is a boundary token (margin 0),"
        " counted against the boundary mass",
    )
    stop_text: Literal["special_tokens_kept", "special_tokens_skipped"] | None = Field(
        None,
        description="The text stop strings are matched against and a result's text is, a convention runtimes"
        " legitimately differ on: special_tokens_kept (decode(tokens) with special tokens' text: the reference, the"
        " mlx adapters' stop matcher) or special_tokens_skipped (the model's EOS text left out, as a detokenizer"
        " with skip_special_tokens does). Declared, the text rule holds the text to it and STOP-IN-BLOCK aims a"
        " stop string at the EOS text (no stop_token_ids): kept stops there, skipped runs on. None: undeclared;"
        " either text is accepted and that test skips, naming this field",
    )
    near_tie_logit_gap: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Leave unset: GREEDY-EQUIV and every greedy exact check excuse a divergence only where the"
        " target's top-2 logit gap, log(p1/p2) of the temperature-1 law, is inside the precision rule's logit gap"
        " (mtpcheck.laws.precision: ulps of logit_dtype at logit_scale). A number here replaces the rule's value"
        " by hand, and the report says it was declared",
    )
    seed_cdf_tolerance: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Leave unset: SEED-SPEC-EQUALS-PLAIN excuses a seeded speculative sample that differs from the"
        " plain one only where it can be a float flip: the two tokens' inverse-CDF intervals (token-id order, plain"
        " path's law) lie within the precision rule's CDF tolerance of each other, and, when traces give the seeded"
        " uniform, the uniform lies within it of their boundary. A number replaces the rule's value (0: exact)",
    )
    filter_boundary_tolerance: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Leave unset: DIST-ZERO / DIST-EQUIV count an emitted token of target probability 0 as a"
        " boundary token, not a violation, where the backend's own law at temperature only (filters off) puts it"
        " within the precision rule's filter margin of surviving top-k, top-p and min-p"
        " (mtpcheck.laws.stats.filter_margin; 0 for a token tied with the boundary). Boundary tokens are listed with"
        " their margins; DIST-ZERO fails when there are more than the boundary mass allows. A number replaces the"
        " rule's value (0: exact)",
    )
    logprob_tolerance: float = Field(
        1e-4, gt=0.0, le=1.0,
        description="LOGPROBS: largest |reported logprob - log p| (nats) against target_distributions' law",
    )
    logit_dtype: Literal["float64", "float32", "float16", "bfloat16"] = Field(
        "float32", description="The precision the target's logits are computed in (the lowest on their way: a"
        " float16 KV cache makes float32 logits float16). Every exact check's tolerance follows from it"
        " (mtpcheck.laws.precision), and explain-divergence states gaps in its ulps",
    )
    logit_scale: float = Field(
        32.0, gt=0.0,
        description="A bound of |logit| for the target (raw logits, temperature 1): the precision rule counts ulps"
        " at this size. With raw_logits, the ground-truth check holds the runtime's own logits to it",
    )
    context_length: int | None = Field(
        None, ge=1,
        description="most prompt tokens the backend accepts; a longer prompt raises PromptTooLongError before any"
        " forward (mtpcheck.contracts.check_prompt_length). None: undeclared",
    )
    notes: str = ""

    @model_validator(mode="after")
    def _concurrent_needs_batch(self):
        if self.concurrent and not self.generate_batch:
            raise ValueError("concurrent=True needs generate_batch=True: requests are served together through it")
        return self


class StreamChunk(_Strict):
    """One piece of a streamed generation, as it reaches the caller. The
    chunks of a stream concatenate to the output; a chunk never carries a
    token the output does not hold at that position (EVENTS-COMMIT-ONLY)."""

    tokens: list[int] = Field(default_factory=list, description="token ids published by this chunk, in order")
    text: str = Field("", description="text published by this chunk")
    finish_reason: Literal["stop", "length"] | None = Field(None, description="set on the last chunk")


SCHEMA_MODELS: dict[str, type[BaseModel]] = {
    "SamplingParams": SamplingParams,
    "SpeculationRequest": SpeculationRequest,
    "GenerationRequest": GenerationRequest,
    "GenerationResult": GenerationResult,
    "SpeculationReport": SpeculationReport,
    "RoundTrace": RoundTrace,
    "Capabilities": Capabilities,
    "StreamChunk": StreamChunk,
}
