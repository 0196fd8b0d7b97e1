"""STOP-IN-BLOCK's model-EOS test (mtpcheck/suite/test_stops.py): the
fixture's document endings put the target's own EOS inside accepted blocks on
the reference, and a runtime that checks the model's EOS only on a round's
last token is caught there, while requests naming stop_token_ids pass."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core")

from mtpcheck.backends import load_backend  # noqa: E402
from mtpcheck.fixture import ENDING_PROMPTS, ending_prompts  # noqa: E402
from mtpcheck.machinery.checks import token_role  # noqa: E402
from mtpcheck.machinery.invariants import output_problems  # noqa: E402
from mtpcheck.mutants import load_mutant  # noqa: E402
from mtpcheck.suite.test_stops import GREEDY, LONG, request  # noqa: E402

SPEC = {"mode": "native_mtp", "num_draft_tokens": 3}


@pytest.fixture(scope="module")
def reference():
    return load_backend("mlx")


def test_every_ending_prompt_ends_its_document(reference):
    """On the shipped fixture each ending prompt reaches the model's EOS within
    LONG greedy tokens, and at depth 3 the EOS is an accepted proposal."""
    prompts = ending_prompts(reference)
    assert set(prompts) == set(ENDING_PROMPTS)
    for name, prompt in prompts.items():
        res = reference.generate(request(prompt, LONG, GREEDY, SPEC))
        assert res.finish_reason == "stop" and res.tokens[-1] == 0, name
        assert token_role(res, len(res.tokens) - 1) == "accepted", name


def test_ids_only_backend_has_no_ending_prompts():
    assert ending_prompts(load_backend("toy")) == {}


def test_model_eos_checked_at_round_end_is_caught_on_an_ending_prompt(reference):
    mutant = load_mutant("model-eos-checked-at-round-end", base="mlx")
    prompt = ending_prompts(reference)["end_prose0"]
    want = reference.generate(request(prompt, LONG, GREEDY, SPEC)).tokens
    got = mutant.generate(request(prompt, LONG, GREEDY, SPEC))
    assert got.tokens[: len(want)] == want and len(got.tokens) > len(want)
    caps = mutant.capabilities()
    req = request(prompt, LONG, GREEDY, SPEC)
    assert any("stop token 0" in p for _, p in output_problems(got.tokens, got.text, req, caps))
    # a request that names its stop tokens is served right: the bug is the model's EOS alone
    named = mutant.generate(request(prompt, LONG, GREEDY, SPEC, stop_token_ids=[0]))
    assert named.tokens == want
