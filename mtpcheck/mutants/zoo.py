"""The mutant zoo's bugs: the reference engine with one bug each, put where a
runtime has it (docs/bug-classes.md, B01-B17).

Every bug is a subclass of one of the engine's own objects - the acceptance
rule, a drafter, the engine's planning / commit / statistics / randomness
methods, the scheduler - so the mutant runs the real code path with the bug
in it; nothing fakes a result. `mtpcheck.mutants.MUTANTS` names them and
declares the clauses expected to catch each one.

Imports mlx: loaded only when a mutant is applied (mtpcheck.mutants stays
mlx-free on import).
"""

from __future__ import annotations

import math
import random

import mlx.core as mx
import numpy as np

from mtpcheck.contracts import FinishEvent, SamplingParams, StopEvent, StreamChunk, TokenEvent
from mtpcheck.engine.acceptance import (
    Rule,
    Verdict,
    exact_match_correction,
    rejection_accept_probability,
    rejection_correction,
)
from mtpcheck.engine.cache import trim_cache
from mtpcheck.engine.constraints import FREE, masked
from mtpcheck.engine.decode import Engine
from mtpcheck.engine.draft import AssistantDrafter, DraftBlock, MtpDrafter
from mtpcheck.engine.sampling import (
    STREAM_ACCEPT,
    STREAM_DRAFT,
    STREAM_TARGET,
    process,
    sample,
    uniform,
)
from mtpcheck.engine.state import LookaheadStats, Plan

PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias")


# -- how a bug is put into the engine ------------------------------------------------


def become(obj, cls: type) -> None:
    """Subclass an object in place: its class becomes `cls` on top of its own class."""
    base = type(obj)
    obj.__class__ = cls if issubclass(cls, base) else type(cls.__name__, (cls, base), {})


def with_drafters(engine: Engine, mixin: type, only: tuple[type, ...] = (MtpDrafter, AssistantDrafter),
                  attrs: dict | None = None) -> None:
    """The engine builds its drafters (of the kinds in `only`) with `mixin` on
    top: the drafter is where the bug lives. `attrs` become class attributes."""
    kinds = {base: type(f"{mixin.__name__}{base.__name__}", (mixin, base), dict(attrs or {})) for base in only}
    make = engine.make_drafter

    def make_drafter(plan):
        d = make(plan)
        if type(d) in kinds:
            d.__class__ = kinds[type(d)]
        return d

    engine.make_drafter = make_drafter


def with_rule(engine: Engine, verify, accept=None, correction=None) -> None:
    """Replace the acceptance rule's decision procedure; the rule keeps its name
    (the runtime still claims the rule it declares)."""
    r = engine.rule
    engine.rule = Rule(r.name, accept or r.accept_probability, correction or r.correction, verify)


def _onehot(i: int, n: int) -> np.ndarray:
    e = np.zeros(n)
    e[i] = 1.0
    return e


def rejection_verify(accept, correction):
    """The rejection rule's decision procedure over the given laws (as
    acceptance.verify_rejection, which is this with the correct laws)."""

    def verify(ps, qs, proposals, au, tu):
        for j, d in enumerate(proposals):
            if not au[j] < accept(ps[j], qs[j], d):
                law = correction(ps[j], qs[j], d)
                return Verdict(j, sample(law, tu[j]), "correction", law)
        k = len(proposals)
        return Verdict(k, sample(ps[k], tu[k]), "bonus", ps[k])

    return verify


# -- B01 argmax draft verified as sampled -------------------------------------------------


class ArgmaxProposal:
    """The drafter proposes the mode of q but hands q itself to verification."""

    def draw(self, logits, sp, history, seed, pos, cursor):
        _, q, u = super().draw(logits, sp, history, seed, pos, cursor)
        return int(np.argmax(q)), q, u


def argmax_draft(engine):
    with_drafters(engine, ArgmaxProposal)


class KeepsConfidentDraws:
    """A confidence-threshold drafter that decides after the draw: a proposal
    whose own draft probability is below the threshold is dropped and the
    block ends there. The kept proposals follow q restricted to confident
    tokens, yet are verified against q."""

    threshold = 0.3

    def draft(self, history, target_len, k, sp, seed, cursor):
        block = super().draft(history, target_len, k, sp, seed, cursor)
        keep = next((i for i, (t, q) in enumerate(zip(block.tokens, block.probs, strict=True)) if q[t] < self.threshold),
                    len(block.tokens))
        return block.head(keep)


def drafter_keeps_confident_draws(backend):
    """Declared as a drafter that may draft fewer than k (drafting="up_to_k"),
    as a confidence-threshold runtime would: the shorter blocks are legitimate,
    the law of the kept proposals is not."""
    with_drafters(backend.engine, KeepsConfidentDraws, only=(MtpDrafter,))
    caps = backend.capabilities
    backend.capabilities = lambda: caps().model_copy(update={"drafting": "up_to_k"})


# -- B02 one-sided processing ----------------------------------------------------------------


class TargetFiltersDropped(Engine):
    """Verification processes the target logits with temperature only: top-k,
    top-p and min-p are applied to the draft side alone."""

    def target_pass(self, history, cache, block, sp, cursor):
        raw = sp.model_copy(update={"top_k": None, "top_p": None, "min_p": None})
        return super().target_pass(history, cache, block, raw, cursor)


def target_filters_dropped(engine):
    become(engine, TargetFiltersDropped)


class NucleusBeforeTemperature(Engine):
    """The target sampler cuts the nucleus (top-p) on the temperature-1 law,
    then tempers the survivors (processors in the wrong order): exact at T = 1
    and without top-p, wrong wherever a nucleus meets another temperature."""

    def target_law(self, logits, sp, history):
        if sp.temperature in (0.0, 1.0) or sp.top_p is None:
            return super().target_law(logits, sp, history)
        keep = process(logits, SamplingParams(temperature=1.0, top_p=sp.top_p), history) > 0
        return super().target_law(np.where(keep, logits, -np.inf), sp.model_copy(update={"top_p": None}), history)


def nucleus_before_temperature(engine):
    become(engine, NucleusBeforeTemperature)


class UnprocessedDraftSampler:
    """The drafter samples from the raw softmax (temperature 1, no filters)
    while the law it reports for verification is the processed one."""

    def draw(self, logits, sp, history, seed, pos, cursor):
        _, q, u = super().draw(logits, sp, history, seed, pos, cursor)
        raw = process(masked(np.array(logits, dtype=np.float64), cursor.mask), SamplingParams(temperature=1.0), history)
        return sample(raw, u), q, u


def draft_sampler_unprocessed(engine):
    with_drafters(engine, UnprocessedDraftSampler)


class UnfilteredDraftLaw:
    """The drafter samples from its processed law q (top-k / top-p / min-p
    applied) but hands verification the law at temperature only, without
    the filters: acceptance min(1, p/q') and the residual use the wrong q.
    A per-position bias of TV 0.04-0.07 at top-k / top-p."""

    def draw(self, logits, sp, history, seed, pos, cursor):
        tok, q, u = super().draw(logits, sp, history, seed, pos, cursor)
        loose = sp.model_copy(update={"top_k": None, "top_p": None, "min_p": None})
        return tok, process(masked(np.array(logits, dtype=np.float64), cursor.mask), loose, history), u


def draft_law_unfiltered(engine):
    with_drafters(engine, UnfilteredDraftLaw)


# -- B03 argmax verification at T > 0 -----------------------------------------------------


def _argmax_verify(ps, qs, proposals, au, tu):
    """Accept while the proposal is the target's argmax; a mismatch emits the
    argmax; only the bonus is sampled."""
    for j, d in enumerate(proposals):
        top = int(np.argmax(ps[j]))
        if d != top:
            return Verdict(j, top, "correction", _onehot(top, len(ps[j])))
    k = len(proposals)
    return Verdict(k, sample(ps[k], tu[k]), "bonus", ps[k])


def argmax_verification(engine):
    with_rule(engine, _argmax_verify, accept=lambda p, q, d: float(d == int(np.argmax(p))),
              correction=lambda p, q, d: _onehot(int(np.argmax(p)), len(p)))


# -- B04 wrong residual ------------------------------------------------------------------------


def _residual_is_p(p, q, d):
    return p.copy()


def _residual_softmax(p, q, d):
    r = p - q
    e = np.exp(r - r.max())
    return e / e.sum()


def residual_from_p(engine):
    with_rule(engine, rejection_verify(rejection_accept_probability, _residual_is_p), correction=_residual_is_p)


def residual_softmax(engine):
    with_rule(engine, rejection_verify(rejection_accept_probability, _residual_softmax), correction=_residual_softmax)


# -- B05 one-hot q for a stochastic draft ----------------------------------------------------


def _with_onehot_q(law):
    return lambda p, q, d: law(p, _onehot(d, len(p)), d)


def onehot_q(engine):
    """Acceptance and residual both computed with q = one-hot(proposal): the
    exact-match law in disguise, so the output law stays right; the traced q
    is the law the proposal was really drawn from, and the decisions disagree."""
    accept, corr = _with_onehot_q(rejection_accept_probability), _with_onehot_q(rejection_correction)
    with_rule(engine, rejection_verify(accept, corr), accept=accept, correction=corr)


def onehot_q_acceptance(engine):
    """Acceptance with q = one-hot (accept with p[d]), residual with the real q: lossy."""
    accept = _with_onehot_q(rejection_accept_probability)
    with_rule(engine, rejection_verify(accept, rejection_correction), accept=accept)


# -- B06 first proposal never verified ------------------------------------------------------


def first_proposal_unverified(engine):
    rule = engine.rule

    def verify(ps, qs, proposals, au, tu):
        if not proposals:
            return rule.verify(ps, qs, proposals, au, tu)
        v = rule.verify(ps[1:], qs[1:], proposals[1:], au[1:], tu[1:])  # the loop starts one late
        return Verdict(v.accepted + 1, v.next_token, v.next_kind, v.next_law)

    with_rule(engine, verify)


def target_rows_shifted(engine):
    """Proposal j is verified against the target law of position j+1."""
    rule = engine.rule

    def verify(ps, qs, proposals, au, tu):
        return rule.verify(np.concatenate([ps[1:], ps[-1:]]), qs, proposals, au, tu)

    with_rule(engine, verify)


# -- B07 bonus from the wrong position ------------------------------------------------------


def bonus_from_previous_position(engine):
    rule = engine.rule

    def verify(ps, qs, proposals, au, tu):
        v = rule.verify(ps, qs, proposals, au, tu)
        k = len(proposals)
        if v.next_kind == "bonus" and k:
            return Verdict(k, sample(ps[k - 1], tu[k]), "bonus", ps[k - 1])
        return v

    with_rule(engine, verify)


class BonusFedTwice(Engine):
    """After a fully accepted block the bonus is written into the target cache
    at commit and leads the next verification again: the target sees it twice
    (its length bookkeeping ignores the extra entry)."""

    refeed = False

    def verify(self, st):
        self.refeed = st.__dict__.get("mutant_bonus_cached", False)
        before = st.stats.bonus
        super().verify(st)
        st.mutant_bonus_cached = st.stats.bonus > before

    def target_pass(self, history, cache, block, sp, cursor):
        if self.refeed:
            self.target(mx.array([[history[-1]]]), cache)
        return super().target_pass(history, cache, block, sp, cursor)


def bonus_fed_twice(engine):
    become(engine, BonusFedTwice)


class LeadsWithLastProposal(Engine):
    """After a fully accepted block the next verification is led by the last
    accepted proposal instead of the bonus (the bonus is emitted but never fed).
    The trace reports the token actually fed."""

    lead = None

    def verify(self, st):
        self.lead = st.__dict__.get("mutant_lead")
        before = st.stats.bonus
        super().verify(st)
        if st.traces and self.lead is not None:
            st.traces[-1].pending_token = self.lead
        st.mutant_lead = st.history[-2] if st.stats.bonus > before and len(st.history) >= 2 else None

    def target_pass(self, history, cache, block, sp, cursor):
        if self.lead is not None:
            history = history[:-1] + [self.lead]
        return super().target_pass(history, cache, block, sp, cursor)


def leads_with_last_proposal(engine):
    become(engine, LeadsWithLastProposal)


# -- B08 cache not rolled back ----------------------------------------------------------------


class AssistantNeverRewound:
    """The assistant rewinds its position counter after verification but not
    its KV cache: rejected proposals stay in its context, new tokens go after them."""

    fed = 0  # tokens of the history the runtime believes the assistant holds

    def after_verify(self, target_len_before, target_len_after, hidden):
        self.fed = target_len_after

    def _logits_after(self, seq):
        if self.length == 0:
            logits = self.model(mx.array(seq)[None], self.cache)[1][0, -1]
        else:
            for t in seq[self.fed :]:
                _, out = self.model(mx.array([[t]]), self.cache)
            logits = out[0, -1]
        self.fed = len(seq)
        return logits

    def clone(self):
        c = super().clone()
        c.fed = self.fed
        return c


def assistant_not_rolled_back(engine):
    with_drafters(engine, AssistantNeverRewound, only=(AssistantDrafter,))


# -- B09 sampler / constraint state not restored ---------------------------------------------


class ConstraintAdvancedByRejected(Engine):
    """After a rejection the constraint state takes the rejected proposal
    instead of the correction."""

    def cursor_after(self, cursor, rnd):
        toks, proposals, accepted = list(rnd.committed), rnd.block.tokens, rnd.verdict.accepted
        if accepted < len(proposals) and len(toks) == accepted + 1:
            toks[-1] = proposals[accepted]
        return cursor.advance_all(toks)


def constraint_advanced_by_rejected(engine):
    become(engine, ConstraintAdvancedByRejected)


class UnmaskedDraft:
    """The drafter draws from unmasked logits; only the target is constrained."""

    def draw(self, logits, sp, history, seed, pos, cursor):
        return super().draw(logits, sp, history, seed, pos, FREE)


def unmasked_drafter(engine):
    with_drafters(engine, UnmaskedDraft)


# -- B10 stop inside an accepted block -----------------------------------------------------


class StopCheckedPerBlock(Engine):
    """Stops (EOS, stop strings) are checked on the last token of each block only."""

    def commit(self, st, emitted, logprobs):
        if len(emitted) < 2:
            return super().commit(st, emitted, logprobs)
        m = st.matcher
        eos, stop = m.eos, m.stop
        m.eos, m.stop = set(), []
        try:
            c = super().commit(st, emitted[:-1], logprobs[:-1])
        finally:
            m.eos, m.stop = eos, stop
        if st.out.finish_reason is not None:
            return c
        return c + super().commit(st, emitted[-1:], logprobs[-1:])


def stop_checked_per_block(engine):
    become(engine, StopCheckedPerBlock)


class BudgetBeforeStop(Engine):
    """Committing a speculative round (not the prefill), the budget is checked before the stop:
    a stop token that is also the last allowed token ends the request as
    "length", with no stop event (tokens exact)."""

    def commit(self, st, emitted, logprobs):
        before = len(st.out.tokens)
        c = super().commit(st, emitted, logprobs)
        out = st.out
        if st.plan.used and before and out.finish_reason == "stop" and len(out.tokens) == st.req.max_tokens \
                and out.tokens[-1] in st.matcher.eos:
            out.finish_reason = "length"
            out.events = [e for e in out.events if not isinstance(e, StopEvent | FinishEvent)] + [FinishEvent(reason="length")]
        return c


def budget_before_stop(engine):
    become(engine, BudgetBeforeStop)


# -- B11 statistics wrong --------------------------------------------------------------------


class CountsRejectedTail(Engine):
    """Every proposal of a round is counted as accepted, the rejected tail included."""

    def report(self, st):
        r = super().report(st)
        if not r.used:
            return r
        lens = list(st.stats.draft_lens)
        return r.model_copy(update={"accept_lens": lens, "accepted": sum(lens),
                                    "acceptance_rate": 1.0 if sum(lens) else None})


def counts_rejected_tail(engine):
    become(engine, CountsRejectedTail)


class CountsCancelledRound(Engine):
    """A cancel during a round counts the in-flight block as a verified round."""

    def cancel(self, st):
        if not st.cancelled and st.inflight is not None and st.plan.used:
            st.stats.rounds += 1
            st.stats.accept_lens.append(0)
            st.stats.draft_lens.append(len(st.inflight.block.tokens))
        super().cancel(st)


def counts_cancelled_round(engine):
    become(engine, CountsCancelledRound)


class DiscardsUncounted(LookaheadStats):
    """The tally forgets a rejected or mismatched branch's discards (after
    the adaptive rule has seen them)."""

    def count(self, rec, adaptive_after):
        super().count(rec, adaptive_after)
        if rec.outcome in ("mismatch", "parent_rejected"):
            self.discarded -= rec.discarded


class UncountedBranchDiscards(Engine):
    """Tokens of branches discarded after a rejection or a mismatched bonus are not counted."""

    def admit(self, req, observer=None, constraint=None):
        st = super().admit(req, observer, constraint)
        st.look = DiscardsUncounted()
        return st


def uncounted_branch_discards(engine):
    become(engine, UncountedBranchDiscards)


# -- B12 seed not honoured under concurrency --------------------------------------------------


class SharedStream(Engine):
    """One random stream for the runtime, reseeded when a request is admitted
    (mlx-lm style): solo runs repeat, concurrent ones depend on each other."""

    stream = random.Random(0)

    def admit(self, req, observer=None, constraint=None):
        st = super().admit(req, observer, constraint)
        self.stream = random.Random(st.seed)
        return st

    def uniform(self, seed, stream, position):
        return self.stream.random()


class SharedStreamDraw:
    engine: Engine  # class attribute, set by with_drafters

    def draw(self, logits, sp, history, seed, pos, cursor):
        q = process(masked(np.array(logits, dtype=np.float64), cursor.mask), sp, history)
        u = self.engine.stream.random()
        return sample(q, u), q, u


def shared_random_stream(engine):
    become(engine, SharedStream)
    with_drafters(engine, SharedStreamDraw, attrs={"engine": engine})


class SharedWhenConcurrent(Engine):
    """Position-addressed draws for a request served alone; while two or more
    are in flight every uniform comes from one generator of the runtime
    (vLLM #6038's shape): each request is right alone, and every solo clause
    passes it."""

    shared = random.Random(0)

    def admit(self, req, observer=None, constraint=None):
        st = super().admit(req, observer, constraint)
        self.live = [s for s in getattr(self, "live", []) if not s.done] + [st]
        return st

    def uniform(self, seed, stream, position):
        if sum(not s.done for s in getattr(self, "live", [])) > 1:
            return self.shared.random()
        return super().uniform(seed, stream, position)


def shared_when_concurrent(engine):
    become(engine, SharedWhenConcurrent)


class UnseededAcceptance(Engine):
    """The acceptance uniforms come from an unseeded generator."""

    entropy = random.SystemRandom()

    def uniform(self, seed, stream, position):
        if stream == STREAM_ACCEPT:
            return self.entropy.random()
        return super().uniform(seed, stream, position)


def unseeded_acceptance(engine):
    become(engine, UnseededAcceptance)


# -- B12 random streams that are not independent (seed 000) ------------------------------------


class KeyedDraw:
    """The drafter draws its uniform through the engine's `uniform` (where the
    mutants below put their key derivation), keyed by `draft_seed` when set."""

    engine: Engine  # class attribute, set by with_drafters
    draft_seed: int | None = None

    def draw(self, logits, sp, history, seed, pos, cursor):
        q = process(masked(np.array(logits, dtype=np.float64), cursor.mask), sp, history)
        u = self.engine.uniform(seed if self.draft_seed is None else self.draft_seed, STREAM_DRAFT, pos)
        return sample(q, u), q, u


class SeedPlusPosition(Engine):
    """The careless key: seed and position are added before hashing, so seed
    s + d replays seed s's draws d positions later (every stream)."""

    def uniform(self, seed, stream, position):
        return uniform(seed + position, stream, 0)


def seed_plus_position(engine):
    become(engine, SeedPlusPosition)
    with_drafters(engine, KeyedDraw, attrs={"engine": engine})


class StaleDraftSeed(Engine):
    """The draft sampler is cached across requests and rebuilt only when the
    sampling controls change; a new seed alone keeps the key it was built
    with. A request repeated back to back repeats; after another request
    with the same controls and another seed it drafts with that seed."""

    cached: tuple | None = None  # (controls without the seed, draft seed)

    def admit(self, req, observer=None, constraint=None):
        st = super().admit(req, observer, constraint)
        controls = req.sampling.model_copy(update={"seed": None})
        if self.cached is None or self.cached[0] != controls:
            self.cached = (controls, st.seed)
        if st.drafter is not None:
            st.drafter.draft_seed = self.cached[1]
        return st


def stale_draft_seed(engine):
    become(engine, StaleDraftSeed)
    with_drafters(engine, KeyedDraw, attrs={"engine": engine})


class DraftReusesTargetStream(Engine):
    """Draft proposals use the target's uniform of their position: under
    exact-match acceptance the output is unchanged, and a drafter close to
    the target agrees with the target's draw far too often."""

    def uniform(self, seed, stream, position):
        return super().uniform(seed, STREAM_TARGET if stream == STREAM_DRAFT else stream, position)


def draft_stream_is_target_stream(engine):
    become(engine, DraftReusesTargetStream)
    with_drafters(engine, KeyedDraw, attrs={"engine": engine})


class AcceptanceReusesDraftUniform(Engine):
    """The rejection rule's acceptance uniform is the draft's own uniform of
    that position: a proposal's place in the draft cdf decides its fate, so
    low-id proposals pass and high-id ones fail; in rank order the output law
    stays close to p."""

    def uniform(self, seed, stream, position):
        return super().uniform(seed, STREAM_DRAFT if stream == STREAM_ACCEPT else stream, position)


def acceptance_reuses_draft_uniform(engine):
    become(engine, AcceptanceReusesDraftUniform)
    with_drafters(engine, KeyedDraw, attrs={"engine": engine})


class CorrectionReusesAcceptUniform(Engine):
    """The correction is drawn with the acceptance uniform that rejected the
    proposal (one uniform per position instead of two): given a rejection it
    lies above min(1, p/q), so corrections lean to the high end of the cdf."""

    def uniform(self, seed, stream, position):
        return super().uniform(seed, STREAM_TARGET if stream == STREAM_ACCEPT else stream, position)


def correction_reuses_accept_uniform(engine):
    become(engine, CorrectionReusesAcceptUniform)


def _children_seeded(backend, rule):
    """generate_n with child seeds from `rule(seed, index)` instead of the reference's hash."""

    def generate_n(request, n):
        sp = request.sampling
        return backend.generate_batch([request.model_copy(update={"sampling": sp.model_copy(
            update={"seed": rule(sp.seed, i)})}) for i in range(n)])

    backend.generate_n = generate_n


def samples_share_the_parent_seed(backend):
    """n > 1: every sample runs under the request's own seed: n copies."""
    _children_seeded(backend, lambda seed, i: seed)


def samples_seed_plus_index(backend):
    """n > 1: sample i runs under seed + i (vLLM 0.32's rule): requests under
    neighbouring seeds share all but one of their samples."""
    _children_seeded(backend, lambda seed, i: seed + i)


# -- B09 event state not transactional ----------------------------------------------------


class EventsAtDraftTime(Engine):
    """A token event is published for every proposal when it is drafted
    (before verification), and again for each token when it is committed: the
    caller sees rejected proposals; the final tokens and text stay right."""

    def propose(self, st):
        super().propose(st)
        base = len(st.out.tokens)
        st.out.events += [TokenEvent(index=base + j, token=t) for j, t in enumerate(st.inflight.block.tokens)]


def events_at_draft_time(engine):
    become(engine, EventsAtDraftTime)


def stream_publishes_proposals(backend):
    """generate_stream shows each block's proposals as they are drafted, then
    the round's next token (a correction or the bonus): rejected proposals
    reach the streaming caller, while generate() is right."""
    engine = backend.engine

    def generate_stream(request):
        st = engine.start(request)
        yield StreamChunk(tokens=list(st.out.tokens), finish_reason=st.out.finish_reason if st.done else None)
        while not st.done:
            engine.propose(st)
            shown = list(st.inflight.block.tokens)
            if shown:
                yield StreamChunk(tokens=shown)
            before = len(st.out.tokens)
            engine.verify(st)
            committed = st.out.tokens[before:]
            accepted = 0
            while accepted < min(len(shown), len(committed)) and shown[accepted] == committed[accepted]:
                accepted += 1
            yield StreamChunk(tokens=committed[accepted:], finish_reason=st.out.finish_reason if st.done else None)

    backend.generate_stream = generate_stream


def stream_text_newest_token_only(backend):
    """The stream's incremental detokenizer is fed each chunk's newest token
    only: a chunk that carries a block has the last token's text, the
    block's earlier tokens are missing from the streamed text. Tokens, finish
    reasons and generate() are right."""
    generate_stream = backend.generate_stream

    def newest_only(request):
        for c in generate_stream(request):
            if len(c.tokens) > 1 and c.text:
                c = c.model_copy(update={"text": backend.decode(c.tokens[-1:])})
            yield c

    backend.generate_stream = newest_only


def _on_abandon(backend, left_behind):
    """generate_stream as the reference's, but a stream its caller closes
    part-way (a client gone away) calls left_behind(request, state)."""
    from mtpcheck.engine.events import stream_chunks

    engine = backend.engine

    def generate_stream(request):
        st = engine.start(request, constraint=backend.output_constraint(request))
        try:
            yield from stream_chunks(st, lambda: engine.step(st))
        except GeneratorExit:
            left_behind(request, st)
            raise

    backend.generate_stream = generate_stream


def abandoned_sampler_reused(backend):
    """A slot whose client went away keeps its sampler: the next request
    served there, if sampled, draws from the abandoned request's seed, not its
    own. Requests streamed or served to the end are exact."""
    left: list = []
    generate = backend.generate
    _on_abandon(backend, lambda request, st: left.__setitem__(slice(None), [request.sampling.seed]))

    def generate_reusing(request):
        sp, seed = request.sampling, left.pop() if left else None
        if seed is not None and sp.temperature > 0 and sp.seed is not None:
            request = request.model_copy(update={"sampling": sp.model_copy(update={"seed": seed})})
        return generate(request)

    backend.generate = generate_reusing


def abandoned_rounds_counted(backend):
    """A slot whose client went away is not reset: its rounds stay in the
    slot's counters and the next request's report includes them."""
    left: list = []
    generate = backend.generate
    _on_abandon(backend, lambda request, st: left.append(backend.engine.report(st)))

    def generate_counting(request):
        res = generate(request)
        if not left or not res.speculation.used:
            return res
        s, old = res.speculation, left.pop()
        acc, dr = old.accept_lens + s.accept_lens, old.draft_lens + s.draft_lens
        return res.model_copy(update={"speculation": s.model_copy(update={
            "rounds": len(acc), "accept_lens": acc, "draft_lens": dr, "accepted": sum(acc), "drafted": sum(dr),
            "acceptance_rate": sum(acc) / sum(dr) if sum(dr) else None})})

    backend.generate = generate_counting


# -- B13 lossy acceptance knobs ---------------------------------------------------------------


def lenient_acceptance(engine, lam: float = 0.5):
    """Accept with min(1, p / (lam q)), lam < 1: a 'relaxed' acceptance threshold."""

    def accept(p, q, d):
        return 1.0 if p[d] >= lam * q[d] else float(p[d] / (lam * q[d]))

    with_rule(engine, rejection_verify(accept, rejection_correction), accept=accept)


def typical_acceptance(engine, epsilon: float = 0.09, delta: float = 0.3):
    """Medusa's typical acceptance: accept d when p(d) > min(epsilon, delta exp(-H(p)));
    on rejection the target's own sample (d excluded)."""

    def accept(p, q, d):
        nz = p[p > 0]
        h = float(-(nz * np.log(nz)).sum())
        return 1.0 if p[d] > min(epsilon, delta * math.exp(-h)) else 0.0

    with_rule(engine, rejection_verify(accept, exact_match_correction), accept=accept, correction=exact_match_correction)


def confident_draft_accepted(engine, tau: float = 0.25):
    """A proposal the draft is confident about (q(d) >= tau) is accepted without
    consulting the target."""

    def accept(p, q, d):
        return 1.0 if q[d] >= tau else rejection_accept_probability(p, q, d)

    with_rule(engine, rejection_verify(accept, rejection_correction), accept=accept)


# -- B14 logprobs wrong under speculation ----------------------------------------------------


class DraftLogprobs(Engine):
    """Accepted proposals report the draft's logprob."""

    def logprobs(self, rnd):
        lps, emitted = super().logprobs(rnd), rnd.emitted
        for j in range(len(emitted) - 1):
            q = rnd.block.probs[j][emitted[j]]
            lps[j] = math.log(q) if q > 0 else -math.inf
        return lps


class ZeroLogprobs(Engine):
    """Accepted proposals report logprob 0."""

    def logprobs(self, rnd):
        lps = super().logprobs(rnd)
        return [0.0] * (len(lps) - 1) + lps[-1:]


def draft_logprobs(engine):
    become(engine, DraftLogprobs)


def zero_logprobs(engine):
    become(engine, ZeroLogprobs)


# -- B15 lookahead promoted after partial acceptance ---------------------------------------


class PromotesAfterPartialAcceptance(Engine):
    """Keeps a branch whose first token equals the next token, even when that
    token is a correction after a rejection."""

    def branch_outcome(self, st, block, verdict, branch):
        if not st.done and verdict.next_token == branch.tokens[0]:
            return "promoted"
        return super().branch_outcome(st, block, verdict, branch)


def promotes_after_partial_acceptance(engine):
    become(engine, PromotesAfterPartialAcceptance)


# -- B16 silent fallback ----------------------------------------------------------------------


class IgnoresRequireAcceleration(Engine):
    """require_acceleration is not honoured: the request runs unaccelerated."""

    def plan(self, req):
        spec = req.speculation
        if spec is not None and spec.require_acceleration:
            req = req.model_copy(update={"speculation": spec.model_copy(update={"require_acceleration": False})})
        return super().plan(req)


def _without_penalties(sp: SamplingParams) -> SamplingParams:
    return sp.model_copy(update=dict.fromkeys(PENALTIES))


class DropsPenalties(Engine):
    """Speculation goes ahead with penalties and logit bias, and the speculative
    sampler is built without them."""

    def plan(self, req):
        return super().plan(req.model_copy(update={"sampling": _without_penalties(req.sampling)}))

    def admit(self, req, observer=None, constraint=None):
        st = super().admit(req, observer, constraint)
        if st.plan.used:
            st.req = req.model_copy(update={"sampling": _without_penalties(req.sampling)})
        return st


class FallbackReportedAsUsed(Engine):
    """The drafter silently fails to start: target-only decoding, reported as speculative."""

    def plan(self, req):
        p = super().plan(req)
        return Plan(True, False, p.mode, p.depth, p.drafter) if p.used else p

    def report(self, st):
        r = super().report(st)
        if not r.requested or r.reason is not None:
            return r
        return r.model_copy(update={"used": True, "num_draft_tokens": st.plan.depth, "draft_kind": st.plan.drafter})


class UnreportedFallback(Engine):
    """The drafter silently fails to start: target-only decoding, no reason given."""

    def plan(self, req):
        p = super().plan(req)
        return Plan(True, False, p.mode, p.depth, p.drafter) if p.used else p


class OffBlockIgnored(Engine):
    """speculation=off is read as 'the loaded default'."""

    def plan(self, req):
        if req.speculation is not None and req.speculation.mode == "off":
            req = req.model_copy(update={"speculation": None})
        return super().plan(req)


class StickyOverride(Engine):
    """A per-call depth becomes the runtime's default."""

    def plan(self, req):
        p = super().plan(req)
        spec = req.speculation
        if spec is not None and spec.mode != "off" and spec.num_draft_tokens:
            self.default_speculation = self.default_speculation.model_copy(update={"num_draft_tokens": spec.num_draft_tokens})
        return p


HISTORY_PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")


class PenaltyHistoryWithoutPrompt(Engine):
    """Speculates with penalties and logit bias, honouring them as the engine
    can (every verified row is processed at its own history: exact at any
    depth), but on the paths named in `drops` the penalty history starts after
    the prompt: only the output so far is penalised. mlx-lm 0.32.2's
    speculative step (docs/backends/mlx-lm.md, L1), 0.31.1's plain one, and
    0.31.2's both. The logit bias needs no history and stays right."""

    drops: tuple[str, ...] = ("speculative", "plain")
    penalty_from = 0  # history index the penalties start at in the round being verified

    def plan(self, req):  # penalties and logit bias no longer block speculation
        return super().plan(req.model_copy(update={"sampling": _without_penalties(req.sampling)}))

    def _drops(self, st) -> bool:
        return ("speculative" if st.plan.used else "plain") in self.drops

    def prefill(self, st):
        if not self._drops(st):
            return super().prefill(st)
        # no output yet: a history without the prompt is empty, and the penalties act on nothing
        real = st.req
        st.req = real.model_copy(update={"sampling": real.sampling.model_copy(update=dict.fromkeys(HISTORY_PENALTIES))})
        try:
            super().prefill(st)
        finally:
            st.req = real

    def verify(self, st):
        self.penalty_from = len(st.req.prompt_tokens) if self._drops(st) else 0
        super().verify(st)

    def target_pass(self, history, cache, block, sp, cursor):
        # history[-1] (the pending token, the verify pass's first input) is output, never prompt
        return super().target_pass(history[self.penalty_from :], cache, block, sp, cursor)


def penalty_history_without_prompt(backend, drops: tuple[str, ...] = ("speculative", "plain")):
    """The engine speculates with penalties and logit bias and the backend
    declares them honoured (speculative_sampling_controls); `drops` names the
    paths whose penalty history leaves out the prompt (() : none, the honest
    engine that speculates with penalties)."""
    become(backend.engine, PenaltyHistoryWithoutPrompt)
    backend.engine.drops = tuple(drops)
    declared = backend.capabilities

    def capabilities():
        caps = declared()
        return caps.model_copy(update={"speculative_sampling_controls": [*caps.speculative_sampling_controls,
                                                                         *PENALTIES]})

    backend.capabilities = capabilities


def ignores_require_acceleration(engine):
    become(engine, IgnoresRequireAcceleration)


def drops_penalties(engine):
    become(engine, DropsPenalties)


def fallback_reported_as_used(engine):
    become(engine, FallbackReportedAsUsed)


def unreported_fallback(engine):
    become(engine, UnreportedFallback)


def off_block_ignored(engine):
    become(engine, OffBlockIgnored)


def sticky_override(engine):
    become(engine, StickyOverride)


# -- B17 acceptance collapse --------------------------------------------------------------------


class GivesUpAfterTwoRounds:
    """Drafting silently stops after the second round (a drafter error swallowed):
    empty blocks, target-only tokens, the report still says speculation was used."""

    drafts = 0

    def draft(self, history, target_len, k, sp, seed, cursor=FREE):
        self.drafts += 1
        if self.drafts > 2:
            return DraftBlock.empty(target_len + 1, self.model.args.vocab_size)
        return super().draft(history, target_len, k, sp, seed, cursor)


def drafter_silently_disabled(engine):
    with_drafters(engine, GivesUpAfterTwoRounds)


def _rejects_every_proposal(ps, qs, proposals, au, tu):
    """Every proposal rejected; the token drawn from the target's own law with
    its own uniform: exactly plain decoding, reported as speculation."""
    return Verdict(0, sample(ps[0], tu[0]), "correction", ps[0])


def accepts_nothing(engine):
    """Speculation dead after a swallowed error (OpenVINO GenAI's draft model under
    prefix caching): rounds drafted and verified, every proposal rejected, output lossless."""
    with_rule(engine, _rejects_every_proposal)


class HiddenOneRowLate:
    """After verification the MTP head keeps the target hidden states one row
    late: position i gets the state of input i+1 (after a rejection, the
    rejected proposal's). The prefill hand-off is right."""

    def after_verify(self, target_len_before, target_len_after, hidden):
        trim_cache(self.cache, min(self.length, target_len_before))
        n = target_len_after - target_len_before
        rows = hidden[1 : n + 1]
        if rows.shape[0] < n:
            rows = mx.concatenate([rows, hidden[-1:]])
        self.observe(target_len_before, rows)


def stale_hidden_state(engine):
    with_drafters(engine, HiddenOneRowLate, only=(MtpDrafter,))


# -- no bug class: scheduling policy ---------------------------------------------------------


def starving_scheduler(backend):
    """The scheduler always serves the lowest runnable request id."""
    from mtpcheck.engine.scheduler import Scheduler, SchedulerOptions

    class LowestIdFirst(Scheduler):
        def step(self):
            ready = self.runnable()
            if not ready:
                return None
            rid = min(ready)
            self.advance(rid, self.options.lookahead)
            return rid

    def open_scheduler(lookahead: bool = True, adaptive_after: int | None = 8):
        return LowestIdFirst(backend.engine, SchedulerOptions(lookahead=lookahead, adaptive_after=adaptive_after))

    backend.open_scheduler = open_scheduler


# -- the whole rule of a black-box clause -------------------------------------------------------


class BudgetOneShort(Engine):
    """B11: the budget check is off by one: a request ends one token before
    max_tokens and reports finish_reason 'length' (statistics agree with the
    tokens it did emit)."""

    def admit(self, req, observer=None, constraint=None):
        st = super().admit(req, observer, constraint)
        if req.max_tokens > 1:
            st.req = st.req.model_copy(update={"max_tokens": req.max_tokens - 1})
        return st


def budget_one_short(engine):
    become(engine, BudgetOneShort)


class PreviousSeedMixed(Engine):
    """B12: the target's random key mixes in the previous seeded request's
    seed (a per-runtime generator re-seeded lazily): a request repeated back
    to back repeats, the same request after another one does not."""

    previous_seed: int | None = None

    def admit(self, req, observer=None, constraint=None):
        st = super().admit(req, observer, constraint)
        if req.sampling.seed is not None:
            prev, self.previous_seed = self.previous_seed, req.sampling.seed
            if prev is not None and prev != req.sampling.seed:
                st.seed = (st.seed * 1_000_003 + prev) % (1 << 63)
        return st


def previous_seed_mixed(engine):
    become(engine, PreviousSeedMixed)


class PublishesAfterStopInBlock(Engine):
    """B10: a round's block is published (token events, the stream) before the
    stop rule cuts it: a stop token accepted inside a block ends the result's
    tokens right, but the block's later tokens were already published."""

    def commit(self, st, emitted, logprobs):
        c = super().commit(st, emitted, logprobs)
        out = st.out
        if out.finish_reason == "stop" and c < len(emitted) and out.tokens[-1] in st.matcher.eos:
            at = next(i for i, e in enumerate(out.events) if isinstance(e, StopEvent))
            extra = [TokenEvent(index=len(out.tokens) + i, token=t, logprob=lp)
                     for i, (t, lp) in enumerate(zip(emitted[c:], logprobs[c:], strict=True))]
            out.events[at:at] = extra
        return c


def publishes_after_stop_in_block(engine):
    become(engine, PublishesAfterStopInBlock)


class ModelEosCheckedAtRoundEnd(Engine):
    """B10: the model's own EOS (a request without stop_token_ids) is checked
    on each round's last token only; stop_token_ids a request names are checked
    on every token. An EOS accepted inside a block is emitted with the rest of
    the block after it, and decoding goes on."""

    def commit(self, st, emitted, logprobs):
        m = st.matcher
        if st.req.stop_token_ids is not None or len(emitted) < 2:
            return super().commit(st, emitted, logprobs)
        eos, m.eos = m.eos, set()
        try:
            c = super().commit(st, emitted[:-1], logprobs[:-1])
        finally:
            m.eos = eos
        if st.out.finish_reason or c < len(emitted) - 1:
            return c
        return c + super().commit(st, emitted[-1:], logprobs[-1:])


def model_eos_checked_at_round_end(engine):
    become(engine, ModelEosCheckedAtRoundEnd)


def batch_slot_counters_carried(backend):
    """B11: a batch slot is not reset between requests: each result of
    generate_batch after the first reports the previous request's rounds
    before its own. Tokens are exact; generate() is exact."""
    generate_batch = backend.generate_batch

    def carried(requests):
        results = generate_batch(requests)
        out = results[:1]
        for prev, res in zip(results, results[1:], strict=False):
            s, old = res.speculation, prev.speculation
            if s.used and old.used:
                acc, dr = old.accept_lens + s.accept_lens, old.draft_lens + s.draft_lens
                s = s.model_copy(update={"rounds": len(acc), "accept_lens": acc, "draft_lens": dr,
                                         "accepted": sum(acc), "drafted": sum(dr),
                                         "acceptance_rate": sum(acc) / sum(dr) if sum(dr) else None})
            out.append(res.model_copy(update={"speculation": s}))
        return out

    backend.generate_batch = carried


def unseeded_batch_shares_randomness(backend):
    """B12: the unseeded requests of one call (generate_batch, or generate_n
    without a seed) all run under one seed drawn for the call, as a runtime
    that seeds a batch's generator once and hands its rows that seed: copies
    of each other, each exact alone; seeded requests are unchanged."""
    batch, samples = backend.generate_batch, backend.generate_n

    def generate_batch(requests):
        common = random.SystemRandom().getrandbits(56)
        return batch([r if r.sampling.seed is not None else
                      r.model_copy(update={"sampling": r.sampling.model_copy(update={"seed": common})})
                      for r in requests])

    def generate_n(request, n):
        return samples(request, n) if request.sampling.seed is not None else generate_batch([request] * n)

    backend.generate_batch, backend.generate_n = generate_batch, generate_n
