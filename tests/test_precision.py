"""One precision rule from the declared logit dtype (mtpcheck.laws.precision),
and DIST-ZERO's count of boundary tokens (stats.boundary_excess).

The rule's figures are checked against the dtypes' spacing by hand; the
count is shown to pass a runtime that keeps every token tied with a filter
boundary (a convention, legitimately) and to fail one that favours the
boundary tokens beyond their mass - the bug a tolerance alone would hide."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mtpcheck.contracts import Capabilities, SamplingParams
from mtpcheck.laws.precision import precision, rule, spacing
from mtpcheck.laws.stats import boundary_excess, boundary_mass, filter_margin, filter_margins

pytest_plugins = ["pytester"]


def test_spacing_is_the_ulp_of_the_largest_binade_below_the_bound():
    assert spacing("float16", 16.0) == 2.0**-7  # values in [8, 16)
    assert spacing("float16", 13.0) == 2.0**-7
    assert spacing("bfloat16", 32.0) == 2.0**-3  # [16, 32): 16 * 2^-7
    assert spacing("float32", 32.0) == 2.0**-19


@pytest.mark.parametrize("dtype, gap", [("float32", 64 * 2.0**-19), ("float16", 4 * 2.0**-6), ("bfloat16", 0.5)])
def test_the_rule_counts_ulps_at_the_declared_scale(dtype, gap):
    p = rule(dtype)
    assert p.logit_gap == pytest.approx(gap)
    assert p.filter_margin == pytest.approx(math.expm1(gap)) and p.cdf == p.filter_margin
    assert p.ulps(p.logit_gap) == pytest.approx({"float32": 64, "float16": 4, "bfloat16": 4}[dtype])
    assert p.logit_gap > 0  # never exact for a float runtime


def test_a_smaller_scale_gives_a_tighter_rule_and_a_hand_value_is_named():
    assert rule("float16", 16.0).logit_gap == pytest.approx(rule("float16", 32.0).logit_gap / 2)
    caps = Capabilities(name="x", version="0", vocab_size=8, logit_dtype="bfloat16", seed_cdf_tolerance=0.0)
    p = precision(caps)
    assert p.cdf == 0.0 and p.logit_gap == pytest.approx(0.5) and p.declared == ("seed_cdf_tolerance=0",)
    assert "declared by hand: seed_cdf_tolerance=0" in p.describe()


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=1.0, top_p=0.8),
                                SamplingParams(temperature=1.0, min_p=0.1),
                                SamplingParams(temperature=1.0, top_k=20, top_p=0.9, min_p=0.05)])
def test_filter_margins_agree_with_the_one_token_form(sp):
    rng = np.random.default_rng(7)
    for _ in range(20):
        raw = rng.dirichlet(np.full(64, 0.3))
        raw = np.round(raw, 3) + 1e-6  # float16-like ties
        raw /= raw.sum()
        m = filter_margins(raw, sp)
        assert np.allclose(m, [filter_margin(raw, t, sp) for t in range(64)], rtol=1e-9, atol=1e-12)


def _tied():
    """A raw law where three tokens tie with the top-p crossing token."""
    raw = np.array([0.5, 0.26, 0.06, 0.06, 0.06, 0.06])
    return raw / raw.sum()


def test_boundary_mass_is_the_share_of_tokens_a_float_runtime_may_keep():
    sp = SamplingParams(temperature=1.0, top_p=0.85)
    raw = _tied()
    law = np.where(np.arange(6) <= 2, raw, 0.0)  # lower id wins the tie: tokens 0-2 kept
    law /= law.sum()
    assert boundary_mass(raw, law, sp, 0.0) == pytest.approx(0.18 / 1.0)  # ties have margin 0
    far = np.array([0.9, 0.05, 0.05])
    assert boundary_mass(far, np.array([1.0, 0.0, 0.0]), SamplingParams(temperature=1.0, top_k=1), 1e-3) == 0.0


def test_boundary_excess_passes_what_the_mass_allows_and_fails_more():
    masses = [0.01] * 1000  # at most 10 expected
    assert boundary_excess(10, masses, 1e-8).passed
    assert boundary_excess(25, masses, 1e-8).passed  # p ~ 1e-4: a heavy run, not evidence at 1e-8
    bad = boundary_excess(60, masses, 1e-8)
    assert not bad.passed and bad.p_value < 1e-15 and "60 boundary tokens, at most 10 expected" in bad.note


BACKEND = '''
import numpy as np
from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport
from mtpcheck.engine.sampling import STREAM_TARGET, uniform

V = 6
RAW = np.array([0.5, 0.26, 0.06, 0.06, 0.06, 0.06])
RAW = RAW / RAW.sum()


def truth(sp):
    """top-p with the lower id winning ties (the contract's convention)."""
    if sp.top_p is None or sp.top_p >= 1.0:
        return RAW
    law = np.where(np.arange(V) <= 2, RAW, 0.0)
    return law / law.sum()


class Ties:
    def __init__(self, mode):
        self.mode = mode  # "keep-ties": every tied token kept; "favour": the tied tokens drawn half the time

    def capabilities(self):
        return Capabilities(name="ties", version="0", vocab_size=V, mtp_kinds=["embedded"], max_depth=8,
                            acceptance_rule="exact_match", target_distributions=True, logit_dtype="float16",
                            seeded_determinism=True)

    def emitted_law(self, sp):
        if sp.top_p is None or sp.top_p >= 1.0:
            return RAW
        if self.mode == "keep-ties":
            return RAW  # tokens 2-5 tie at the crossing: all kept
        return np.array([0.25, 0.25, 0.0, 0.5 / 3, 0.5 / 3, 0.5 / 3])

    def generate(self, req):
        spec = req.speculation not in (None, False) and req.speculation.mode != "off"
        sp, n = req.sampling, len(req.prompt_tokens)
        p, seed = np.cumsum(self.emitted_law(sp)), sp.seed or 0
        tokens = [0 if sp.temperature == 0 else int(min(np.searchsorted(p, uniform(seed, STREAM_TARGET, n + i)), V - 1))
                  for i in range(req.max_tokens)]
        acc, left = [], len(tokens) - 1 if spec else 0  # depth 1, every other proposal rejected
        while left:
            acc.append(min(len(acc) % 2 == 0, left - 1))
            left -= acc[-1] + 1
        r = len(acc)
        rep = SpeculationReport(requested=spec, used=spec, mode="native_mtp" if spec else "off", runtime="ties",
                                num_draft_tokens=1 if spec else 0, reason=None if spec else "not_requested",
                                message=None if spec else "off", rounds=r, drafted=r, accepted=sum(acc),
                                accept_lens=acc, draft_lens=[1] * r)
        return GenerationResult(tokens=tokens, text="", finish_reason="length", speculation=rep)

    def target_distributions(self, prompt, continuation, sampling):
        return np.stack([truth(sampling)] * len(continuation))


def load(mode="keep-ties"):
    return Ties(mode)
'''


@pytest.mark.parametrize("mode, outcome", [("keep-ties", "passed"), ("favour", "failed")])
def test_dist_zero_counts_tied_tokens_and_fails_a_sampler_that_favours_them(pytester, mode, outcome):
    pytester.makepyfile(ties=BACKEND)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=ties:load",
        f"--mtp-backend-option=mode={mode}", "--mtp-clauses=DIST-ZERO", "-k", "top_p and not hot", f"--mtp-json={report}")
    row = json.loads(report.read_text())["clauses"]["DIST-ZERO"]
    assert row["outcome"] == outcome, result.stdout.str()[-3000:]
    ev = next(e for e in row["evidence"] if "boundary" in e)
    assert ev["boundary_tokens"] > 0 and ev["precision"]["logit_dtype"] == "float16"
    if outcome == "failed":
        assert "boundary tokens are emitted more often than keeping all of them would" in row["notes"][0]
        assert ev["boundary"]["p_value"] < ev["boundary"]["alpha"]


def test_a_swap_with_the_crossing_token_is_a_boundary_token():
    """Two near-tied tokens of large mass at the top-p cut: one ulp decides
    which is kept. The dropped one has a whole token's mass above the cut
    (a mass margin of 0.26), but it is within a ratio of 1.0001 of the
    crossing token it would replace - a boundary token for a float runtime,
    found by the half-precision calibration (docs/calibration-half.md)."""
    raw = np.array([0.5, 0.2, 0.20002, 0.09998])
    sp = SamplingParams(temperature=1.0, top_p=0.6)  # keeps 0 and the crossing token 2 (0.20002 > 0.2)
    assert filter_margin(raw, 1, sp) == pytest.approx(1e-4, rel=1e-3)
    assert filter_margins(raw, sp)[1] == pytest.approx(1e-4, rel=1e-3)
    assert filter_margin(raw, 3, sp) == pytest.approx(0.5, rel=1e-3)  # 0.9 above the cut at 0.6: no float flip
    assert rule("float32").filter_margin > 1e-4 > rule("float64").filter_margin
