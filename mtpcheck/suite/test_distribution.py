"""Distribution equivalence at temperature > 0, against target_distributions."""

import numpy as np
import pytest

from mtpcheck.checks import logprob_problems, observations
from mtpcheck.laws.stats import (
    SUITE_ALPHA,
    pit_ks,
    rank_gtest,
    truncated_pit_ks,
    truncated_rank_gtest,
    truncated_zero_probability_violations,
    zero_probability_violations,
)

from ._util import DIST_CONFIGS, STAT_SUBTESTS, request, seeded, spec_for

ALPHA = SUITE_ALPHA / STAT_SUBTESTS


@pytest.fixture(scope="module")
def samples(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed):
    """config -> list of (prompt, result); one shared sample per config, so the
    three clauses below judge the same tokens."""
    cache = {}

    def get(config):
        if config not in cache:
            prompts = list(mtp_fixture.values())
            runs = []
            for r in range(mtp_profile.dist_runs):
                prompt = prompts[r % len(prompts)]
                sp = seeded(DIST_CONFIGS[config], mtp_seed * 1000 + r)
                runs.append((prompt, mtp_backend.generate(request(prompt, mtp_profile.dist_tokens, sp, spec_for(mtp_capabilities)))))
            cache[config] = runs
        return cache[config]

    return get


def _obs(backend, config, runs):
    sp = DIST_CONFIGS[config]
    return [o for prompt, res in runs for o in observations(backend, prompt, [res], sp)]


@pytest.mark.contract("DIST-ZERO")
@pytest.mark.parametrize("config", list(DIST_CONFIGS))
def test_no_token_outside_the_target_support(mtp_backend, mtp_capabilities, samples, config):
    obs = _obs(mtp_backend, config, samples(config))
    n = mtp_capabilities.truncated_laws  # top-N laws: only provable zeros count
    bad = truncated_zero_probability_violations(obs, n) if n else zero_probability_violations(obs)
    assert not bad, f"{len(bad)} of {len(obs)} emitted tokens have target probability 0 (first at observation {bad[0]})"


@pytest.mark.contract("DIST-EQUIV")
@pytest.mark.parametrize("config", list(DIST_CONFIGS))
def test_emitted_tokens_follow_the_target_law(mtp_backend, mtp_capabilities, samples, mtp_record, mtp_seed, config):
    runs = samples(config)
    used = sum(res.speculation.used for _, res in runs)
    if not used:
        pytest.skip("speculation was not used for this configuration (see REPORT-HONEST)")
    obs = _obs(mtp_backend, config, runs)
    n = mtp_capabilities.truncated_laws  # top-N laws: ranks beyond N pool into one bin
    g = truncated_rank_gtest(obs, n, alpha=ALPHA) if n else rank_gtest(obs, alpha=ALPHA)
    ks = truncated_pit_ks(obs, n, rng_seed=mtp_seed, alpha=ALPHA) if n else pit_ks(obs, rng_seed=mtp_seed, alpha=ALPHA)
    accepted = sum(res.speculation.accepted for _, res in runs)
    mtp_record(config=config, gtest=g.model_dump(), pit_ks=ks.model_dump(), accepted_proposals=accepted)
    assert g.passed, f"rank G-test rejects the target law: {g.note or ''} p={g.p_value:.3g} < alpha={ALPHA:.2g} (n={g.n}, detectable TV {g.detectable_tv})"
    assert ks.passed, f"randomized PIT KS rejects uniformity: p={ks.p_value:.3g} < alpha={ALPHA:.2g} (n={ks.n})"


@pytest.mark.contract("LOGPROBS")
def test_logprobs_are_the_targets(mtp_backend, samples):
    config = "top_k"
    problems = []
    for prompt, res in samples(config)[:10]:
        laws = mtp_backend.target_distributions(prompt, res.tokens, DIST_CONFIGS[config])
        problems += logprob_problems(res, np.asarray(laws))
    assert not problems, problems[:5]
