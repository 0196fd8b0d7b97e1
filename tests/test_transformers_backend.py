"""Fast checks of the transformers adapter (mtpcheck/backends/transformers_backend.py)
on the shipped llama fixture: the HF load is the same model mlx-lm runs, the
per-round statistics are the library's own, the seed mixing, the ground truth.
The conformance suite proper runs it with
`pytest --pyargs mtpcheck.suite --mtp-backend=transformers` (docs/backends/transformers.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams

HAVE_TF = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
HAVE_LM = importlib.util.find_spec("mlx_lm") is not None
pytestmark = pytest.mark.skipif(not HAVE_TF, reason="torch/transformers not installed (pip install 'mtpcheck[transformers]')")


def req(prompt, n=16, temperature=0.0, seed=7, spec=None, **kw):
    return GenerationRequest(prompt_tokens=prompt, max_tokens=n, stop_token_ids=kw.pop("stop_token_ids", []),
                             stop=kw.pop("stop", []), sampling=SamplingParams(temperature=temperature, seed=seed, **kw), speculation=spec)


@pytest.fixture(scope="module")
def tf():
    from mtpcheck.backends.transformers_backend import load_transformers

    return load_transformers()


@pytest.fixture(scope="module")
def pld():
    from mtpcheck.backends.transformers_backend import load_transformers

    return load_transformers(config="prompt_lookup")


@pytest.fixture(scope="module")
def prompts(tf):
    from mtpcheck.fixture import fixture_prompts

    return fixture_prompts(tf)


def test_importing_the_adapter_does_not_import_torch():
    code = "import sys, mtpcheck.backends.transformers_backend; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_options_are_checked():
    from mtpcheck.backends import check_backend_options, load_backend, resolve_factory
    from mtpcheck.contracts import SettingsError

    with pytest.raises(SettingsError, match="has no option 'nope'"):
        check_backend_options("transformers", resolve_factory("transformers"), {"nope": "1"})
    with pytest.raises(Exception, match="config='bogus'"):
        load_backend("transformers", {"config": "bogus"})


@pytest.mark.skipif(not HAVE_LM, reason="mlx-lm is not installed")
def test_the_hf_load_is_the_model_mlx_lm_runs(tf, prompts):
    """Identity tensor mapping, float16 upcast to float32: greedy tokens equal
    mlx-lm's (float16) on every fixture prompt, and the raw logits agree within
    float16 rounding."""
    from mtpcheck.backends.mlx_lm import load_mlx_lm

    lm = load_mlx_lm()
    same = 0
    for prompt in prompts.values():
        a = tf.generate(req(prompt, 24, spec=False)).tokens
        b = lm.generate(req(prompt, 24, spec=False)).tokens
        same += a == b
        hf = tf.target_logits(prompt, b[:8])
        ml = lm.target_logits(prompt, b[:8])
        assert np.max(np.abs(hf - ml)) < 0.1, np.max(np.abs(hf - ml))
    assert same == len(prompts) == 7


def test_speculation_is_lossless_at_greedy_and_stats_are_the_streamers(tf, pld, prompts):
    for backend in (tf, pld):
        for prompt in list(prompts.values())[:3]:
            plain = backend.generate(req(prompt, 20, spec=False))
            spec = backend.generate(req(prompt, 20, spec={"mode": "native_mtp", "num_draft_tokens": 3}))
            assert spec.tokens == plain.tokens
            s = spec.speculation
            assert s.used and s.rounds == len(s.accept_lens) == len(s.draft_lens)
            # the first token comes out of round 0: emitted = accepted + rounds
            assert len(spec.tokens) == s.accepted + s.rounds
            assert all(0 <= a <= d <= 3 for a, d in zip(s.accept_lens, s.draft_lens, strict=True))
            assert not plain.speculation.used and plain.speculation.reason == "not_requested"


def test_assistant_rounds_draft_min_depth_room(tf, prompts):
    prompt = next(iter(prompts.values()))
    res = tf.generate(req(prompt, 11, temperature=1.0, spec={"mode": "native_mtp", "num_draft_tokens": 3}))
    emitted = 0
    for a, d in zip(res.speculation.accept_lens, res.speculation.draft_lens, strict=True):
        assert d == min(3, 11 - emitted - 1)
        emitted += a + 1


def test_seed_mixing():
    from mtpcheck.backends.transformers_backend import torch_seed

    assert torch_seed(5) != torch_seed(5 ^ 2**32)
    assert 0 <= torch_seed(2**63 - 1) < 2**32


def test_seeded_calls_repeat_and_seeds_differ(tf, prompts):
    prompt = next(iter(prompts.values()))
    a = tf.generate(req(prompt, 16, temperature=1.0, seed=11, spec=True))
    b = tf.generate(req(prompt, 16, temperature=1.0, seed=11, spec=True))
    c = tf.generate(req(prompt, 16, temperature=1.0, seed=11 ^ 2**32, spec=True))
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_presence_penalty_is_refused(tf, prompts):
    prompt = next(iter(prompts.values()))
    assert "presence_penalty" in tf.capabilities().unsupported_controls
    with pytest.raises(ValueError, match="no presence_penalty"):
        tf.generate(req(prompt, 4, presence_penalty=0.5))


@pytest.mark.parametrize("sp", [dict(temperature=1.0), dict(temperature=0.7, top_k=20), dict(temperature=1.0, top_p=0.9),
                                dict(temperature=1.3, min_p=0.05), dict(temperature=0.0, repetition_penalty=1.3),
                                dict(temperature=1.0, logit_bias={13: 2.0}, repetition_penalty=1.2)])
def test_ground_truth_is_the_contracts_law_on_the_raw_logits(tf, prompts, sp):
    """The ground truth is transformers' own processors on the plain path; on the
    fixture it equals the contract's processing (mtpcheck.engine.sampling) of the
    same raw logits to float32 rounding: the library's order is the contract's."""
    from mtpcheck.engine.sampling import process

    sp = SamplingParams(**sp)
    prompt = next(iter(prompts.values()))
    cont = tf.generate(req(prompt, 12, spec=False)).tokens
    laws = tf.target_distributions(prompt, cont, sp)
    raw = tf.target_logits(prompt, cont)
    seq = list(prompt) + cont
    for i in range(len(cont)):
        want = process(raw[i], sp, seq[: len(prompt) + i])
        assert set(np.flatnonzero(laws[i])) == set(np.flatnonzero(want)), i
        assert np.max(np.abs(laws[i] - want)) < 1e-5


def test_logprobs_are_the_ground_truths(tf, prompts):
    prompt = next(iter(prompts.values()))
    res = tf.generate(req(prompt, 16, temperature=1.0, top_k=30, spec=True))
    law = tf.target_distributions(prompt, res.tokens, SamplingParams(temperature=1.0, top_k=30))
    want = np.log(law[np.arange(len(res.tokens)), res.tokens])
    assert np.max(np.abs(np.array(res.logprobs) - want)) < 1e-4


PROMPT_TEXT = "id,name,city,score\n1,grace,oslo,17\n2,victor,lima,88\n3,"


def test_t1_stop_strings_with_an_assistant_raise(tf):
    """T1 (docs/backends/transformers.md): generate(stop_strings=..., tokenizer=...)
    works on the plain path and with prompt lookup, raises with an assistant
    (the assistant's own generate call gets the stop strings, not the tokenizer)."""
    import torch

    ids = torch.tensor([tf.encode(PROMPT_TEXT)])
    kw = dict(max_new_tokens=8, do_sample=False, stop_strings=[","], tokenizer=tf.tokenizer, pad_token_id=tf.pad_id)
    tf.model.generate(ids, **kw)
    tf.model.generate(ids, prompt_lookup_num_tokens=3, **kw)
    with pytest.raises(ValueError, match="could not locate a tokenizer"):
        tf.model.generate(ids, assistant_model=tf.assistant, **kw)


def test_t2_the_assistant_runs_past_a_stop_string_inside_a_block(tf, pld):
    """T2: assisted decoding checks StopStringCriteria after each round, on the end
    of the sequence only: a stop string completed inside an accepted block is
    missed. The adapter reports the library's tokens (after the StopEvent); the
    text is cut before the stop as the contract has it. Prompt lookup stops."""
    from mtpcheck.contracts import StopEvent, TokenEvent

    prompt = tf.encode(PROMPT_TEXT)
    plain = tf.generate(req(prompt, 24, spec=False, stop=[","]))
    assert tf.decode(plain.tokens) == "carol," and plain.finish_reason == "stop"
    res = tf.generate(req(prompt, 24, spec={"mode": "native_mtp", "num_draft_tokens": 4}, stop=[","]))
    assert res.text == "carol" == plain.text and res.finish_reason == "stop"
    assert res.tokens[: len(plain.tokens)] == plain.tokens and len(res.tokens) > len(plain.tokens)
    at = next(i for i, e in enumerate(res.events) if isinstance(e, StopEvent))
    assert [e.token for e in res.events[at:] if isinstance(e, TokenEvent)] == res.tokens[len(plain.tokens):]
    s = res.speculation
    assert len(res.tokens) == s.accepted + s.rounds  # every round the library ran is counted
    lookup = pld.generate(req(prompt, 24, spec={"mode": "native_mtp", "num_draft_tokens": 4}, stop=[","]))
    assert lookup.tokens == plain.tokens


@pytest.mark.parametrize("kw", [dict(), dict(temperature=1.0, seed=3), dict(stop=[","]), dict(stop=["ol"])])
def test_stream_concatenates_to_generate(tf, pld, kw):
    """generate_stream: one chunk per streamed round (the library's streamer),
    concatenating to generate()'s tokens and text, finish_reason on the last."""
    prompt = tf.encode(PROMPT_TEXT)
    for backend in (tf, pld):
        r = req(prompt, 24, spec={"mode": "native_mtp", "num_draft_tokens": 3}, **kw)
        chunks = list(backend.generate_stream(r))
        res = backend.generate(r)
        assert [t for c in chunks for t in c["tokens"]] == res.tokens
        assert "".join(c["text"] for c in chunks) == res.text
        assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [res.finish_reason]
        assert len(chunks) <= res.speculation.rounds + 1
