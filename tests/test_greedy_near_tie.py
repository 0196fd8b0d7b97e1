"""GREEDY-EQUIV's near-tie excuse reads the top-2 logit gap, not a probability
margin: on a flat softmax over a large vocabulary every probability margin is
tiny, so a margin-based excuse would let any greedy divergence through.

The backend below speculates wrongly: at one position its speculative greedy
output takes the runner-up, 0.2 nats below the top logit, on a flat law over
32,000 tokens (p1 - p2 ~ 2e-4, below the old 1e-3 margin). The clause must
fail it in float32 and float16, and excuse it - with the gap in the
evidence - only where the declared logit dtype's rounding reaches 0.2 nats
(bfloat16: 4 ulps at |logit| < 32 is 0.5 nats; laws.precision)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mtpcheck.laws.precision import rule
from mtpcheck.machinery.checks import top2_logit_gap

pytest_plugins = ["pytester"]

V = 32000
FLIP_AT = 2

BACKEND = '''
import numpy as np
from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport

V, FLIP_AT = {V}, {FLIP_AT}


def law(position):
    """A flat temperature-1 law (logits ~ N(0, 1)); the top two logits 0.2 apart."""
    z = np.random.default_rng(position).normal(size=V)
    top = np.argsort(z)[-2:]
    z[top[1]] = z[top[0]] + 0.2
    p = np.exp(z - z.max())
    return p / p.sum()


class FlatFlip:
    def __init__(self, dtype):
        self.dtype = dtype

    def capabilities(self):
        return Capabilities(name="flat-flip", version="0", vocab_size=V, mtp_kinds=["embedded"], max_depth=8,
                            acceptance_rule="exact_match", target_distributions=True, logit_dtype=self.dtype)

    def generate(self, req):
        spec = req.speculation not in (None, False) and req.speculation.mode != "off"
        n = len(req.prompt_tokens)
        tokens = []
        for i in range(req.max_tokens):
            order = np.argsort(law(n + i))
            tokens.append(int(order[-2] if spec and i == FLIP_AT else order[-1]))
        rounds = (len(tokens) - 1) // 2 if spec else 0  # depth 1, every proposal accepted: 2 tokens a round
        report = SpeculationReport(requested=spec, used=spec, mode="native_mtp" if spec else "off",
                                   runtime="flat-flip", num_draft_tokens=1 if spec else 0,
                                   reason=None if spec else "not_requested",
                                   message=None if spec else "off", rounds=rounds, drafted=rounds, accepted=rounds,
                                   accept_lens=[1] * rounds, draft_lens=[1] * rounds)
        return GenerationResult(tokens=tokens, text="", finish_reason="length", speculation=report)

    def target_distributions(self, prompt, continuation, sampling):
        return np.stack([law(len(prompt) + i) for i in range(len(continuation))])


def load(dtype="float32"):
    return FlatFlip(dtype)
'''


def test_the_gap_not_the_margin_on_a_flat_law():
    z = np.random.default_rng(0).normal(size=V)
    top = np.argsort(z)[-2:]
    z[top[1]] = z[top[0]] + 0.2
    p = np.exp(z - z.max())
    p /= p.sum()
    p2, p1 = np.sort(p)[-2:]
    assert p1 - p2 < 1e-3  # a probability margin would call this a near-tie
    assert top2_logit_gap(p) == pytest.approx(0.2, abs=1e-9)
    assert top2_logit_gap(np.array([0.5, 0.5 * math.exp(-1e-4), 0.0])) < 1e-3  # a genuine near-tie
    assert top2_logit_gap(np.array([1.0, 0.0])) == math.inf


@pytest.mark.parametrize("dtype, outcome", [("float32", "failed"), ("float16", "failed"), ("bfloat16", "passed")])
def test_greedy_equiv_fails_a_flip_on_a_flat_law_unless_the_dtype_rounds_that_far(pytester, dtype, outcome):
    pytester.makepyfile(flatflip=BACKEND.format(V=V, FLIP_AT=FLIP_AT))
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=flatflip:load",
        f"--mtp-backend-option=dtype={dtype}", "--mtp-clauses=GREEDY-EQUIV", f"--mtp-json={report}")
    data = json.loads(report.read_text())
    assert data["clauses"]["GREEDY-EQUIV"]["outcome"] == outcome, result.stdout.str()[-3000:]
    divergences = [e["divergence"] for e in data["clauses"]["GREEDY-EQUIV"]["evidence"] if "divergence" in e]
    assert divergences and divergences[0]["position"] == FLIP_AT
    assert divergences[0]["top2_logit_gap"] == pytest.approx(0.2, abs=1e-6)
    assert divergences[0]["logit_gap_tolerance"] == pytest.approx(rule(dtype).logit_gap)
    assert divergences[0]["top2_gap_ulps"] == pytest.approx(0.2 / rule(dtype).ulp)
