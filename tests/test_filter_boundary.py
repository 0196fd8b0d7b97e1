"""A float flip of a filter decision (docs/statistics.md, 'Known false
failure'): a token that one pass keeps and the ground truth drops by a
relative 1e-6 is excused under the precision rule's filter margin (float32
on the reference), and only then; a token far outside the filters is still
a failure."""

import math

import numpy as np
import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.precision import precision
from mtpcheck.laws.stats import filter_margin, zero_probability_violations
from mtpcheck.machinery.checks import observations


def test_margin_is_zero_for_a_kept_token_and_relative_for_a_dropped_one():
    raw = np.array([0.5, 0.3, 0.15, 0.05])
    assert filter_margin(raw, 1, SamplingParams(temperature=1.0, top_k=2)) == 0.0
    assert filter_margin(raw, 2, SamplingParams(temperature=1.0, top_k=2)) == pytest.approx(0.5)  # 0.15 vs 0.3
    # min-p: threshold 0.1 * 0.5 = 0.05 keeps token 3; 0.1000001 drops it by a relative 1e-6
    assert filter_margin(raw, 3, SamplingParams(temperature=1.0, min_p=0.1)) == 0.0
    assert filter_margin(raw, 3, SamplingParams(temperature=1.0, min_p=0.1000001)) == pytest.approx(1e-6, rel=1e-3)
    # top-p: the crossing token is kept (0.5 + 0.3 reach 0.8); token 2 has 0.8 above it
    assert filter_margin(raw, 1, SamplingParams(temperature=1.0, top_p=0.8)) == 0.0
    assert filter_margin(raw, 2, SamplingParams(temperature=1.0, top_p=0.79)) == pytest.approx(0.01 / 0.79)
    assert filter_margin(np.array([1.0, 0.0]), 1, SamplingParams(temperature=1.0, top_k=1)) == math.inf


class _Backend:
    """Ground truth whose min-p drops token 3 (ratio 0.0999999 of the max at
    threshold 0.1); the raw law is the same without the filter."""

    raw = np.array([0.5, 0.3, 0.15, 0.0499999, 0.0000001])

    def target_distributions(self, prompt, tokens, sp):
        law = self.raw / self.raw.sum()
        if sp.min_p:
            law = np.where(law >= sp.min_p * law.max(), law, 0.0)
            law /= law.sum()
        return np.stack([law] * len(tokens))


def _res(tokens):
    from types import SimpleNamespace

    return SimpleNamespace(tokens=tokens)


def test_a_boundary_flip_is_excused_only_under_a_declared_tolerance():
    sp = SamplingParams(temperature=1.0, min_p=0.1)
    be, res = _Backend(), _res([0, 3, 1])
    exact = observations(be, [9], [res], sp)
    assert zero_probability_violations(exact) == [1]  # default: exact, nothing excused
    excused = []
    obs = observations(be, [9], [res], sp, 1e-5, excused)
    assert len(obs) == 2 and not zero_probability_violations(obs)
    assert excused[0]["position"] == 1 and excused[0]["token"] == 3 and excused[0]["margin"] < 1e-5
    far = observations(be, [9], [_res([0, 4])], sp, 1e-5, [])  # token 4: far below the threshold
    assert zero_probability_violations(far) == [1]


def test_the_calibration_failure_on_the_reference_is_a_boundary_flip():
    """The calibration's failing run (exact_match, min-p, --mtp-seed 36,
    generation 37): token 449 at position 12, 1.5e-6 below min-p."""
    from mtpcheck.backends import load_backend
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery.configs import DIST_CONFIGS, request, seeded, spec_for

    be = load_backend("mlx", {"acceptance": "exact_match"})
    caps = be.capabilities()
    prompts = list(fixture_prompts(be).values())
    prompt = prompts[37 % len(prompts)]
    sp = DIST_CONFIGS["min_p"]
    res = be.generate(request(prompt, 48, seeded(sp, 36 * 1000 + 37), spec_for(caps)))
    assert zero_probability_violations(observations(be, prompt, [res], sp)) == [12]
    excused = []
    obs = observations(be, prompt, [res], sp, precision(caps).filter_margin, excused)
    assert not zero_probability_violations(obs)
    assert [(e["position"], e["token"]) for e in excused] == [(12, 449)] and 1e-7 < excused[0]["margin"] < 1e-5
