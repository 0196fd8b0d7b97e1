"""The suite's logic, as plain functions over results, traces and laws.

Each `*_problems` function returns a list of human-readable problems; empty
means the clause holds. Suite tests assert on them; downstream suites can
call them directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    RoundTrace,
    SamplingParams,
    TokenEvent,
)
from mtpcheck.contracts.models import history_digest
from mtpcheck.laws.precision import precision
from mtpcheck.laws.stats import filter_margin

LAW_ATOL = 1e-9  # traced laws are float64; recomputation differs only by rounding

CAPABILITIES: dict[str, Callable[[Capabilities], bool]] = {
    "speculation": lambda c: bool(c.mtp_kinds) and c.max_depth >= 1,
    "target_distributions": lambda c: c.target_distributions,
    "draft_distributions": lambda c: c.draft_distributions,
    "traces": lambda c: c.traces,
    "logprobs": lambda c: c.logprobs,
    "text": lambda c: c.text,
    "seeded_determinism": lambda c: c.seeded_determinism,
    "position_addressed_target_sampling": lambda c: c.position_addressed_target_sampling,
    "exact_match": lambda c: c.acceptance_rule == "exact_match",
    "rejection": lambda c: c.acceptance_rule == "rejection",
    "scheduler": lambda c: c.scheduler,
    "lookahead": lambda c: c.lookahead,
    "constraints": lambda c: c.constraints,
    "request_constraints": lambda c: c.request_constraints,
    "parallel_samples": lambda c: c.parallel_samples,
    "inspection": lambda c: c.checkpoint_evidence,
    "streaming": lambda c: c.streaming,
    "concurrent": lambda c: c.concurrent,  # Capabilities enforces generate_batch with it
}


RULE_VALUES = ("exact_match", "rejection")  # values of Capabilities.acceptance_rule, not capabilities


def missing_capabilities(caps: Capabilities, needed: list[str]) -> list[str]:
    unknown = [n for n in needed if n not in CAPABILITIES]
    if unknown:
        raise ValueError(f"unknown capability names {unknown}; known: {sorted(CAPABILITIES)}")
    return sorted({n for n in needed if not CAPABILITIES[n](caps)})


def cannot_speculate(caps: Capabilities) -> str | None:
    """Why the declared capabilities forbid any speculative request, or None."""
    why = ([] if caps.mtp_kinds else ["no drafter (mtp_kinds=[])"]) + (["max_depth=0"] if caps.max_depth < 1 else [])
    return f"backend cannot speculate: {', '.join(why)}" if why else None


def skip_reason(caps: Capabilities, missing: list[str]) -> str:
    """One skip line for `missing` (from missing_capabilities): speculation
    says which declaration forbids it, a rule value is named as the value the
    backend declares, the rest are missing capabilities."""
    parts = []
    if "speculation" in missing:
        parts.append(cannot_speculate(caps) or "backend cannot speculate")
    rules = [m for m in missing if m in RULE_VALUES]
    if rules:
        parts.append(f"clause needs acceptance_rule={'/'.join(rules)}, backend declares {caps.acceptance_rule!r}")
    lacks = [m for m in missing if m != "speculation" and m not in RULE_VALUES]
    if lacks:
        parts.append(f"backend lacks capability: {', '.join(lacks)}")
    return "; ".join(parts)


# -- statistics of the report ------------------------------------------------


def stats_problems(res: GenerationResult, req: GenerationRequest, caps: Capabilities) -> list[str]:
    """STATS-CONSISTENT. The emitted count follows the schedule the backend
    declares (`caps.first_token_from_prefill`): a target-only first token from
    the prefill, or none (round 0 emits the first token)."""
    s = res.speculation
    out = finish_problems(res, req, caps)
    if not s.used:
        if s.rounds or s.drafted or s.accepted:
            out.append(f"used=False but rounds={s.rounds}, drafted={s.drafted}, accepted={s.accepted}")
        return out
    if not (s.rounds == len(s.accept_lens) == len(s.draft_lens)):
        out.append(f"rounds={s.rounds}, {len(s.accept_lens)} accept_lens, {len(s.draft_lens)} draft_lens")
    if s.drafted != sum(s.draft_lens):
        out.append(f"drafted={s.drafted} != sum(draft_lens)={sum(s.draft_lens)}")
    if s.accepted != sum(s.accept_lens):
        out.append(f"accepted={s.accepted} != sum(accept_lens)={sum(s.accept_lens)}")
    for r, (a, d) in enumerate(zip(s.accept_lens, s.draft_lens, strict=False)):
        if not 0 <= a <= d <= max(s.num_draft_tokens, 0):
            out.append(f"round {r}: accepted {a}, drafted {d}, depth {s.num_draft_tokens}")
    if s.drafted and (s.acceptance_rate is None or abs(s.acceptance_rate - s.accepted / s.drafted) > 1e-9):
        out.append(f"acceptance_rate={s.acceptance_rate} != accepted/drafted={s.accepted / s.drafted:.6f}")
    if s.rounds:
        # the prefill token (when declared), accepted proposals, one correction/bonus per round
        lead = 1 if caps.first_token_from_prefill else 0
        full = lead + s.accepted + s.rounds
        cut = full - len(res.tokens)
        last = s.accept_lens[-1] if s.accept_lens else 0
        if not 0 <= cut <= last:
            terms = f"{'1 + ' if lead else ''}accepted {s.accepted} + rounds {s.rounds}"
            out.append(
                f"{len(res.tokens)} tokens emitted but statistics imply {full} ({terms}"
                f"{'' if lead else ', first_token_from_prefill=False'}); only the last block may be cut"
            )
        elif cut and res.finish_reason != "stop" and len(res.tokens) != req.max_tokens:
            out.append(f"the last block was cut by {cut} without a stop or the budget")
    elif len(res.tokens) > int(caps.first_token_from_prefill):  # no round: only the prefill token, if any
        out.append(f"{len(res.tokens)} tokens emitted with used=True but no round reported "
                   f"(first_token_from_prefill={caps.first_token_from_prefill})")
    if s.bonus_tokens > s.rounds:
        out.append(f"bonus_tokens={s.bonus_tokens} > rounds={s.rounds}")
    return out


def finish_problems(res: GenerationResult, req: GenerationRequest, caps: Capabilities) -> list[str]:
    """STATS-CONSISTENT's finish rules: a budget that ended the request was
    spent ("length" means max_tokens tokens) and did not end on a stop token
    (a stop at the budget is a stop), and "stop" without stop strings
    means the last token is a stop token (the request's stop_token_ids, else
    the backend's EOS ids; the suite's convention, STOP-IN-BLOCK's too, is that
    the stop token is emitted)."""
    out = []
    if res.finish_reason == "length" and len(res.tokens) != req.max_tokens:
        out.append(f"finish_reason='length' with {len(res.tokens)} tokens, max_tokens {req.max_tokens}: "
                   "a budget that ended the request must have been spent")
    stops = set(caps.eos_token_ids if req.stop_token_ids is None else req.stop_token_ids)
    if res.finish_reason == "stop" and not req.stop and stops and res.tokens and res.tokens[-1] not in stops:
        out.append(f"finish_reason='stop' but the last token {res.tokens[-1]} is no stop token "
                   f"({sorted(stops)[:8]}) and the request has no stop string")
    if res.finish_reason == "length" and res.tokens and res.tokens[-1] in stops:
        out.append(f"finish_reason='length' but the last token {res.tokens[-1]} is a stop token: a stop at the "
                   "budget's last token is a stop")
    return out


def rounds_with_room(s, max_tokens: int, depth: int, first_token_from_prefill: bool = True):
    """The report's rounds as (round, accepted, drafted, tokens emitted before
    it, room): room = min(depth, what the budget leaves after the round's
    correction or bonus) - what a fixed-depth drafter must draft."""
    emitted = int(first_token_from_prefill)  # the prefill token, on the schedules that have one
    for r, (a, d) in enumerate(zip(s.accept_lens, s.draft_lens, strict=False)):
        yield r, a, d, emitted, min(depth, max_tokens - emitted - 1)
        emitted += a + 1


def depth_problems(res: GenerationResult, req: GenerationRequest, depth: int,
                   first_token_from_prefill: bool = True, drafting: str = "fixed") -> list[str]:
    """REPORT-DEPTH: each round drafts min(depth, room) <= d <= depth proposals
    (drafting="fixed"), or 0 <= d <= depth for a drafter that may find nothing
    to propose (drafting="up_to_k": n-gram, prompt lookup, confidence thresholds)."""
    s = res.speculation
    if not s.used:
        return []
    out = [] if s.num_draft_tokens == depth else [f"num_draft_tokens={s.num_draft_tokens}, requested {depth}"]
    for r, _, d, emitted, room in rounds_with_room(s, req.max_tokens, depth, first_token_from_prefill):
        low = room if drafting == "fixed" else 0  # never more than the depth, under either policy
        if not low <= d <= depth:
            want = f"{room}" if drafting == "fixed" else f"0..{depth} (drafting={drafting})"
            out.append(f"round {r}: drafted {d} proposals, expected {want} (depth {depth}, {emitted} tokens emitted "
                       f"of {req.max_tokens})")
    return out


def honesty_problems(res: GenerationResult, req: GenerationRequest, caps: Capabilities) -> list[str]:
    """REPORT-HONEST: used=True says speculation ran. Under a fixed drafting
    policy every round with room drafts; a round that drafted nothing with
    room left is plain decoding reported as speculation, unless the report
    says speculation was switched off (adaptive_disabled, with words)."""
    s = res.speculation
    if not s.used or caps.drafting != "fixed" or (s.adaptive_disabled and s.message):
        return []
    return [f"round {r}: drafted nothing with room for {room} (after {emitted} of {req.max_tokens} tokens) while "
            "the report says used=True and not adaptive_disabled"
            for r, _, d, emitted, room in rounds_with_room(s, req.max_tokens, max(s.num_draft_tokens, 1),
                                                           caps.first_token_from_prefill)
            if d == 0 and room >= 1]


# -- traces ------------------------------------------------------------------


def _sample(law: np.ndarray, u: float) -> int:
    from mtpcheck.engine.sampling import sample

    return sample(law, u)


def _is_law(v: np.ndarray) -> bool:
    return v.ndim == 1 and bool(np.all(v >= 0)) and abs(v.sum() - 1.0) < 1e-6


def filter_problems(law: np.ndarray, sp: SamplingParams) -> list[str]:
    """Support constraints every processed law must satisfy (both sides).
    top-p leaves no trace on a renormalised law by itself: the target side is
    checked against target_distributions instead."""
    nz = np.flatnonzero(law > 0)
    out = []
    if sp.temperature == 0.0 and len(nz) != 1:
        out.append(f"temperature 0 but {len(nz)} tokens have mass")
    if sp.top_k is not None and len(nz) > sp.top_k:
        out.append(f"top_k={sp.top_k} but {len(nz)} tokens have mass")
    if sp.min_p and law.max() > 0 and (law[nz] < sp.min_p * law.max() - 1e-12).any():
        out.append(f"min_p={sp.min_p} but a kept token is below min_p * max")
    return out


class TracedRound(NamedTuple):
    """One traced round with the context every trace clause reads it in."""

    index: int  # its place in the trace
    t: RoundTrace
    tag: str  # "round N", the start of every message about it
    committed: int  # output tokens before it: the prefill token precedes round 0
    ps: np.ndarray | None  # [k+1, V] target laws; None, like qs, when the shapes disagree with the proposals
    qs: np.ndarray | None  # [k, V] draft laws
    verdict: Any  # the rule's re-derivation (accepted, next token and law); None when the trace lacks its inputs


def traced_rounds(res: GenerationResult, rule_name: str) -> Iterator[TracedRound]:
    """Every round at its committed offset, which a wrong round still moves by
    what it committed (so it never shifts the rounds after it), with the
    declared rule's verdict: none without fitting shapes, nor without an
    acceptance uniform per proposal under the rejection rule."""
    from mtpcheck.engine.acceptance import get_rule

    rule, committed = get_rule(rule_name), 1
    for i, t in enumerate(res.trace or []):
        k, au, tu = len(t.proposals), np.array(t.accept_uniforms), np.array(t.target_uniforms)
        ps = np.array(t.target_probs, dtype=np.float64)
        qs = np.array(t.draft_probs, dtype=np.float64).reshape(k, ps.shape[-1])
        fits = ps.shape[0] == k + 1 and qs.shape[0] == k and len(t.draft_uniforms) == k and len(tu) == k + 1
        v = None
        if fits and (len(au) == k or rule_name != "rejection"):
            v = rule.verify(ps, qs, t.proposals, np.concatenate([au, np.zeros(max(0, k - len(au)))]), tu)
        yield TracedRound(i, t, f"round {t.round}", committed, ps if fits else None, qs if fits else None, v)
        committed += len(t.committed)


def rederived_rounds(res: GenerationResult, rule_name: str) -> list[TracedRound]:
    """The rounds whose accepted count the rule re-derives: the clauses after
    TRACE-ACCEPT judge only these, TRACE-ACCEPT reports the others."""
    return [r for r in traced_rounds(res, rule_name) if r.verdict is not None and r.verdict.accepted == r.t.accepted]


def accept_problems(res: GenerationResult, req: GenerationRequest, rule_name: str,
                    ground_truth: np.ndarray | None = None) -> list[str]:
    """TRACE-ACCEPT. Each round's laws are laws the request's sampling shaped,
    each proposal is its draft law's sample at its uniform, the target laws are
    the teacher-forced ones (`ground_truth`: [len(tokens), V], when given), and
    the accepted count is the declared rule's."""
    out = []
    # a target law that is right before the first rejection and wrong after it
    # points to state the rollback did not restore, not to logit processing
    first_rejection = hint = None
    for r in traced_rounds(res, rule_name):
        t, tag, ps, qs, k = r.t, r.tag, r.ps, r.qs, len(r.t.proposals)
        if ps is None:
            out.append(f"{tag}: trace shapes disagree with {k} proposals")
            continue
        for j in range(k):
            if not _is_law(qs[j]) or not _is_law(ps[j]):
                out.append(f"{tag}: position {j} carries a law that does not sum to 1")
            elif _sample(qs[j], t.draft_uniforms[j]) != t.proposals[j]:
                out.append(f"{tag}: proposal {j} ({t.proposals[j]}) is not the draft law's sample at its uniform "
                           f"(got {_sample(qs[j], t.draft_uniforms[j])}): q is not the law it was drawn from")
            out.extend(f"{tag}: draft law {j}: {p}" for p in filter_problems(qs[j], req.sampling))
        for j in range(k + 1):
            out.extend(f"{tag}: target law {j}: {p}" for p in filter_problems(ps[j], req.sampling))
        for j in range(min(len(t.committed), k + 1) if ground_truth is not None else 0):
            row = r.committed + j
            if row < len(ground_truth) and np.max(np.abs(ground_truth[row] - ps[j])) > 1e-4:
                if hint is None:  # decided by the first mismatch of the trace
                    hint = (f"state not restored after round {first_rejection}'s rejection (the target's KV or "
                            f"recurrent state still holds rejected proposals?): every law before it matches"
                            if first_rejection is not None else "one-sided processing of the target logits?")
                out.append(f"{tag}: target law at position {j} differs from the teacher-forced target law "
                           f"by {np.max(np.abs(ground_truth[row] - ps[j])):.3g} ({hint})")
        if t.accepted < k and first_rejection is None:
            first_rejection = t.round
        if r.verdict is None:  # the shapes fit, so the acceptance uniforms are missing
            out.append(f"{tag}: {len(t.accept_uniforms)} acceptance uniforms for {k} proposals")
        elif r.verdict.accepted != t.accepted:
            out.append(f"{tag}: {t.accepted} proposals accepted, the {rule_name} rule accepts {r.verdict.accepted}")
    return out


def residual_bonus_problems(res: GenerationResult, rule_name: str) -> list[str]:
    """TRACE-RESIDUAL-BONUS, on the rounds whose acceptance re-derives: after a
    rejection the next token is a correction, after full acceptance a bonus;
    either is drawn from the rule's law and is its sample at the traced uniform."""
    out = []
    for r in rederived_rounds(res, rule_name):
        t, tag, k, v = r.t, r.tag, len(r.t.proposals), r.verdict
        kind = "bonus" if t.accepted == k else "correction"
        if t.next_kind != kind:
            out.append(f"{tag}: next token is a {t.next_kind}, expected a {kind} after {t.accepted}/{k} accepted")
        if t.next_law is None or np.max(np.abs(np.array(t.next_law) - v.next_law)) > LAW_ATOL:
            out.append(f"{tag}: the {kind} was drawn from the wrong law "
                       f"(max error {np.max(np.abs(np.array(t.next_law or 0) - v.next_law)):.3g})")
        if t.next_token != v.next_token:
            out.append(f"{tag}: {kind} token {t.next_token}, the law's sample at its uniform is {v.next_token}")
    return out


def rollback_problems(res: GenerationResult, req: GenerationRequest, rule_name: str) -> list[str]:
    """TRACE-ROLLBACK, on the rounds whose acceptance re-derives: each commits
    a prefix of what it emitted; after it the target cache holds prompt +
    committed - 1 entries (the last token stays pending), the draft cache no
    more, the sampler the committed history's state. Token events are the
    committed tokens, published inside a round's verify window, and the rounds
    account for every output token."""
    out = []
    for r in rederived_rounds(res, rule_name):
        t, tag = r.t, r.tag
        emitted = t.proposals[: t.accepted] + [t.next_token]
        if t.committed != emitted[: len(t.committed)] or not t.committed:
            out.append(f"{tag}: committed {t.committed} is not a non-empty prefix of the emitted {emitted}")
        n = len(req.prompt_tokens) + r.committed - 1
        if t.target_len_before != n:
            out.append(f"{tag}: target cache length {t.target_len_before} before the round, expected {n}")
        if t.position != t.target_len_before + 1:
            out.append(f"{tag}: first proposal at position {t.position}, expected {t.target_len_before + 1}")
        if t.target_len_after != n + len(t.committed):
            out.append(f"{tag}: target cache length {t.target_len_after} after, expected {n + len(t.committed)} "
                       f"(the last emitted token must stay pending)")
        if t.draft_len_after > t.target_len_after:
            out.append(f"{tag}: draft cache {t.draft_len_after} longer than the target's {t.target_len_after}")
        if t.sampler_digest_after != history_digest(req.prompt_tokens + res.tokens[: r.committed + len(t.committed)]):
            out.append(f"{tag}: sampler state after the round is not that of the committed history")
        if t.sampler_digest_before != history_digest(req.prompt_tokens + res.tokens[: r.committed]):
            out.append(f"{tag}: sampler state before the round is not that of the committed history")
        token_events = [res.events[i] for i in t.events if i < len(res.events) and isinstance(res.events[i], TokenEvent)]
        if [e.token for e in token_events] != t.committed:
            out.append(f"{tag}: token events {[e.token for e in token_events]} != committed {t.committed}")
    if res.trace:
        # every token event after the prefill's lies in some round's verify window: one published
        # between two verifications (at draft time, say) was published before its token was verified
        windows = {i for t in res.trace for i in t.events}
        start = min(windows, default=len(res.events))
        tokens = [i for i, e in enumerate(res.events) if isinstance(e, TokenEvent)]
        prefill = [i for i in tokens if i < start][:1]  # the prefill token's event precedes round 0
        outside = [i for i in tokens if i not in windows and i not in prefill]
        if outside:
            e = res.events[outside[0]]
            out.append(f"{len(outside)} token events published outside every round's verify window, first: "
                       f"event {outside[0]} (token {e.token} at index {e.index}), published before verification")
    committed = 1 + sum(len(t.committed) for t in res.trace or [])  # with the prefill token
    if res.trace is not None and committed != len(res.tokens):
        out.append(f"rounds commit {committed} tokens (with the prefill token), the result has {len(res.tokens)}")
    return out


def bonus_uncached_problems(res: GenerationResult, rule_name: str) -> list[str]:
    """BONUS-UNCACHED, on the rounds whose acceptance re-derives: each after the
    first is led by the last emitted token, and a fully accepted block leaves
    k + 1 new cache entries: the bonus is emitted but not cached."""
    out = []
    for r in rederived_rounds(res, rule_name):
        t, tag, k = r.t, r.tag, len(r.t.proposals)
        if r.index > 0 and t.pending_token != res.tokens[r.committed - 1]:
            out.append(f"{tag}: verification led by {t.pending_token}, not the last emitted token "
                       f"{res.tokens[r.committed - 1]}")
        if t.accepted == k and len(t.committed) == k + 1 and t.target_len_after != t.target_len_before + k + 1:
            out.append(f"{tag}: after full acceptance the cache holds {t.target_len_after - t.target_len_before} "
                       f"new entries, expected {k + 1} (the bonus stays uncached)")
    return out


# -- publication ---------------------------------------------------------------


def events_problems(res: GenerationResult) -> list[str]:
    """EVENTS-COMMIT-ONLY over `GenerationResult.events`: the token events are
    the emitted tokens, one per token, in order, none repeated or retracted,
    none for a token the output does not hold (a rejected proposal)."""
    toks = [(i, e) for i, e in enumerate(res.events) if isinstance(e, TokenEvent)]
    out = []
    for n, (i, e) in enumerate(toks):
        if n >= len(res.tokens):
            out.append(f"event {i}: token {e.token} at index {e.index} published after all {len(res.tokens)} emitted "
                       f"tokens were (a proposal that was never emitted?)")
        elif e.index != n or e.token != res.tokens[n]:
            held = res.tokens[e.index] if 0 <= e.index < len(res.tokens) else None
            what = ("a token the output does not hold there (a rejected proposal published before verification?)"
                    if held != e.token else "out of order or published twice")
            out.append(f"event {i}: token {e.token} at index {e.index} is token event {n}; the output's token {n} is "
                       f"{res.tokens[n]}: {what}")
        if out:
            break  # the first wrong event; every later one is shifted by it
    if not out and len(toks) != len(res.tokens):
        out.append(f"{len(toks)} token events for {len(res.tokens)} emitted tokens: "
                   f"tokens {res.tokens[len(toks):][:5]} were emitted without an event")
    text = "".join(e.text for e in res.events if getattr(e, "kind", None) == "text")
    if text != res.text:
        out.append(f"text events concatenate to {text[:40]!r}, the result's text is {res.text[:40]!r}")
    return out


def stream_problems(chunks: list, final: list[int], final_text: str | None = None) -> list[str]:
    """EVENTS-COMMIT-ONLY over a stream: chunks concatenate to the final tokens
    and no chunk carries a token the final output does not hold at that
    position; with `final_text`, the chunks' text concatenates to it."""
    out, pos = [], 0
    for c, chunk in enumerate(chunks):
        for tok in chunk.tokens:
            if pos >= len(final) or final[pos] != tok:
                held = final[pos] if pos < len(final) else "nothing"
                out.append(f"chunk {c} carries token {tok} at position {pos}; the final output holds {held} there "
                           f"(a rejected proposal reached the caller?)")
                return out  # later positions are shifted by it
            pos += 1
    if pos != len(final):
        out.append(f"the stream carried {pos} tokens, the final output has {len(final)}")
    ends = [c for c, ch in enumerate(chunks) if ch.finish_reason is not None]
    if ends != [len(chunks) - 1]:
        out.append(f"finish_reason set on chunks {ends} of {len(chunks)}; expected on the last chunk only")
    text = "".join(ch.text for ch in chunks)
    if final_text is not None and not out and text != final_text:
        out.append(f"the stream's text differs from the final output's: {text_difference(text, final_text)}")
    return out


def text_difference(a: str, b: str) -> str:
    """Where two different texts first differ, with a little context each side."""
    at = first_divergence(a, b)
    return f"first difference at character {at}: {a[max(at - 12, 0): at + 24]!r} vs {b[max(at - 12, 0): at + 24]!r}"


# -- greedy ------------------------------------------------------------------


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie_divergence(backend, caps: Capabilities, prompt: list[int], want: list[int], got: list[int]) -> dict | None:
    """Where greedy output `got` first leaves `want` (the same runtime's greedy
    output) at a float flip: both tokens within the precision rule's logit gap
    of the top of the target's law along want's prefix. None when they do not
    differ there, or the difference is no near-tie (a length, a token far below)."""
    i = first_divergence(got, want)
    if i is None or i >= min(len(got), len(want)) or not caps.target_distributions:
        return None
    law = np.asarray(backend.target_distributions(prompt, want[: i + 1], SamplingParams(temperature=1.0))[i],
                     dtype=np.float64)
    a, b = int(want[i]), int(got[i])
    if not 0 <= b < len(law) or law[a] <= 0 or law[b] <= 0:
        return None
    gap, tol = float(math.log(law.max() / min(law[a], law[b]))), precision(caps).logit_gap
    return dict(position=i, plain_token=a, spec_token=b, gap=gap, logit_gap_tolerance=tol) if gap < tol else None


def sampled_through(caps: Capabilities) -> str:
    """How the statistical clauses drew their samples, for the report's evidence."""
    if not caps.generate_batch:
        return "generate"
    return "generate_batch (served together: concurrent)" if caps.concurrent else "generate_batch (one after another)"


def token_role(res: GenerationResult, i: int, first_token_from_prefill: bool = True) -> str:
    """What output token i was in the reported rounds: "prefill", "accepted"
    (a verified proposal), "bonus", "correction", or "plain" (no round holds it)."""
    s = res.speculation
    start = int(first_token_from_prefill)
    if i < start:
        return "prefill"
    for a, d in zip(s.accept_lens, s.draft_lens, strict=False) if s.used else ():
        if i < start + a + 1:
            return "accepted" if i - start < a else ("bonus" if a == d else "correction")
        start += a + 1
    return "plain"


def divergence_mechanism(res: GenerationResult, i: int, first_token_from_prefill: bool = True) -> str:
    """Where a greedy divergence at output token i sits in the reported rounds,
    and the mechanism that placement points to (black-box: from the report's
    accept_lens / draft_lens alone)."""
    s = res.speculation
    lead = int(first_token_from_prefill)
    if not s.used or not s.accept_lens or i < lead:
        return "outside any speculative round (the target-only path differs?)"
    start, first_rejection = lead, None
    for r, (a, d) in enumerate(zip(s.accept_lens, s.draft_lens, strict=False)):
        if i < start + a + 1:
            j = i - start
            where = f"round {r}, token {j} of its {a + 1}"
            state = ("state not restored by the rollback (the target's KV or recurrent cache still holds the "
                     "rejected proposals?)")
            if r and s.accept_lens[r - 1] < s.draft_lens[r - 1]:  # the round right after a rejection
                return f"{where}, the round right after round {r - 1} rejected proposals: {state}"
            what = ("an accepted proposal is not the target's greedy token (verified at the wrong position?)" if j < a
                    else f"the {'bonus' if a == d else 'correction'} is not the target's greedy token")
            return f"{where}: {what}" + (f"; or {state[0].lower()}{state[1:]} since round {first_rejection}"
                                         if first_rejection is not None else "")
        if a < d and first_rejection is None:
            first_rejection = r
        start += a + 1
    return "after the rounds the report counts (statistics disagree with the output?)"


def top2_logit_gap(p: np.ndarray) -> float:
    """log(p1 / p2) of a temperature-1 law: the gap between its two largest
    logits, whatever the rest of the vocabulary holds. (A probability margin
    p1 - p2 is not: on a flat softmax over a large vocabulary it is tiny at
    every position, so it would excuse any divergence as a near-tie.)"""
    p2, p1 = np.sort(np.asarray(p, dtype=np.float64))[-2:]
    return math.inf if p2 <= 0 else float(math.log(p1 / p2))


# -- seeded samples ------------------------------------------------------------


def seeded_flip(law: np.ndarray, plain_token: int, spec_token: int, uniform: float | None = None) -> dict:
    """Where a seeded inverse-CDF draw (token-id order, engine.sampling.sample)
    could land on `spec_token` instead of `plain_token` by rounding alone.

    Plain decoding drew `plain_token` at uniform u: u lies in its interval of
    the plain-path law. A runtime whose law differs from it by at most d in
    every CDF value can only draw a token whose interval lies within d of
    that one, so `interval_gap` (0 for neighbouring tokens) is a lower bound
    of the perturbation that explains the flip; with u known (a trace), the
    distance from u to the speculative token's interval is the exact one."""
    p = np.asarray(law, dtype=np.float64)
    hi = np.cumsum(p) / p.sum()
    lo = hi - p / p.sum()
    a, b = int(plain_token), int(spec_token)
    if a < b:  # the edge of a's interval that faces b
        boundary, gap = float(hi[a]), float(lo[b] - hi[a])
    else:
        boundary, gap = float(lo[a]), float(lo[a] - hi[b])
    out = dict(plain_token=a, spec_token=b, p_plain=float(p[a]), p_spec=float(p[b]), boundary=boundary,
               interval_gap=max(gap, 0.0), uniform=uniform, uniform_to_spec_interval=None)
    if uniform is not None:
        out["uniform_to_spec_interval"] = float(lo[b] - uniform if a < b else uniform - hi[b])
    return out


def flip_excused(flip: dict, tolerance: float) -> tuple[bool, str]:
    """(excused, why) for seeded_flip's evidence at a declared CDF tolerance."""
    if tolerance <= 0:
        return False, "the CDF tolerance is 0 (exact): no flip is excused"
    if flip["p_spec"] <= 0:
        return False, f"the speculative token {flip['spec_token']} has probability 0 under the target law"
    if flip["interval_gap"] > tolerance:
        return False, (f"the tokens' CDF intervals are {flip['interval_gap']:.3g} apart, beyond the CDF tolerance "
                       f"{tolerance:g}: no rounding of the law explains it")
    d = flip["uniform_to_spec_interval"]
    if d is not None and d > tolerance:
        return False, (f"the seeded uniform {flip['uniform']:.9g} is {d:.3g} from the speculative token's interval, "
                       f"beyond the CDF tolerance {tolerance:.3g}")
    return True, f"within the CDF tolerance {tolerance:.3g} of the CDF boundary {flip['boundary']:.9g}"


def traced_uniform(res: GenerationResult, prompt_len: int, index: int) -> float | None:
    """The target-stream uniform a trace reports for output token `index`
    (logical position prompt_len + index), or None (no trace, or the
    prefill token, which no round covers)."""
    pos = prompt_len + index
    for t in res.trace or []:
        j = pos - t.position
        if 0 <= j < len(t.target_uniforms):
            return float(t.target_uniforms[j])
    return None


# -- observations for the statistical clauses --------------------------------


def boundary_flips(backend, prompt: list[int], tokens: list[int], positions: list[int], sp: SamplingParams,
                   tolerance: float) -> dict[int, float]:
    """Of `positions` (tokens of target probability 0), those where the token
    can be a float flip of a filter decision (laws.precision's filter margin):
    the backend's own law at temperature only puts it within `tolerance`
    (relative) of surviving the filters. position -> margin."""
    if tolerance <= 0 or not positions or sp.temperature <= 0:
        return {}
    raw = backend.target_distributions(prompt, tokens, sp.model_copy(update={"top_k": None, "top_p": None,
                                                                             "min_p": None}))
    margins = {i: filter_margin(np.asarray(raw[i]), int(tokens[i]), sp) for i in positions}
    return {i: m for i, m in margins.items() if m <= tolerance}


def observations(backend, prompt: list[int], results: list[GenerationResult], sp: SamplingParams,
                 boundary_tolerance: float = 0.0, excused: list | None = None):
    """(token, processed target law) for every emitted token of every result.

    With boundary_tolerance > 0, a token of target probability 0 at a float
    flip of a filter decision (`boundary_flips`) is not a lossy sampler: it
    is left out and appended to `excused` (position, token, margin)."""
    obs = []
    for res in results:
        laws = backend.target_distributions(prompt, res.tokens, sp)
        pairs = list(zip(res.tokens, laws, strict=True))
        zeros = [i for i, (t, law) in enumerate(pairs) if not 0 <= t < len(law) or law[t] <= 0]
        flips = boundary_flips(backend, prompt, res.tokens, zeros, sp, boundary_tolerance)
        if excused is not None:
            excused += [{"position": i, "token": int(res.tokens[i]), "margin": m} for i, m in flips.items()]
        obs += [pair for i, pair in enumerate(pairs) if i not in flips]
    return obs


def logprob_problems(res: GenerationResult, laws: np.ndarray, atol: float = 1e-4) -> list[str]:
    """LOGPROBS at the declared tolerance (Capabilities.logprob_tolerance)."""
    if res.logprobs is None:
        return ["no logprobs reported"]
    out = []
    for i, (tok, lp) in enumerate(zip(res.tokens, res.logprobs, strict=True)):
        want = math.log(laws[i][tok]) if laws[i][tok] > 0 else -math.inf
        if not (abs(lp - want) <= atol or lp == want):
            out.append(f"token {i} ({tok}): logprob {lp:.6g}, target law says {want:.6g} "
                       f"(off by {abs(lp - want):.3g} > logprob_tolerance {atol:g})")
    return out
