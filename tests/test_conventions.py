"""Conventions as declarations (issue 33, item 2): the top-k tie convention
decides the ground truth, and the DIST clauses judge a runtime against the
convention it declares."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.engine.sampling import process

pytest_plugins = ["pytester"]


def test_top_k_keeps_exactly_k_or_every_tie_as_declared():
    logits = np.log([0.4, 0.2, 0.1, 0.1, 0.1, 0.1])
    sp = SamplingParams(temperature=1.0, top_k=3)
    assert np.flatnonzero(process(logits, sp)).tolist() == [0, 1, 2]  # ties broken by lower id
    assert np.flatnonzero(process(logits, sp, top_k_ties="keep_ties")).tolist() == [0, 1, 2, 3, 4, 5]
    assert process(logits, sp, top_k_ties="keep_ties") == pytest.approx([0.4, 0.2, 0.1, 0.1, 0.1, 0.1])


def test_the_reference_follows_its_declared_convention():
    """bfloat16 logits tie often: at the suite's top_k (8) some rows keep more under keep_ties."""
    from mtpcheck.backends.reference import load_reference
    from mtpcheck.contracts import GenerationRequest
    from mtpcheck.fixture import fixture_prompts

    sp = SamplingParams(temperature=1.3, top_k=8)
    support = {}
    for ties in ("exactly_k", "keep_ties"):
        b = load_reference(logits="bfloat16", top_k_ties=ties)
        assert b.capabilities().top_k_ties == ties
        counts = []
        for p in list(fixture_prompts(b).values())[:4]:
            res = b.generate(GenerationRequest(prompt_tokens=p, max_tokens=24, sampling=SamplingParams(temperature=0)))
            counts += (b.target_distributions(p, res.tokens, sp) > 0).sum(axis=1).tolist()
        support[ties] = counts
    assert max(support["exactly_k"]) == 8
    assert max(support["keep_ties"]) > 8 and min(support["keep_ties"]) >= 8
    with pytest.raises(ValueError, match="top_k_ties='lowest'"):
        load_reference(top_k_ties="lowest")


BACKEND = '''
import numpy as np
from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport
from mtpcheck.engine.sampling import STREAM_TARGET, process, uniform

# five tokens tie at rank 8: a top-k of 8 keeps one of them, or all five
LOGITS = np.log(np.array([0.2, 0.15, 0.12, 0.1, 0.08, 0.07, 0.06, 0.03, 0.03, 0.03, 0.03, 0.03]))
V = len(LOGITS)


class Topk:
    def __init__(self, behaves, declares):
        self.behaves, self.declares = behaves, declares

    def capabilities(self):
        return Capabilities(name="topk", version="0", vocab_size=V, mtp_kinds=["embedded"], max_depth=8,
                            acceptance_rule="exact_match", target_distributions=True, seeded_determinism=True,
                            top_k_ties=self.declares)

    def generate(self, req):
        spec = req.speculation not in (None, False) and req.speculation.mode != "off"
        sp, n = req.sampling, len(req.prompt_tokens)
        p, seed = np.cumsum(process(LOGITS, sp, top_k_ties=self.behaves)), sp.seed or 0
        tokens = [0 if sp.temperature == 0 else int(min(np.searchsorted(p, uniform(seed, STREAM_TARGET, n + i)), V - 1))
                  for i in range(req.max_tokens)]
        acc, left = [], len(tokens) - 1 if spec else 0  # depth 1, every other proposal rejected
        while left:
            acc.append(min(len(acc) % 2 == 0, left - 1))
            left -= acc[-1] + 1
        r = len(acc)
        rep = SpeculationReport(requested=spec, used=spec, mode="native_mtp" if spec else "off", runtime="topk",
                                num_draft_tokens=1 if spec else 0, reason=None if spec else "not_requested",
                                message=None if spec else "off", rounds=r, drafted=r, accepted=sum(acc),
                                accept_lens=acc, draft_lens=[1] * r)
        return GenerationResult(tokens=tokens, text="", finish_reason="length", speculation=rep)

    def target_distributions(self, prompt, continuation, sampling):
        return np.stack([process(LOGITS, sampling, top_k_ties=self.declares)] * len(continuation))


def load(behaves="exactly_k", declares="exactly_k"):
    return Topk(behaves, declares)
'''


@pytest.mark.parametrize("behaves, declares, zero, equiv", [
    ("keep_ties", "keep_ties", "passed", "passed"),
    ("exactly_k", "exactly_k", "passed", "passed"),
    # declares keep_ties, keeps one: the four tied tokens the law gives 0.12 never come
    ("exactly_k", "keep_ties", "passed", "failed"),
    # declares exactly_k, keeps all five: the tied tokens are boundary tokens (margin 0) at the
    # rate keeping them gives, which a float runtime's random tie breaks may reach - not judged
    ("keep_ties", "exactly_k", "passed", "passed"),
])
def test_dist_clauses_judge_the_declared_top_k_convention(pytester, behaves, declares, zero, equiv):
    pytester.makepyfile(topk=BACKEND)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=topk:load",
        f"--mtp-backend-option=behaves={behaves}", f"--mtp-backend-option=declares={declares}",
        "--mtp-clauses=DIST-ZERO,DIST-EQUIV", "-k", "top_k and not hot", f"--mtp-json={report}")
    rows = json.loads(report.read_text())["clauses"]
    out = result.stdout.str()[-3000:]
    assert (rows["DIST-ZERO"]["outcome"], rows["DIST-EQUIV"]["outcome"]) == (zero, equiv), out
    counted = [e.get("boundary_tokens", 0) for e in rows["DIST-ZERO"]["evidence"]]
    assert (sum(counted) > 0) == (behaves == "keep_ties" and declares == "exactly_k"), counted


WRAP = '''
from mtpcheck.backends.reference import load_reference


class Declares:
    """The reference (stop strings matched on text with special tokens), declaring another stop_text."""

    def __init__(self, inner, stop_text):
        self.inner, self.stop_text = inner, stop_text or None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def capabilities(self):
        return self.inner.capabilities().model_copy(update={"stop_text": self.stop_text})


def load(stop_text=""):
    return Declares(load_reference(), stop_text)
'''


@pytest.mark.parametrize("declares, outcome", [("special_tokens_kept", "passed"), ("special_tokens_skipped", "failed"),
                                               ("", "skipped")])
def test_stop_in_block_judges_the_declared_stop_text(pytester, declares, outcome):
    pytester.makepyfile(declares=WRAP)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=declares:load",
        f"--mtp-backend-option=stop_text={declares}", "--mtp-clauses=STOP-IN-BLOCK", "-k", "declared_text",
        f"--mtp-json={report}")
    row = json.loads(report.read_text())["clauses"]["STOP-IN-BLOCK"]
    assert row["outcome"] == outcome, result.stdout.str()[-3000:]
    if outcome == "failed":  # both paths stop inside the EOS text: the runtime's convention, not speculation's
        assert "behaves as special_tokens_kept" in row["notes"][0]
        assert row["deviating_sides"] == ["both"]
    if outcome == "skipped":
        assert "Capabilities.stop_text" in row["notes"][0]
