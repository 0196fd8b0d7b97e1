"""The field reference an adapter author reads: generated from the pydantic
models, so it cannot drift from them (tests/test_docs_reference.py).

`python -m mtpcheck.contracts.docgen` writes docs/reference/contracts.md;
`--check` exits 1 when the committed page differs. A field's meaning is its
`Field(description=...)` when it has one, else the entry in NOTES below; a
field with neither fails the drift test, so a new field arrives documented.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from . import models as m

MODELS: list[tuple[type[BaseModel], str]] = [
    (m.GenerationRequest, "What the suite asks for. Validated before it reaches you: a malformed request never does."),
    (m.SamplingParams, "Sampling controls, applied in this order to the target's logits (and the drafter's): "
                       "logit_bias, repetition penalty, presence and frequency penalties, temperature, top-k, top-p, "
                       "min-p; each step renormalises. Exact semantics: `mtpcheck.engine.sampling.process`."),
    (m.SpeculationRequest, "The request's speculation block. `True` / `False` are shorthands for "
                           "`{\"mode\": \"native_mtp\"}` / `{\"mode\": \"off\"}`; `None` (no block) means the "
                           "backend's loaded default."),
    (m.GenerationResult, "What you return. The harness validates it (see *Validation* in docs/adapters.md)."),
    (m.SpeculationReport, "What actually ran. STATS-CONSISTENT and REPORT-HONEST hold it to the tokens."),
    (m.TokenEvent, "One emitted token, published once it is committed (never a proposal that is then rejected)."),
    (m.TextEvent, "Newly published text: the decoded output grows by exactly this."),
    (m.StopEvent, "The output ended on an EOS id or a stop string."),
    (m.FinishEvent, "Always the last event."),
    (m.RoundTrace, "One speculative round, white-box (capability `traces`, request `trace=True`)."),
    (m.Capabilities, "What the backend declares. A capability turns its clauses on; one not declared turns them "
                     "into skips that name it; a tolerance is read by the clause that names it."),
]

NOTES: dict[str, str] = {
    # GenerationRequest
    "GenerationRequest.prompt_tokens": "prompt token ids, at least one, each in [0, vocab_size). The suite's prompts "
    "come from `mtpcheck.fixture.fixture_prompts`: with capability `text`, the shipped fixture texts through your `encode`; "
    "otherwise four fixed pseudo-random prompts of 12 ids. A prompt longer than `context_length` must raise "
    "PromptTooLongError (`check_prompt_length`) before any forward",
    "GenerationRequest.max_tokens": "token budget (>= 1); emitting more is BackendGarbage. Reaching it ends the output "
    "with finish_reason 'length', cutting a block mid-way if needed",
    "GenerationRequest.sampling": "the controls; the same for drafter and target (a one-sided application is bug B02)",
    "GenerationRequest.stop": "stop strings (non-empty). They need `text`; the output ends before the match, which "
    "is neither in `text` nor followed by any token event",
    "GenerationRequest.logprobs": "report per-token logprobs in GenerationResult.logprobs",
    "GenerationRequest.stop_token_ids": "Those are Capabilities.eos_token_ids. "
    "[]: no token stops the output (the suite uses it to compare full budgets). A list: exactly these ids stop it",
    # SamplingParams
    "SamplingParams.top_k": "keep the k most probable tokens (ties at the boundary: lower id first)",
    "SamplingParams.top_p": "keep the smallest most-probable prefix whose mass reaches top_p (the crossing token is "
    "kept; ties by lower id); 1.0 keeps all",
    "SamplingParams.min_p": "after top-p, drop tokens with p < min_p * max p",
    "SamplingParams.repetition_penalty": "CTRL-style on the logits of every token in prompt + output: positive logits "
    "divided by it, negative ones multiplied. 1.0 or None is neutral; anything else blocks speculation unless you "
    "declare it in speculative_sampling_controls",
    "SamplingParams.presence_penalty": "subtracted once from the logit of every token present in prompt + output",
    "SamplingParams.frequency_penalty": "subtracted count times from the logit of every token in prompt + output",
    "SamplingParams.logit_bias": "token id -> added to that token's logit, before the penalties",
    "SamplingParams.seed": "the request's seed in [0, 2^63); None: the backend picks one and reports it in "
    "GenerationResult.seed",
    # SpeculationRequest
    "SpeculationRequest.mode": "'native_mtp': speculate with the named (or default) drafter; 'off': target only",
    "SpeculationRequest.require_acceleration": "true: raise SpeculationUnavailableError(reason, message) before "
    "generating instead of falling back",
    # GenerationResult
    "GenerationResult.tokens": "emitted ids, 1..max_tokens of them, each in [0, vocab_size)",
    "GenerationResult.text": "decoded output up to (not including) a stop string; '' without `text`",
    "GenerationResult.finish_reason": "'stop' (EOS id or stop string), else 'length'",
    "GenerationResult.logprobs": "log p of each emitted token under the processed target law (speculation on or off), "
    "one per token, or None for none at all. There is no per-token gap: a runtime that lacks one for some token "
    "reports None for the whole result and declares logprobs=False. At temperature 0 the processed law is one-hot: "
    "0.0 for the emitted token",
    "GenerationResult.events": "in publication order: per committed token a TokenEvent, then any TextEvent its text "
    "completes (text that may still grow into a stop string is held back); at the end a StopEvent if it stopped, "
    "then exactly one FinishEvent. Nothing after a StopEvent but the FinishEvent",
    "GenerationResult.speculation": "the report; always present, speculation off included",
    "GenerationResult.trace": "one RoundTrace per round when the request asked for it and you declare `traces`; "
    "else None",
    # SpeculationReport
    "SpeculationReport.requested": "the request asked to speculate (a native_mtp block, or none with a speculating "
    "default)",
    "SpeculationReport.used": "proposals were drafted and verified in this request. False needs `reason` and "
    "`message`",
    "SpeculationReport.mode": "the mode that ran",
    "SpeculationReport.reason": "not_requested: off, or no block and an off default; sampling_control_unsupported: "
    "a penalty or logit bias it cannot honour while speculating (the message names it); drafter_unavailable: no "
    "drafter of the requested kind is loaded; depth_exceeds_capability: num_draft_tokens > max_depth; "
    "adaptive_disabled: an adaptive rule turned speculation off",
    "SpeculationReport.drafter": "the drafter that ran ('mtp', 'assistant' or a path), None when none did",
    "SpeculationReport.num_draft_tokens": "the depth that ran (proposals per round); 0 when not used; never above "
    "max_depth",
    "SpeculationReport.draft_kind": "'mtp' (embedded heads), 'assistant', or 'model_free' (n-gram, prompt lookup)",
    "SpeculationReport.runtime": "your runtime's name and version",
    "SpeculationReport.acceptance_rule": "the rule that decided acceptance, as in Capabilities",
    "SpeculationReport.rounds": "verification rounds; a round that drafted nothing (the budget left room for one token "
    "only) still counts, with draft_lens and accept_lens entries of 0. A request in which nothing was ever drafted "
    "reports used=False with a reason",
    "SpeculationReport.drafted": "sum(draft_lens)",
    "SpeculationReport.accepted": "sum(accept_lens)",
    "SpeculationReport.acceptance_rate": "accepted / drafted; None when nothing was drafted",
    "SpeculationReport.bonus_tokens": "rounds that accepted every proposal and emitted the target's bonus token",
    "SpeculationReport.corrections": "rounds that rejected a proposal and emitted the correction",
    "SpeculationReport.lookahead_drafted": "branch tokens drafted ahead (capability lookahead); = consumed + reused + "
    "discarded",
    "SpeculationReport.lookahead_consumed_as_bonus": "branch tokens that became the bonus (= bonus_matches)",
    "SpeculationReport.lookahead_reused": "branch tokens reused as the next round's proposals",
    "SpeculationReport.lookahead_discarded": "branch tokens thrown away",
    "SpeculationReport.bonus_matches": "branches promoted because the bonus matched",
    "SpeculationReport.bonus_mismatches": "branches discarded because the bonus differed",
    "SpeculationReport.adaptive_disabled": "the adaptive rule turned lookahead off in this request",
    "SpeculationReport.draft_time_s": "wall time drafting (informational)",
    "SpeculationReport.verify_time_s": "wall time verifying (informational)",
    # events
    "TokenEvent.kind": "'token'",
    "TokenEvent.index": "0-based index into GenerationResult.tokens",
    "TokenEvent.token": "the committed id",
    "TokenEvent.logprob": "as GenerationResult.logprobs[index], or None when not reported",
    "TextEvent.kind": "'text'",
    "TextEvent.text": "the new text; the events' texts concatenate to GenerationResult.text",
    "StopEvent.kind": "'stop'",
    "FinishEvent.kind": "'finish'",
    "FinishEvent.reason": "as GenerationResult.finish_reason",
    # RoundTrace
    "RoundTrace.round": "0-based round index",
    "RoundTrace.proposals": "the k proposals",
    "RoundTrace.draft_uniforms": "[k] uniforms the proposals were drawn at (inverse CDF, token-id order)",
    "RoundTrace.accept_uniforms": "[k] acceptance uniforms of the rejection rule ([] for exact match)",
    "RoundTrace.accepted": "proposals accepted",
    "RoundTrace.next_kind": "'correction' after a rejection, 'bonus' after full acceptance, 'none' when cut",
    "RoundTrace.target_len_before": "target cache logical length before the round (prompt + committed - 1: the last "
    "emitted token is pending, uncached)",
    "RoundTrace.target_len_after": "the same after the round's rollback",
    "RoundTrace.draft_len_before": "drafter cache logical length before the round",
    "RoundTrace.draft_len_after": "after; never longer than the target's",
    "RoundTrace.sampler_digest_before": "history_digest(prompt + committed) before the round",
    "RoundTrace.sampler_digest_after": "history_digest(prompt + committed) after it",
    # Capabilities
    "Capabilities.name": "backend name, shown in the report header",
    "Capabilities.version": "runtime version, shown in the report header",
    "Capabilities.vocab_size": "V: token ids are in [0, V); laws are [V]",
    "Capabilities.eos_token_ids": "the ids stop_token_ids=None stops on",
    "Capabilities.mtp_kinds": "drafters it can run: 'embedded' MTP heads, an external 'assistant', a 'model_free' drafter (n-gram, prompt lookup: clauses about an assistant or MTP heads skip by name). Empty: it cannot "
    "speculate, and every speculative clause skips saying so",
    "Capabilities.max_depth": "largest num_draft_tokens it runs; 0 (the default): it cannot speculate, the "
    "speculative clauses skip and the suite builds no speculative request. A speculating backend is asked once "
    "for depth max_depth + 1 (CAP-HONESTY), to see it refused",
    "Capabilities.acceptance_rule": "'rejection' (speculative sampling), 'exact_match' (keep a proposal iff it equals "
    "the target's own sample) or 'unknown'. A value, not a capability: clauses that need one rule skip naming the "
    "value declared",
    "Capabilities.seeded_determinism": "the same request and seed give the same tokens",
    "Capabilities.position_addressed_target_sampling": "a seeded target sample depends only on the seed and the "
    "logical position (not on how many draws came before): then exact match must equal plain decoding",
    "Capabilities.target_distributions": "target_distributions() works (ground truth of the statistical clauses)",
    "Capabilities.parallel_samples": "generate_n() serves n samples of one request (SEED-SAMPLES-INDEPENDENT)",
    "Capabilities.request_constraints": "the request's constraint field is honoured (CONSTRAINT-LANGUAGE)",
    "Capabilities.draft_distributions": "draft_distributions() works (ground truth of the proposal law)",
    "Capabilities.logprobs": "GenerationResult.logprobs are reported",
    "Capabilities.traces": "RoundTrace lists on request",
    "Capabilities.text": "encode()/decode() exist and stop strings work",
    "Capabilities.scheduler": "open_scheduler() exists (docs/scheduler.md)",
    "Capabilities.lookahead": "the scheduler drafts ahead on a branch",
    "Capabilities.constraints": "generate_constrained() exists",
    "Capabilities.notes": "free text for the report",
}


def _type(annotation) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or repr(annotation).replace("typing.", "")
    for long, short in (("mtpcheck.contracts.models.", ""), ("Annotated[int, FieldInfo(annotation=NoneType, "
                        "required=True, metadata=[Ge(ge=0)])]", "int >= 0"), ("Annotated[str, FieldInfo(annotation="
                        "NoneType, required=True, metadata=[MinLen(min_length=1)])]", "str")):
        text = text.replace(long, short)
    if "discriminator=" in text:  # the discriminated event union
        text = "list[TokenEvent | TextEvent | StopEvent | FinishEvent]"
    return text.replace("|", "\\|")


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return f"`{type(value).__name__}()`"
    return f"`{value!r}`".replace("|", "\\|")


def _constraints(field) -> str:
    ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=", "max_length": "length <="}
    parts = [f"{op} {getattr(c, attr)}" for c in field.metadata for attr, op in ops.items() if hasattr(c, attr)]
    return f" ({', '.join(parts)})" if parts else ""


def undocumented() -> list[str]:
    return [f"{M.__name__}.{k}" for M, _ in MODELS for k, f in M.model_fields.items()
            if not f.description and f"{M.__name__}.{k}" not in NOTES]


def render() -> str:
    lines = ["# Contract reference", "",
             "Generated from the pydantic models by `python -m mtpcheck.contracts.docgen`; do not edit.",
             "The how-to is docs/adapters.md; the JSON Schemas are in contracts/schemas/.", ""]
    for M, intro in MODELS:
        lines += [f"## {M.__name__}", "", intro, "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for name, f in M.model_fields.items():
            meaning = f.description or NOTES.get(f"{M.__name__}.{name}", "")
            extra = NOTES.get(f"{M.__name__}.{name}") if f.description else None
            if extra:
                meaning += f". {extra}"
            meaning = meaning.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{name}` | {_type(f.annotation)}{_constraints(f)} | {_default(f)} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "contracts.md"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if undocumented():
        print(f"fields without a meaning (add a description or a NOTES entry): {undocumented()}")
        return 1
    if "--check" in argv:
        if not PAGE.is_file() or PAGE.read_text() != render():
            print(f"{PAGE} drifted from the models; run `python -m mtpcheck.contracts.docgen`")
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
