"""The checks' messages name the mechanism: a wrong round is reported in that
round only (the committed offset moves past it), a target law that goes wrong
only after a rejection points to state the rollback did not restore, and a
constraint failure after an earlier wrong token says it is a knock-on."""

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.machinery import checks as C


def _all_trace_problems(res, req, truth, rule="rejection"):
    """Every trace clause's problems, one list."""
    return (C.accept_problems(res, req, rule, truth) + C.residual_bonus_problems(res, rule)
            + C.rollback_problems(res, req, rule) + C.bonus_uncached_problems(res, rule))


@pytest.fixture(scope="module")
def toy():
    from mtpcheck.backends.toy import load_toy

    return load_toy()


def _traced(backend, seed=3, n=40):
    req = GenerationRequest(prompt_tokens=[1, 2, 3, 4, 5], max_tokens=n, speculation={"num_draft_tokens": 3}, stop_token_ids=[],
                            sampling=SamplingParams(temperature=1.0, seed=seed), trace=True)
    res = backend.generate(req)
    truth = backend.target_distributions(req.prompt_tokens, res.tokens, req.sampling)
    return req, res, truth


def test_a_wrong_accepted_count_is_reported_in_its_round_only(toy):
    req, res, truth = _traced(toy)
    assert not _all_trace_problems(res, req, truth)
    r = next(i for i, t in enumerate(res.trace) if 0 < i < len(res.trace) - 2)
    bad = res.model_copy(deep=True)
    bad.trace[r].accepted = (bad.trace[r].accepted + 1) % (len(bad.trace[r].proposals) + 1)
    flat = _all_trace_problems(bad, req, truth)
    assert flat, "the wrong accepted count went unnoticed"
    assert all(p.startswith(f"round {r}:") for p in flat), flat  # later rounds keep their offset


def test_wrong_trace_shapes_do_not_shift_later_rounds(toy):
    req, res, truth = _traced(toy, seed=5)
    bad = res.model_copy(deep=True)
    bad.trace[1].target_uniforms = bad.trace[1].target_uniforms[:-1]
    flat = _all_trace_problems(bad, req, truth)
    assert flat and all(p.startswith("round 1:") for p in flat), flat


def test_state_not_restored_is_named_not_processing():
    from mtpcheck.mutants import load_mutant

    backend = load_mutant("recurrent-state-not-restored")
    found = []
    for seed in range(4):
        req, res, truth = _traced(backend, seed=seed)
        found += C.accept_problems(res, req, "rejection", truth)
    laws = [p for p in found if "teacher-forced" in p]
    assert laws, found
    assert all("state not restored after round" in p for p in laws), laws[:3]
    assert not any("one-sided" in p for p in laws)


def test_one_sided_processing_is_still_named_so():
    from mtpcheck.mutants import load_mutant

    backend = load_mutant("one-sided-temperature")
    req = GenerationRequest(prompt_tokens=[1, 2, 3, 4, 5], max_tokens=24, speculation={"num_draft_tokens": 3},
                            sampling=SamplingParams(temperature=1.5, seed=1), trace=True)
    res = backend.generate(req)
    truth = backend.target_distributions(req.prompt_tokens, res.tokens, req.sampling)
    laws = [p for p in C.accept_problems(res, req, "rejection", truth) if "teacher-forced" in p]
    assert laws and all("one-sided processing" in p for p in laws), laws[:3]


def _report(accept_lens, draft_lens):
    from mtpcheck.contracts import SpeculationReport

    return SpeculationReport(requested=True, used=True, mode="native_mtp", runtime="x", rounds=len(accept_lens),
                             accept_lens=accept_lens, draft_lens=draft_lens, num_draft_tokens=3)


def _result(n, accept_lens, draft_lens):
    from mtpcheck.contracts import GenerationResult

    return GenerationResult(tokens=list(range(n)), text="", finish_reason="length",
                            speculation=_report(accept_lens, draft_lens))


def test_greedy_divergence_right_after_a_rejection_names_the_state():
    from mtpcheck.machinery.checks import divergence_mechanism

    res = _result(1 + 4 + 2 + 4, [3, 1, 3], [3, 3, 3])  # prefill, full round, rejection, then round 2
    assert "state not restored" in divergence_mechanism(res, 7)  # round 2, right after round 1's rejection
    inside = divergence_mechanism(res, 2)  # round 0, an accepted proposal
    assert "accepted proposal" in inside and "state" not in inside
    assert "correction" in divergence_mechanism(res, 6)


def test_constraint_failures_after_a_wrong_token_are_knock_ons():
    from mtpcheck.engine.constraints import TokenDFA
    from mtpcheck.machinery.scheduling import (
        ConstraintStep,
        ScheduledOutcome,
        constraint_emit_problems,
        constraint_rollback_problems,
    )

    dfa = TokenDFA.from_sequences([[1, 2, 3, 4]], vocab=8, end_ids=[0])
    tokens = [1, 2, 5, 4, 0]  # token 2 (5) is the first wrong one
    steps = [ConstraintStep(committed=c, state=0, signature=dfa.signature(dfa.walk(tokens[:c]) if c < 2 else 0))
             for c in (1, 3, 5)]
    out = ScheduledOutcome(request_id=1, cancelled=False, finish_reason="stop", tokens=tokens, text="",
                           speculation=_report([1, 1], [3, 3]), constraint_steps=steps)
    (emit,) = constraint_emit_problems(out, dfa)
    assert "token 2 (5) is the first" in emit and "knock-ons" in emit
    rollback = constraint_rollback_problems(out, dfa)
    assert rollback and all("knock-on of token 2 (5)" in p for p in rollback), rollback
