"""Resource bounds (issue 14, item 6): a prompt longer than the context the
backend declares is refused with a named one-line error before any forward.
Before: `mtpcheck generate` with a 100 KB prompt grew to 23.5 GB and was
killed after 308 s."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from mtpcheck.contracts import PromptTooLongError, SamplingParams, check_prompt_length
from mtpcheck.contracts.models import GenerationRequest


def test_check_prompt_length():
    check_prompt_length([1] * 8, 8)
    check_prompt_length([1] * 10**6, None)  # undeclared: no bound
    with pytest.raises(PromptTooLongError, match="9 tokens exceed the context length 8") as info:
        check_prompt_length([1] * 9, 8)
    assert isinstance(info.value, ValueError) and (info.value.length, info.value.limit) == (9, 8)


def test_the_toy_refuses_before_any_forward():
    from mtpcheck.backends.toy import load_toy

    backend = load_toy(context="16")
    assert backend.capabilities().context_length == 16
    long = GenerationRequest(prompt_tokens=[3] * 17, max_tokens=4, stop_token_ids=[])  # no EOS: the random toy may draw it
    t = time.perf_counter()
    with pytest.raises(PromptTooLongError):
        backend.generate(long)
    with pytest.raises(PromptTooLongError):
        backend.target_distributions([3] * 15, [4, 5], SamplingParams())
    assert time.perf_counter() - t < 1.0
    assert len(backend.generate(long.model_copy(update={"prompt_tokens": [3] * 16})).tokens) == 4


def test_the_reference_declares_its_checkpoints_context():
    from mtpcheck.backends.reference import context_length, load_reference
    from mtpcheck.fixture import FIXTURE_DIR
    from mtpcheck.fixture.realbackends import REAL_DIR

    assert context_length(FIXTURE_DIR / "target") == 2048  # tokenizer_config model_max_length
    assert context_length(REAL_DIR / "mlx_vlm" / "target") == 2048  # config max_position_embeddings
    backend = load_reference()
    assert backend.capabilities().context_length == 2048
    with pytest.raises(PromptTooLongError):
        backend.generate(GenerationRequest(prompt_tokens=[5] * 2049, max_tokens=1))


# a wrapper whose only child is the CLI: RUSAGE_CHILDREN is then that child's
# peak alone (pytest's own children, e.g. pytester runs, would be counted here)
WRAPPER = """
import resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run([sys.executable, "-m", "mtpcheck.cli", "generate", "--prompt", sys.stdin.read()],
                   capture_output=True, text=True, timeout=120)
wall = time.perf_counter() - t
sys.stderr.write(p.stderr)
print(p.returncode, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def test_generate_refuses_a_100_kb_prompt_fast_and_small():
    prompt = "the quick brown fox jumps over the lazy dog. " * 2300  # ~100 KB
    env = {**os.environ, "MLX_DISABLE_COMPILE": "1"}
    proc = subprocess.run([sys.executable, "-c", WRAPPER], input=prompt, capture_output=True, text=True,
                          timeout=180, env=env)
    code, wall, peak_mb = proc.stdout.split()
    assert int(code) == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert "\n" not in err and err.startswith("mtpcheck: error: prompt_tokens:") and "exceed the context length 2048" in err
    assert float(peak_mb) < 1024, f"peak RSS {float(peak_mb):.0f} MB"  # was 23.5 GB
    assert float(wall) < 60, f"{float(wall):.1f} s"  # interpreter and model load included; was 308 s and a kill
