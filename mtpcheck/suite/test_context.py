"""DIST-CONTEXT: at a fixed context, speculative output follows the target law
token by token - a pilot over the fixture prompts, then many short requests
on the prompts where the pilot's statistic stood out (mtpcheck/machinery/contexts.py)."""

import itertools

import pytest

from mtpcheck.laws.precision import precision
from mtpcheck.machinery import contexts as ctx
from mtpcheck.machinery.checks import boundary_flips, sampled_through
from mtpcheck.machinery.configs import (
    CONTEXT_CONFIGS,
    CONTEXT_ESCALATE,
    CONTEXT_PILOT_MIN_EXPECTED,
    CONTEXT_STAGE_ALPHA,
    CONTEXT_TARGETS,
    DIST_CONFIGS,
    SIDE_ALPHA,
    SUSPICIOUS,
    spec_for,
)
from mtpcheck.machinery.report import SIDE_WORDS

# Three stages share the test's registered alpha (union bound; mtpcheck/machinery/configs.py):
# the pilot over every prompt, the targeted sample, and its escalation when the
# targeted p-value is suspicious.


def _seeds(mtp_seed: int, config: str):
    """Distinct seeds below 2**31 (runtimes that keep 32 bits of a seed must
    not see two requests collide), apart from DIST-EQUIV's mtp_seed * 1000 + r."""
    base = (mtp_seed * 7919 + 500_000_000 + CONTEXT_CONFIGS.index(config) * 20_000_000) % (2**31 - 100_000_000)
    counter = itertools.count(base)
    return lambda: next(counter)


@pytest.mark.contract("DIST-CONTEXT")
@pytest.mark.parametrize("config", CONTEXT_CONFIGS)
def test_tokens_follow_the_target_law_at_fixed_contexts(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile,
                                                        mtp_seed, mtp_record, config):
    caps, sp, prof = mtp_capabilities, DIST_CONFIGS[config], mtp_profile
    spec, seeds = spec_for(caps), _seeds(mtp_seed, config)
    excused = []

    def excuse(prompt, prefix, token):
        """A float flip of the filter decision: DIST-ZERO's rule (checks.boundary_flips)."""
        flips = boundary_flips(mtp_backend, prompt, [*prefix, token], [len(prefix)], sp, precision(caps).filter_margin)
        excused.extend({"prefix": list(prefix), "token": token, "margin": m} for m in flips.values())
        return bool(flips)

    out = ctx.staged_test(
        lambda per_prompt: ctx.draw(mtp_backend, caps, mtp_fixture, per_prompt, sp, spec, seeds),
        lambda prompt, cont: mtp_backend.target_distributions(prompt, cont, sp),
        list(mtp_fixture), ctx.lead(caps), prof.context_pilot, prof.context_runs, CONTEXT_STAGE_ALPHA,
        targets=CONTEXT_TARGETS, escalate=CONTEXT_ESCALATE, suspicious=SUSPICIOUS,
        pilot_min_expected=CONTEXT_PILOT_MIN_EXPECTED, excuse=excuse)
    mtp_record(config=config, stages=out.stages, pilot_scores=out.scores, pilot_acceptance=out.acceptance,
               targets=out.targets, sampled_through=sampled_through(caps),
               boundary_flips_excused=excused)
    if not out.used:
        pytest.skip("speculation was not used for this configuration's short requests (see REPORT-HONEST)")
    if out.failed:
        stage, r = out.failed
        plain = ctx.plain_test(lambda per_prompt: ctx.draw(mtp_backend, caps, mtp_fixture, per_prompt, sp, False, seeds),
                               lambda prompt, cont: mtp_backend.target_distributions(prompt, cont, sp),
                               out, ctx.lead(caps), SIDE_ALPHA, excuse=excuse)
        side = "both" if plain.p_value < SIDE_ALPHA else "speculative"
        mtp_record(deviating_side=side, plain=ctx.brief(plain))
        tops = r.details.get("top_contexts") or []
        where = ""
        if tops:
            t = tops[0]
            where = (f"; most deviant context {t['context']}: n={t['n']}, TV {t['tv']}, token {t['most_over']['token']}"
                     f" drawn at rate {t['most_over']['observed']} vs target {t['most_over']['target']}")
        pytest.fail(f"{SIDE_WORDS[side]}: {stage} stage: tokens at fixed contexts do not follow the target law: "
                    f"{r.note}; p={r.p_value:.3g} < alpha={r.alpha:.2g} (G={r.statistic:.1f}, df={r.df}, n={r.n}){where}"
                    f"; speculation off, same requests: p={plain.p_value:.3g} (n={plain.n})", pytrace=False)
    if not out.targets:
        pytest.skip(f"no fixture prompt reached a context with two cells of expected count {CONTEXT_PILOT_MIN_EXPECTED} in "
                    f"{prof.context_pilot} short requests: every first speculative position is (nearly) one-hot")
