"""Scheduler, lookahead and constraint clauses, through the optional
scheduling protocol (mtpcheck.machinery.scheduling). Logic lives in mtpcheck.machinery.scheduling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from mtpcheck.contracts import SamplingParams
from mtpcheck.machinery import scheduling as S
from mtpcheck.machinery.configs import request, spec_for

MAX_TOKENS = 16


def _spec(caps, depth=3):
    """Speculation through the external assistant where there is one: lookahead needs it."""
    return spec_for(caps, depth, drafter="assistant") if "assistant" in caps.mtp_kinds else spec_for(caps, depth)


def _requests(caps, prompts, base_seed, n=3, trace=False):
    configs = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=8)]
    return [request(prompts[i % len(prompts)], MAX_TOKENS, configs[i % 3].model_copy(update={"seed": base_seed + i}),
                    _spec(caps, 2 + i % 3), stop_token_ids=[], trace=trace) for i in range(n)]


def _assert_none(problems, what="problems"):
    assert not problems, f"{len(problems)} {what}, first: {problems[:3]}"


@pytest.fixture(scope="module")
def solo(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    """Three requests and their solo runs (plain generate)."""
    reqs = _requests(mtp_capabilities, list(mtp_fixture.values()), mtp_seed)
    return reqs, [mtp_backend.generate(r) for r in reqs]


# -- interleaving ------------------------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["advance"] * 12 + ["drop", "cancel"]), st.integers(0, 2), st.booleans()),
               max_size=80)


@pytest.mark.contract("SCHED-INTERLEAVE")
def test_interleavings_equal_solo_runs(mtp_backend, mtp_capabilities, solo, mtp_profile, mtp_seed):
    reqs, solos = solo

    @hyp_seed(mtp_seed)
    @settings(max_examples=mtp_profile.hypothesis_examples, phases=mtp_profile.hypothesis_phases(),
              deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(ops=OPS, lookahead=st.booleans())
    def check(ops, lookahead):
        session = S.open_session(mtp_backend, lookahead=lookahead, adaptive_after=None)
        ids = [session.submit(r) for r in reqs]
        for kind, i, flag in ops:
            if ids[i] not in session.runnable():
                continue
            if kind == "advance":
                session.advance(ids[i], lookahead=flag)
            elif kind == "drop":
                session.drop_branch(ids[i])
            elif flag:  # cancel: half as often as drop
                session.cancel(ids[i])
        S.run_all(session)
        outs = [session.outcome(i) for i in ids]
        prefill = mtp_capabilities.first_token_from_prefill
        _assert_none([p for o, s in zip(outs, solos, strict=True)
                      for p in S.interleave_problems(o, s) + S.report_problems(o, prefill)])

    check()


@pytest.mark.contract("SCHED-CONCURRENT-SEEDS")
def test_concurrent_seeded_requests_equal_solo_runs(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    prompts = list(mtp_fixture.values())
    sp = SamplingParams(temperature=1.0, top_p=0.95)
    # two requests share each prompt with different seeds: only the seed tells them apart
    reqs = [request(prompts[i // 2], MAX_TOKENS, sp.model_copy(update={"seed": mtp_seed + 101 * i}), _spec(mtp_capabilities),
                    stop_token_ids=[]) for i in range(4)]
    session = S.open_session(mtp_backend)
    ids = [session.submit(r) for r in reqs]
    S.run_all(session)
    problems = []
    for rid, req in zip(ids, reqs, strict=True):
        problems += S.interleave_problems(session.outcome(rid), mtp_backend.generate(req))
    _assert_none(problems)


# -- cancellation and fairness --------------------------------------------------------

# (actions of the cancelled request before cancel(), lookahead) - before prefill, after
# prefill, after a proposal, after a lookahead branch, between rounds
CANCEL_POINTS = [(0, True), (1, True), (2, False), (3, True), (7, False)]


@pytest.mark.contract("SCHED-CANCEL")
@pytest.mark.parametrize("actions, lookahead", CANCEL_POINTS)
def test_cancel_publishes_nothing_after(mtp_backend, mtp_capabilities, solo, actions, lookahead):
    reqs, solos = solo
    session = S.open_session(mtp_backend, lookahead=lookahead)
    delivered = [[] for _ in reqs]
    ids = [session.submit(r, callback=delivered[i].append) for i, r in enumerate(reqs)]
    for _ in range(actions):
        session.advance(ids[0], lookahead=lookahead)
    session.cancel(ids[0])
    at_cancel = len(delivered[0])
    session.step()  # the others go on
    session.cancel(ids[0])  # twice: no effect
    S.run_all(session)
    session.cancel(ids[1])  # after the end: no effect
    outs = [session.outcome(i) for i in ids]
    assert outs[0].cancelled and outs[0].finish_reason is None
    assert not outs[1].cancelled and outs[1].finish_reason is not None
    problems = S.event_problems(outs[0], delivered[0], after_cancel=at_cancel)
    for o, s, d in zip(outs, solos, delivered, strict=True):
        problems += (S.interleave_problems(o, s) + S.report_problems(o, mtp_capabilities.first_token_from_prefill)
                     + S.event_problems(o, d))
    _assert_none(problems)


@pytest.mark.contract("SCHED-FAIR")
def test_fair_action_selection(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    prompts = list(mtp_fixture.values())
    session = S.open_session(mtp_backend)
    served, runnable = [], []
    for i, n in enumerate([4, 12, 8, 12]):
        session.submit(request(prompts[i % len(prompts)], n, SamplingParams(temperature=1.0, seed=mtp_seed + i),
                               _spec(mtp_capabilities), stop_token_ids=[]))
        if i == 1:  # requests also arrive while others run
            for _ in range(5):
                runnable.append(session.runnable())
                served.append(session.step())
    while session.runnable():
        runnable.append(session.runnable())
        served.append(session.step())
    _assert_none(S.fairness_problems(served, runnable))


# -- lookahead ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lookahead_runs(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    """(request, outcome with lookahead, outcome without) over prompts, depths, configs;
    the adaptive rule is off so that every round drafts a branch."""
    prompts = list(mtp_fixture.values())
    reqs = _requests(mtp_capabilities, prompts, mtp_seed + 7, n=6, trace=mtp_capabilities.traces)
    reqs = [r.model_copy(update={"max_tokens": 24}) for r in reqs]
    runs = {}
    for lookahead in (True, False):
        session = S.open_session(mtp_backend, lookahead=lookahead, adaptive_after=None)
        ids = [session.submit(r) for r in reqs]
        S.run_all(session)
        runs[lookahead] = [session.outcome(i) for i in ids]
    return list(zip(reqs, runs[True], runs[False], strict=True))


@pytest.mark.contract("LOOKAHEAD-EQUIV")
def test_lookahead_on_off_identical(lookahead_runs, mtp_record):
    _assert_none([p for _, on, off in lookahead_runs for p in S.equivalence_problems(on, off)])
    drafted = sum(on.speculation.lookahead_drafted for _, on, _ in lookahead_runs)
    mtp_record(lookahead_drafted=drafted)
    assert drafted > 0, "lookahead on, yet no branch was drafted: the clause was not exercised"


@pytest.mark.contract("LOOKAHEAD-PROMOTION")
def test_lookahead_promotion_rechecked_from_traces(lookahead_runs, mtp_record):
    _assert_none([p for req, on, _ in lookahead_runs for p in S.promotion_problems(on, req)])
    outcomes = [r.outcome for _, on, _ in lookahead_runs for r in on.lookahead]
    mtp_record(**{k: outcomes.count(k) for k in set(outcomes)})
    assert outcomes, "no branch to re-check"


@pytest.mark.contract("LOOKAHEAD-PROMOTION")
def test_embedded_heads_draft_no_branch(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    if "embedded" not in mtp_capabilities.mtp_kinds:
        pytest.skip("backend has no embedded MTP head")
    session = S.open_session(mtp_backend, adaptive_after=None)
    req = request(next(iter(mtp_fixture.values())), MAX_TOKENS, SamplingParams(temperature=0.0, seed=mtp_seed),
                  spec_for(mtp_capabilities, 3, drafter="mtp"), stop_token_ids=[], trace=True)
    rid = session.submit(req)
    S.run_all(session)
    out = session.outcome(rid)
    assert not out.lookahead and out.speculation.lookahead_drafted == 0, "the embedded head drafted lookahead branches"


@pytest.mark.contract("LOOKAHEAD-STATS")
@pytest.mark.parametrize("adaptive_after", [None, 2])
def test_optional_work_statistics_agree(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed, lookahead_runs, adaptive_after):
    outs = [on for _, on, _ in lookahead_runs] + [off for _, _, off in lookahead_runs]
    if adaptive_after is not None:
        session = S.open_session(mtp_backend, adaptive_after=adaptive_after)
        reqs = _requests(mtp_capabilities, list(mtp_fixture.values()), mtp_seed + 3, n=4)
        ids = [session.submit(r.model_copy(update={"max_tokens": 32})) for r in reqs]
        S.run_all(session)
        outs = [session.outcome(i) for i in ids]
    _assert_none([p for o in outs for p in S.lookahead_stats_problems(o, adaptive_after)])


# -- constraints -----------------------------------------------------------------------------


def _trie(vocab: int, end: int, seed: int) -> list[list[int]]:
    """Allowed token sequences: three choices at each of the first three
    positions, then a forced tail; no sequence uses the end token."""
    rng = np.random.default_rng(seed)
    ids = np.array([t for t in range(vocab) if t != end])
    seqs = [[]]
    for depth in range(9):
        width = 3 if depth < 3 else 1
        seqs = [s + [int(t)] for s in seqs for t in rng.choice(ids, size=width, replace=False)]
    return seqs


@pytest.fixture(scope="module")
def constrained(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed):
    """(automaton, outcomes) for constrained requests with both drafters, greedy and sampled."""
    caps = mtp_capabilities
    end = caps.eos_token_ids[0] if caps.eos_token_ids else 0
    spec = S.ConstraintSpec(sequences=_trie(caps.vocab_size, end, mtp_seed), end_token_ids=[end])
    dfa = S.compile_spec(spec, caps.vocab_size, [end])
    prompts = list(mtp_fixture.values())
    drafters = [k for k, kind in (("assistant", "assistant"), ("mtp", "embedded")) if kind in caps.mtp_kinds]
    reqs = [request(prompts[i % len(prompts)], 14, SamplingParams(temperature=t, seed=mtp_seed + i),
                    spec_for(caps, 3, drafter=d), stop_token_ids=[end], trace=caps.traces)
            for i, (d, t) in enumerate((d, t) for d in drafters for t in (0.0, 1.0, 1.5))]
    session = S.open_session(mtp_backend)
    ids = [session.submit(r, constraint=spec) for r in reqs]
    S.run_all(session)
    return dfa, [session.outcome(i) for i in ids]


@pytest.mark.contract("CONSTRAINT-EMIT")
def test_no_emitted_token_violates_the_constraint(constrained):
    dfa, outs = constrained
    _assert_none([p for o in outs for p in S.constraint_emit_problems(o, dfa)])
    assert any(o.finish_reason == "stop" for o in outs), "no constrained output reached its end token"


@pytest.mark.contract("CONSTRAINT-MASK")
def test_laws_masked_at_exact_histories(constrained):
    dfa, outs = constrained
    _assert_none([p for o in outs for p in S.constraint_mask_problems(o, dfa)])
    assert any(o.trace for o in outs), "no traced round"


@pytest.mark.contract("CONSTRAINT-ROLLBACK")
def test_constraint_state_follows_committed_tokens(constrained):
    dfa, outs = constrained
    _assert_none([p for o in outs for p in S.constraint_rollback_problems(o, dfa)])
    assert any(o.constraint_steps for o in outs), "the backend reported no constraint states"
