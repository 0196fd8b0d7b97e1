"""Ground truth checked before it judges (issue 32, item 4): an adapter whose
target_distributions / target_logits disagree with its own runtime's plain
path gets an adapter error under every clause that would judge against
them, never a verdict on the runtime. The toy reference, its rows computed
without the prompt's context (an adapter passing its cache under a keyword
the library ignores)."""

import json
import os

import numpy as np

from mtpcheck.contracts import Capabilities, GenerationResult, SpeculationReport
from mtpcheck.machinery.truth import problems

pytest_plugins = ["pytester"]

CONTEXTLESS = '''
from mtpcheck.backends import load_backend


def make():
    b = load_backend("toy", {})
    laws, logits = b.target_distributions, b.target_logits
    b.target_distributions = lambda prompt, continuation, sampling: laws(prompt[-1:], continuation, sampling)
    b.target_logits = lambda prompt, continuation: logits(prompt[-1:], continuation)
    return b
'''


def test_a_ground_truth_without_context_is_an_adapter_error(pytester, monkeypatch):
    pytester.makepyfile(contextless=CONTEXTLESS)
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider",
                                           "--mtp-backend=contextless:make", "--mtp-clauses=DIST-ZERO,REQ-BLOCK",
                                           "-k", "temperature or block", f"--mtp-json={report}")
    data = json.loads(report.read_text())
    assert result.ret == 1
    assert data["clauses"]["DIST-ZERO"]["outcome"] == "error"  # not failed: no verdict on the runtime
    assert data["clauses"]["REQ-BLOCK"]["outcome"] == "passed"  # clauses that read no ground truth still judge
    note = data["clauses"]["DIST-ZERO"]["notes"][0]
    assert "GroundTruthError: adapter error, not a verdict on the runtime" in note
    assert "16 of 16 greedy plain tokens are not its argmax" in note


class Rows:
    """A plain path that emits token 1 then 2; ground truth whose row 1 puts 2 `gap` nats below token 0."""

    def __init__(self, gap):
        self.gap = gap

    def generate(self, req):
        return GenerationResult(tokens=[1, 2], text="", finish_reason="length", speculation=SpeculationReport(
            requested=False, used=False, mode="off", runtime="t", reason="not_requested", message="off"))

    def target_distributions(self, prompt, continuation, sampling):
        z = np.array([[0.0, 1.0, -1.0], [self.gap, -1.0, 0.0]])
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)


def test_a_near_tie_is_excused_and_a_real_disagreement_is_not():
    caps = Capabilities(name="t", version="0", vocab_size=3, target_distributions=True, near_tie_logit_gap=0.01)
    assert problems(Rows(0.005), caps, [[0]]) == []
    found = problems(Rows(0.5), caps, [[0]])
    assert len(found) == 1 and "1 of 2 greedy plain tokens are not its argmax (first: position 1, plain token 2, " \
                               "argmax 0, 0.5 nats below it" in found[0]


HALVED_TOP_K = '''
from mtpcheck.backends import load_backend


def make():
    b = load_backend("toy", {})
    laws = b.target_distributions

    def halved(prompt, continuation, sampling):
        if sampling.top_k:  # a mapping bug: the adapter's ground truth keeps half the k the runtime keeps
            sampling = sampling.model_copy(update={"top_k": max(1, sampling.top_k // 2)})
        return laws(prompt, continuation, sampling)

    b.target_distributions = halved
    return b
'''


def test_a_filter_mapped_otherwise_is_an_adapter_error(pytester, monkeypatch):
    """The argmax survives every filter, so the greedy half cannot see a
    mis-mapped top-k; seeded plain tokens of probability 0 in the ground truth do."""
    pytester.makepyfile(halved=HALVED_TOP_K)
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    report = pytester.path / "r.json"
    pytester.runpytest_subprocess("--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=halved:make",
                                  "--mtp-clauses=DIST-EQUIV", "-k", "temperature", f"--mtp-json={report}")
    row = json.loads(report.read_text())["clauses"]["DIST-EQUIV"]
    assert row["outcome"] == "error"
    assert "seeded plain tokens under top_k" in row["notes"][0] and "greedy plain tokens" not in row["notes"][0]


def test_the_sampled_half_passes_correct_ground_truth():
    from mtpcheck.backends import load_backend
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery.truth import sampled_problems

    b = load_backend("toy", {})
    assert sampled_problems(b, b.capabilities(), list(fixture_prompts(b).values())) == []
