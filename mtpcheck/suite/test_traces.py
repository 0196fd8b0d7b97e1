"""White-box clauses: re-derive every round of a trace."""

import pytest

from mtpcheck.machinery.checks import (
    accept_problems,
    bonus_uncached_problems,
    residual_bonus_problems,
    rollback_problems,
)
from mtpcheck.machinery.configs import DIST_CONFIGS, request, seeded, spec_for


@pytest.fixture(scope="module")
def _traced(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed):
    """(request, result, ground truth) over configs, depths and prompts."""
    out = []
    prompts = list(mtp_fixture.values())
    configs = list(DIST_CONFIGS.values())
    for r in range(mtp_profile.trace_runs * 2):
        sp = seeded(configs[r % len(configs)], mtp_seed + r)
        depth = 1 + r % min(5, mtp_capabilities.max_depth)
        req = request(prompts[r % len(prompts)], 40, sp, spec_for(mtp_capabilities, depth), trace=True)
        res = mtp_backend.generate(req)
        truth = mtp_backend.target_distributions(req.prompt_tokens, res.tokens, sp) if mtp_capabilities.target_distributions else None
        out.append((req, res, truth))
    return out


@pytest.fixture
def traced(_traced, mtp_backend):
    """The module's traced sample, counted as each test's own exercise."""
    mtp_backend.note(*((req, res) for req, res, _ in _traced))
    return _traced


def _check(traced, problems_of):
    """Fail with the first problems `problems_of(req, res, truth)` finds in the sample."""
    problems, rounds = [], 0
    for req, res, truth in traced:
        if res.trace is None:
            pytest.fail("the backend declares traces but returned none for trace=True")
        rounds += len(res.trace)
        problems += [f"seed {req.sampling.seed}: {p}" for p in problems_of(req, res, truth)]
    assert rounds > 0, "no speculative rounds were traced"
    assert not problems, f"{len(problems)} problems, first: {problems[:3]}"


@pytest.mark.contract("TRACE-ACCEPT")
def test_acceptance_decisions_rederive(traced, mtp_capabilities):
    rule = mtp_capabilities.acceptance_rule
    _check(traced, lambda req, res, truth: accept_problems(res, req, rule, truth))


@pytest.mark.contract("TRACE-RESIDUAL-BONUS")
def test_corrections_and_bonus_from_the_right_laws(traced, mtp_capabilities):
    rule = mtp_capabilities.acceptance_rule
    _check(traced, lambda req, res, truth: residual_bonus_problems(res, rule))


@pytest.mark.contract("TRACE-ROLLBACK")
def test_rollback_to_the_committed_prefix(traced, mtp_capabilities):
    rule = mtp_capabilities.acceptance_rule
    _check(traced, lambda req, res, truth: rollback_problems(res, req, rule))


@pytest.mark.contract("BONUS-UNCACHED")
def test_bonus_is_uncached_and_leads_the_next_round(traced, mtp_capabilities):
    rule = mtp_capabilities.acceptance_rule
    _check(traced, lambda req, res, truth: bonus_uncached_problems(res, rule))
    bonuses = sum(t.next_kind == "bonus" for _, res, _ in traced for t in res.trace)
    assert bonuses > 0, "no fully accepted block in the sample: the bonus rule was not exercised"
