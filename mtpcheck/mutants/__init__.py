"""Deliberately broken backends: the reference engine with one bug each, put
where a runtime would have it (docs/bug-classes.md). The suite must fail each on
the clauses it declares; `mtpcheck.mutants:load_mutant` is a backend factory.

The zoo (one or more mutants per bug class B01-B17) lives in
`mtpcheck.mutants.zoo`; `python -m mtpcheck.mutants.run` (`mtpcheck mutants`)
runs the suite against every mutant and writes the kill matrix
(docs/mutants.md). Importing this module does not import mlx.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Mutant:
    name: str
    bug_class: str  # B01-B17, or "-" for a bug outside the classes
    description: str
    clauses: tuple[str, ...]  # clauses expected to catch it
    apply: Callable  # engine -> None, mutating it in place (backend -> None when scope == "backend")
    options: dict[str, str] = field(default_factory=dict)  # base backend options the bug needs (drafter, twin, ...)
    scope: str = "engine"
    # why output alone cannot show it (the black-box column lists these instead of requiring a kill)
    invisible: str = ""
    # what a server shows beyond its final tokens (requests in flight together, logprobs) shows it:
    # the server column (mask server) must kill it though the output-only column cannot
    server_visible: bool = False
    # a bug whose effect needs another base backend or a larger sample than the zoo's
    # default (toy, ci) runs there; `needs` says why (the kill matrix prints it)
    base: str | None = None
    profile: str | None = None
    needs: str = ""


def _zoo(function: str, **kwargs) -> Callable:
    """A bug from mtpcheck.mutants.zoo, imported (with mlx) only when applied."""

    def apply(target) -> None:
        getattr(importlib.import_module("mtpcheck.mutants.zoo"), function)(target, **kwargs)

    apply.__name__ = function
    return apply


# -- the bugs ----------------------------------------------------------------


def _one_sided_temperature(engine) -> None:
    """B02: verification reads the target's logits at temperature 1 while the
    draft (and the prefill token) use the requested temperature."""
    from mtpcheck.contracts import SamplingParams

    verify = engine.target_pass

    def at_temperature_one(x):
        return x.model_copy(update={"temperature": 1.0}) if isinstance(x, SamplingParams) and x.temperature else x

    def unprocessed_target(*args, **kwargs):
        return verify(*map(at_temperature_one, args), **{k: at_temperature_one(v) for k, v in kwargs.items()})

    engine.target_pass = unprocessed_target


def _unnormalised_residual(engine) -> None:
    """B04: on rejection the residual (p - q)+ is sampled without normalising
    it; the mass it lacks falls through to the target's mode."""
    from mtpcheck.engine.acceptance import (
        Rule,
        Verdict,
        rejection_accept_probability,
        verify_rejection,
    )

    def raw_residual(p, q, d):
        return np.maximum(p - q, 0.0)

    def verify(ps, qs, proposals, au, tu):
        v = verify_rejection(ps, qs, proposals, au, tu)
        if v.next_kind != "correction":
            return v
        j = v.accepted
        r = raw_residual(ps[j], qs[j], proposals[j])
        i = int(np.searchsorted(np.cumsum(r), tu[j], side="right"))
        tok = i if i < len(r) and r[i] > 0 else int(np.argmax(ps[j]))
        return Verdict(j, tok, "correction", r)

    engine.rule = Rule("rejection", rejection_accept_probability, raw_residual, verify)


def _recurrent_state_not_restored(engine) -> None:
    """B08: after a rejection the KV caches are trimmed but the gated linear-
    attention state is not restored from its checkpoint: the rejected
    proposals stay folded into the recurrent state."""
    from mtpcheck.engine.cache import KVCache, RecurrentCache

    class StaleState(RecurrentCache):
        def trim_to(self, length):
            state = self.state
            super().trim_to(length)
            self.state = state

    kinds = engine.target.args.kinds()
    engine.target.make_cache = lambda: [KVCache() if k == "attn" else StaleState() for k in kinds]


TWIN = {"twin": "1", "drafter": "assistant"}  # the target drafts for itself: long accepted blocks, a bonus every round
ASSISTANT = {"drafter": "assistant"}

ZOO: list[Mutant] = [
    Mutant("argmax-draft", "B01", "the drafter proposes the mode of q but reports q (softmax) to verification",
           ("TRACE-ACCEPT", "DIST-EQUIV"), _zoo("argmax_draft")),
    Mutant("one-sided-temperature", "B02", "target law left at temperature 1 in verification",
           ("DIST-EQUIV", "TRACE-ACCEPT"), _one_sided_temperature),
    Mutant("nucleus-before-temperature", "B02", "the target sampler cuts top-p on the temperature-1 law, then tempers",
           ("DIST-ZERO", "DIST-EQUIV"), _zoo("nucleus_before_temperature")),
    Mutant("target-filters-dropped", "B02", "top-k/top-p/min-p applied to the draft law only, not the target's",
           ("DIST-ZERO", "DIST-EQUIV", "TRACE-ACCEPT"), _zoo("target_filters_dropped")),
    Mutant("draft-sampler-unprocessed", "B02", "the drafter samples the raw softmax but reports the processed q",
           ("TRACE-ACCEPT", "GREEDY-EQUIV", "DIST-ZERO", "DIST-EQUIV"), _zoo("draft_sampler_unprocessed")),
    Mutant("draft-law-unfiltered", "B02", "proposals drawn with top-k/top-p/min-p, reported to verification without them",
           ("TRACE-ACCEPT", "DIST-CONTEXT"), _zoo("draft_law_unfiltered"), base="mlx", profile="dev",
           needs="a per-context tilt of TV ~0.03 towards the draft's favourites: on the toy models the draft agrees "
                 "with the target too closely to show it, and DIST-CONTEXT needs dev's targeted sample "
                 "(docs/power.md, section D)"),
    Mutant("argmax-verification", "B03", "T > 0 verified by argmax: accept iff the proposal is the target's mode",
           ("TRACE-ACCEPT", "DIST-EQUIV"), _zoo("argmax_verification")),
    Mutant("unnormalised-residual", "B04", "residual (p-q)+ sampled unnormalised, leftover to the mode",
           ("TRACE-RESIDUAL-BONUS",), _unnormalised_residual),
    Mutant("residual-from-p", "B04", "on rejection the correction is drawn from p instead of (p-q)+",
           ("TRACE-RESIDUAL-BONUS",), _zoo("residual_from_p")),
    Mutant("residual-softmax", "B04", "on rejection the correction is drawn from softmax(p - q)",
           ("TRACE-RESIDUAL-BONUS", "DIST-ZERO", "DIST-EQUIV"), _zoo("residual_softmax")),
    Mutant("onehot-q", "B05", "acceptance and residual use q = one-hot(proposal) for a sampled draft",
           ("TRACE-ACCEPT",), _zoo("onehot_q"),
           invisible="the output law stays exact (acceptance and residual both use q = one-hot: the exact-match rule in disguise); only the traced decisions disagree with the traced q"),
    Mutant("onehot-q-acceptance", "B05", "acceptance uses q = one-hot(proposal), the residual the real q",
           ("TRACE-ACCEPT", "DIST-EQUIV"), _zoo("onehot_q_acceptance")),
    Mutant("first-proposal-unverified", "B06", "the verification loop starts at the second proposal",
           ("GREEDY-EQUIV", "TRACE-ACCEPT"), _zoo("first_proposal_unverified")),
    Mutant("target-rows-shifted", "B06", "proposal j verified against the target law of position j+1",
           ("GREEDY-EQUIV", "TRACE-ACCEPT"), _zoo("target_rows_shifted")),
    Mutant("bonus-from-previous-position", "B07", "the bonus is drawn from p_k instead of p_{k+1}",
           ("TRACE-RESIDUAL-BONUS", "GREEDY-EQUIV"), _zoo("bonus_from_previous_position"), TWIN),
    Mutant("bonus-fed-twice", "B07", "the bonus is written into the target cache and fed again",
           ("GREEDY-EQUIV", "TRACE-ACCEPT"), _zoo("bonus_fed_twice"), TWIN),
    Mutant("leads-with-last-proposal", "B07", "after a full block the next verification is led by d_k, not the bonus",
           ("BONUS-UNCACHED", "GREEDY-EQUIV"), _zoo("leads_with_last_proposal"), TWIN),
    Mutant("recurrent-state-not-restored", "B08", "recurrent state keeps the rejected suffix",
           ("GREEDY-EQUIV", "TRACE-ACCEPT"), _recurrent_state_not_restored),
    Mutant("assistant-not-rolled-back", "B08", "the assistant's KV cache keeps rejected proposals",
           ("TRACE-ROLLBACK", "DRAFT-FRESH"), _zoo("assistant_not_rolled_back"), ASSISTANT,
           invisible="the assistant's stale context only lowers acceptance: every token is still verified by the target, so tokens, their law and the statistics' consistency are exact"),
    Mutant("constraint-advanced-by-rejected", "B09", "the grammar state takes the rejected proposal, not the correction",
           ("CONSTRAINT-ROLLBACK", "CONSTRAINT-EMIT", "CONSTRAINT-MASK", "CONSTRAINT-LANGUAGE"),
           _zoo("constraint_advanced_by_rejected"), base="mlx",
           needs="a tokenizer: the request's constraint is a choice of strings (CONSTRAINT-LANGUAGE), which the toy "
                 "models cannot spell",
           invisible="constraints are a hook (capability constraints) and the request's constraint field an API "
                     "feature, both withheld output-only; a server shows the request's constraint",
           server_visible=True),
    Mutant("unmasked-drafter", "B09", "draft laws not masked by the constraint (the target's are)",
           ("CONSTRAINT-MASK",), _zoo("unmasked_drafter"),
           invisible="constraints are a hook (capability constraints), withheld black-box; the target's mask keeps the output exact anyway"),
    Mutant("events-at-draft-time", "B09", "token events published for proposals when drafted, again at commit",
           ("EVENTS-COMMIT-ONLY", "TRACE-ROLLBACK"), _zoo("events_at_draft_time")),
    Mutant("stream-publishes-proposals", "B09", "the stream shows proposals when drafted; generate() is right",
           ("STREAM-COMMIT-ONLY",), _zoo("stream_publishes_proposals"), scope="backend"),
    Mutant("stream-text-newest-token-only", "B09", "the stream's detokenizer is fed each chunk's newest token only: "
           "a block's earlier tokens are missing from the streamed text", ("STREAM-COMMIT-ONLY",),
           _zoo("stream_text_newest_token_only"), scope="backend", base="mlx"),
    Mutant("abandoned-sampler-reused", "B12", "after a client goes away mid-stream, the next sampled request draws "
           "from the abandoned request's seed", ("STREAM-DISCONNECT",), _zoo("abandoned_sampler_reused"),
           scope="backend"),
    Mutant("abandoned-rounds-counted", "B11", "after a client goes away mid-stream, the next request's report "
           "includes the abandoned request's rounds", ("STREAM-DISCONNECT",), _zoo("abandoned_rounds_counted"),
           scope="backend"),
    Mutant("stop-checked-per-block", "B10", "EOS and stop strings checked on the last token of a block only",
           ("STOP-IN-BLOCK",), _zoo("stop_checked_per_block"), TWIN),
    Mutant("budget-before-stop", "B10", "a stop token that is also the last allowed token ends a round as 'length'",
           ("STOP-IN-BLOCK",), _zoo("budget_before_stop")),
    Mutant("counts-rejected-tail", "B11", "accepted counts include the rejected tail",
           ("STATS-CONSISTENT", "SCHED-CANCEL"), _zoo("counts_rejected_tail")),
    Mutant("counts-cancelled-round", "B11", "a cancel counts the in-flight block as a verified round",
           ("SCHED-CANCEL",), _zoo("counts_cancelled_round"),
           invisible="a cancel needs the scheduler hook, withheld black-box"),
    Mutant("uncounted-branch-discards", "B11", "lookahead tokens discarded after a rejection are not counted",
           ("LOOKAHEAD-STATS",), _zoo("uncounted_branch_discards"),
           invisible="lookahead needs the scheduler hook, withheld black-box"),
    Mutant("shared-random-stream", "B12", "one random stream reseeded per request (mlx-lm style)",
           ("SCHED-INTERLEAVE", "SCHED-CONCURRENT-SEEDS", "LOOKAHEAD-EQUIV", "CONCURRENT-EQUALS-SOLO"),
           _zoo("shared_random_stream"),
           invisible="a solo request is reseeded at admission and repeats exactly; only requests in flight together "
                     "(concurrency and the scheduler hook, withheld output-only) share the stream", server_visible=True),
    Mutant("shared-generator-when-concurrent", "B12",
           "position-addressed draws alone, one shared generator while two requests are in flight",
           ("CONCURRENT-EQUALS-SOLO", "SCHED-INTERLEAVE", "SCHED-CONCURRENT-SEEDS"), _zoo("shared_when_concurrent"),
           invisible="every request is exact alone; only requests in flight together (concurrency, withheld "
                     "output-only) share the generator", server_visible=True),
    Mutant("unseeded-acceptance", "B12", "acceptance uniforms from an unseeded generator",
           ("SEED-DETERMINISM", "SCHED-INTERLEAVE", "SCHED-CONCURRENT-SEEDS", "LOOKAHEAD-EQUIV"),
           _zoo("unseeded_acceptance")),
    Mutant("exact-match-shared-stream", "B12", "exact-match acceptance over one shared random stream",
           ("SEED-SPEC-EQUALS-PLAIN", "SCHED-INTERLEAVE", "SCHED-CONCURRENT-SEEDS", "LOOKAHEAD-EQUIV"),
           _zoo("shared_random_stream"), {"acceptance": "exact_match"}),
    Mutant("seed-plus-position", "B12", "random keys hash seed + position: seed s+1 replays seed s one position later",
           ("SEED-INDEPENDENT",), _zoo("seed_plus_position")),
    Mutant("stale-draft-seed", "B12", "the draft sampler is re-keyed only when the sampling controls change, not the seed",
           ("SEED-HISTORY",), _zoo("stale_draft_seed")),
    Mutant("draft-stream-is-target-stream", "B12", "exact-match drafts reuse the target's uniform of their position",
           ("SEED-STREAMS-INDEPENDENT",), _zoo("draft_stream_is_target_stream"), {"acceptance": "exact_match", **TWIN}),
    Mutant("acceptance-reuses-draft-uniform", "B12", "the rejection rule's acceptance uniform is the draft's "
           "uniform of that position", ("SEED-STREAMS-INDEPENDENT",), _zoo("acceptance_reuses_draft_uniform")),
    Mutant("correction-reuses-accept-uniform", "B12", "the correction is drawn with the acceptance uniform that "
           "rejected the proposal", ("SEED-STREAMS-INDEPENDENT",), _zoo("correction_reuses_accept_uniform")),
    Mutant("samples-share-the-parent-seed", "B12", "n > 1: every sample runs under the request's own seed",
           ("SEED-SAMPLES-INDEPENDENT",), _zoo("samples_share_the_parent_seed"), scope="backend",
           invisible="each sample is exact and a solo request unchanged; only n > 1 (withheld output-only) shows "
                     "the copies", server_visible=True),
    Mutant("samples-seed-plus-index", "B12", "n > 1: sample i runs under seed + i (vLLM 0.32's child seeds)",
           ("SEED-SAMPLES-INDEPENDENT",), _zoo("samples_seed_plus_index"), scope="backend",
           invisible="each sample is exact and a solo request unchanged; only n > 1 (withheld output-only) shows "
                     "requests under neighbouring seeds sharing samples", server_visible=True),
    Mutant("lenient-acceptance", "B13", "accept with min(1, p / (0.5 q)): a relaxed threshold",
           ("TRACE-ACCEPT",), _zoo("lenient_acceptance", lam=0.5)),
    Mutant("typical-acceptance", "B13", "Medusa typical acceptance: p(d) > min(0.09, 0.3 exp(-H(p)))",
           ("TRACE-ACCEPT", "DIST-EQUIV"), _zoo("typical_acceptance")),
    Mutant("confident-draft-accepted", "B13", "a proposal with q(d) >= 0.25 is accepted without the target",
           ("TRACE-ACCEPT", "DIST-ZERO", "DIST-EQUIV"), _zoo("confident_draft_accepted")),
    Mutant("draft-logprobs", "B14", "accepted proposals report the draft's logprob",
           ("LOGPROBS",), _zoo("draft_logprobs"),
           invisible="logprobs are withheld black-box (mlx-lm and mlx-vlm declare none)", server_visible=True),
    Mutant("zero-logprobs", "B14", "accepted proposals report logprob 0",
           ("LOGPROBS",), _zoo("zero_logprobs"),
           invisible="logprobs are withheld black-box (mlx-lm and mlx-vlm declare none)", server_visible=True),
    Mutant("promotes-after-partial-acceptance", "B15", "a lookahead branch promoted when its first token equals a correction",
           ("LOOKAHEAD-PROMOTION", "LOOKAHEAD-EQUIV"), _zoo("promotes_after_partial_acceptance"),
           invisible="lookahead needs the scheduler hook, withheld black-box"),
    Mutant("ignores-require-acceleration", "B16", "require_acceleration not honoured: runs unaccelerated",
           ("REPORT-NO-SILENT-FALLBACK",), _zoo("ignores_require_acceleration")),
    Mutant("drops-penalties", "B16", "speculates with penalties and logit bias, and drops them",
           ("REPORT-NO-SILENT-FALLBACK",), _zoo("drops_penalties")),
    Mutant("penalty-history-without-prompt", "B16", "speculates with penalties; both paths leave the prompt out of "
           "the penalty history (mlx-lm 0.31.2)", ("CTRL-CONTRACT",),
           _zoo("penalty_history_without_prompt", drops=("speculative", "plain")), scope="backend", base="mlx",
           needs="an output that repeats its own tokens: the toy's random greedy output repeats none in 24 tokens, so "
                 "penalties over the output alone change nothing there and REPORT-NO-SILENT-FALLBACK calls them "
                 "dropped; on the trained fixture they act, and the old clauses pass it, as they passed mlx-lm 0.31.2"),
    Mutant("plain-penalty-history-without-prompt", "B16", "speculates with penalties; the plain path leaves the "
           "prompt out of the penalty history (mlx-lm 0.31.1)", ("CTRL-CONTRACT", "REPORT-NO-SILENT-FALLBACK"),
           _zoo("penalty_history_without_prompt", drops=("plain",)), scope="backend"),
    Mutant("speculative-penalty-history-without-prompt", "B16", "speculates with penalties; the speculative path "
           "leaves the prompt out of the penalty history (mlx-lm 0.32.2, L1)",
           ("CTRL-CONTRACT", "REPORT-NO-SILENT-FALLBACK"),
           _zoo("penalty_history_without_prompt", drops=("speculative",)), scope="backend"),
    Mutant("fallback-reported-as-used", "B16", "drafter silently not started; target-only output reported as speculative",
           ("REPORT-HONEST", "REPORT-DEPTH"), _zoo("fallback_reported_as_used")),
    Mutant("unreported-fallback", "B16", "drafter silently not started; used=false without a reason",
           ("REPORT-HONEST", "REPORT-DEPTH"), _zoo("unreported_fallback")),
    Mutant("off-block-ignored", "B16", "speculation=off read as the loaded default",
           ("REQ-BLOCK", "REPORT-HONEST"), _zoo("off_block_ignored")),
    Mutant("sticky-override", "B16", "a per-call depth override becomes the default",
           ("REQ-OVERRIDE",), _zoo("sticky_override")),
    Mutant("drafter-silently-disabled", "B17", "drafting silently stops after two rounds; still reported as used",
           ("REPORT-DEPTH", "REPORT-HONEST"), _zoo("drafter_silently_disabled")),
    Mutant("budget-one-short", "B11", "the budget check is off by one: ends at max_tokens - 1, reports 'length'",
           ("STATS-CONSISTENT",), _zoo("budget_one_short")),
    Mutant("previous-seed-mixed", "B12", "the target's random key mixes in the previous seeded request's seed",
           ("SEED-HISTORY",), _zoo("previous_seed_mixed")),
    Mutant("accepts-nothing", "B17", "every proposal is rejected and the token drawn from the target's own law: "
           "lossless plain output, reported as speculation with 0 accepted",
           ("GREEDY-EQUIV", "DIST-EQUIV", "STATS-CONSISTENT"), _zoo("accepts_nothing")),
    Mutant("stale-hidden-state", "B17", "the MTP head reads the target's hidden states one row late after verification",
           ("DRAFT-FRESH",), _zoo("stale_hidden_state"),
           invisible="the head's stale hidden state only lowers acceptance: every token is still verified by the target, so tokens, their law and the statistics' consistency are exact"),
    Mutant("starving-scheduler", "-", "the scheduler always serves the lowest runnable request id",
           ("SCHED-FAIR",), _zoo("starving_scheduler"), scope="backend",
           invisible="scheduling order needs the scheduler hook, withheld black-box"),
    Mutant("publishes-after-stop-in-block", "B10", "a block is published before the stop rule cuts it: the tokens "
           "after a stop accepted inside it are streamed, the result cut right", ("STOP-IN-BLOCK",),
           _zoo("publishes_after_stop_in_block")),
    Mutant("drafter-keeps-confident-draws", "B01", "a confidence-threshold drafter decides after the draw: a proposal "
           "with q(d) < 0.3 is dropped and the block ends; kept proposals are verified against q, not the law they "
           "follow", ("DIST-EQUIV",), _zoo("drafter_keeps_confident_draws"), scope="backend", base="mlx"),
    Mutant("model-eos-checked-at-round-end", "B10", "the model's own EOS (no stop_token_ids in the request) is "
           "checked on a round's last token only: an EOS accepted inside a block is followed by the rest of it",
           ("STOP-IN-BLOCK",), _zoo("model_eos_checked_at_round_end")),
    Mutant("batch-slot-counters-carried", "B11", "generate_batch: each result after the first also reports the "
           "previous request's rounds (a batch slot's counters not reset)",
           ("STATS-CONSISTENT",), _zoo("batch_slot_counters_carried"), scope="backend",
           invisible="tokens are exact and generate() is exact; only the statistics of results served together "
                     "(generate_batch, withheld output-only) carry the previous request's rounds",
           server_visible=True),
    Mutant("unseeded-batch-shares-randomness", "B12", "the unseeded requests of one generate_batch (or generate_n "
           "without a seed) share one seed drawn per call", ("UNSEEDED-INDEPENDENT",),
           _zoo("unseeded_batch_shares_randomness"), scope="backend",
           invisible="each request is exact alone and every seeded request unchanged; only unseeded requests served "
                     "together (concurrency and n > 1, withheld output-only) come out as copies", server_visible=True),
]

MUTANTS: dict[str, Mutant] = {m.name: m for m in ZOO}



def load_mutant(name: str, base: str = "toy", black_box: str = "0", **options: str):
    """Backend factory: `--mtp-backend=mtpcheck.mutants:load_mutant
    --mtp-backend-option name=NAME [--mtp-backend-option base=mlx]
    [--mtp-backend-option black_box=1|server]` (black_box: the white-box capabilities
    withheld, mtpcheck.backends.blackbox: 1 the output-only mask, server the server mask)."""
    from mtpcheck.backends import load_backend

    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    m = MUTANTS[name]
    backend = load_backend(m.base or base, {**m.options, **options})
    m.apply(backend if m.scope == "backend" else backend.engine)
    backend.engine.name = f"mutant:{name}"
    if black_box not in ("0", "false", ""):
        from mtpcheck.backends.blackbox import BlackBox

        return BlackBox(backend, "server" if black_box == "server" else "output")
    return backend
