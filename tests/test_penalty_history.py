"""Penalty history as a declared convention (Capabilities.penalty_history):
presence and frequency penalties over prompt + output (Hugging Face, the
reference) or over the output only (OpenAI's definition: vLLM, OpenVINO
GenAI). CTRL-CONTRACT's ground truth follows the declaration, so a runtime is
judged against the convention it declares and fails the other one."""

from __future__ import annotations

import numpy as np
import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.machinery.contract_logits import penalised


def test_output_only_leaves_the_prompt_out_of_presence_and_frequency_not_repetition():
    rows = np.zeros((2, 6))
    rows[:, 4] = 1.0
    prompt, cont = [2, 2, 3], [4, 5]
    sp = SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=2.0)
    both = penalised(rows, sp, prompt, cont)
    out = penalised(rows, sp, prompt, cont, penalty_history="output_only")
    assert both[0, 2] == -1.0 - 0.5 * 2 and out[0, 2] == 0.0  # a prompt token: penalised under HF only
    assert both[1, 4] == out[1, 4] == 1.0 / 2.0 - 1.0 - 0.5  # an output token: the same under both
    rep = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    assert np.array_equal(penalised(rows, rep, prompt, cont), penalised(rows, rep, prompt, cont,
                                                                          penalty_history="output_only"))


def test_the_reference_is_judged_against_its_declared_convention():
    """The reference counts the prompt: its greedy output is the argmax of the
    prompt_and_output rows and not of the output_only ones, so a runtime that
    declared the wrong convention fails CTRL-CONTRACT."""
    pytest.importorskip("mlx.core")
    from mtpcheck.backends import load_backend
    from mtpcheck.fixture import fixture_prompts
    from mtpcheck.machinery.configs import request

    backend = load_backend("mlx")
    sp = SamplingParams(temperature=0.0, presence_penalty=1.5)
    misses = {"prompt_and_output": 0, "output_only": 0}
    for prompt in list(fixture_prompts(backend).values())[:4]:
        res = backend.generate(request(prompt, 24, sp, False, stop_token_ids=[]))
        raw = backend.target_logits(prompt, res.tokens)
        for convention in misses:
            rows = penalised(raw, sp, prompt, res.tokens, penalty_history=convention)
            misses[convention] += int(np.sum(np.argmax(rows, axis=-1) != np.asarray(res.tokens)))
    assert misses["prompt_and_output"] == 0 and misses["output_only"] > 0, misses
