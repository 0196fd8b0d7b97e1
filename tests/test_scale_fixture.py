"""The realistic-scale mlx-lm fixture (mtpcheck/fixture/real/mlx_lm_32k, built by
``python -m mtpcheck.fixture.scale``): it loads through the mlx-lm adapter
with ``path=``, its vocabulary is real-size, its tokenizer round-trips, greedy
decoding is the same with speculation on and off, and scale.json records the
figures the builder measured. Also the builder's NumPy output head against
MLX's own gradients, and the corpus recorded in scale.json."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.fixture import REAL_DIR

FOLDER = REAL_DIR / "mlx_lm_32k"
HAVE_LM = importlib.util.find_spec("mlx_lm") is not None
needs_lm = pytest.mark.skipif(not HAVE_LM, reason="mlx-lm is not installed (pip install 'mtpcheck[mlx-lm]')")

SENTENCE = "The quiet farmer carried 3 baskets across the river, and Mara said: \"héllo\"!\n"
PROMPTS = [
    "id,name,city,score\n1,grace,oslo,17\n2,victor,lima,88\n3,",
    "The weary lantern greeted a golden orchard beneath the narrow",
]


def req(prompt, spec, n=24):
    return GenerationRequest(prompt_tokens=prompt, max_tokens=n, stop_token_ids=[],
                             sampling=SamplingParams(temperature=0.0, seed=7), speculation=spec)


@pytest.fixture(scope="module")
def meta():
    return json.loads((FOLDER / "scale.json").read_text())


@pytest.fixture(scope="module")
def lm():
    from mtpcheck.backends import load_backend

    return load_backend("mlx-lm", {"path": str(FOLDER)})


def test_files_present_and_small(meta):
    for role in ("target", "draft"):
        names = sorted(p.name for p in (FOLDER / role).iterdir())
        assert names == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"], role
        assert meta["bytes"][role] == sum(p.stat().st_size for p in (FOLDER / role).iterdir())
    assert meta["total_bytes"] <= 12_500_000


def test_the_recorded_figures_are_there(meta):
    assert meta["tokenizer"]["vocab_size"] >= 32000 and meta["tokenizer"]["eos_id"] == 0
    assert meta["corpus"]["recipe"]["generator"] == "mtpcheck.fixture.scale.generate_scale_corpus"
    law = meta["corpus"]["token_law"]
    assert law["unigram_entropy_nats"] > 0 and law["zipf_slope_ranks_10_to_10000"] < 0
    for role in ("target", "draft"):
        assert meta["models"][role]["params"] > meta["models"][role]["embedding_params"] > 0
        assert meta["training"][role]["steps"] > 0 and meta["training"][role]["train_seconds"] > 0
    assert meta["models"]["draft"]["params"] < meta["models"]["target"]["params"]
    target = meta["measured"]["target"]
    ent, nuc = target["entropy_nats"], target["nucleus_top_p_0.9"]
    assert 0 < ent["mean"] < np.log(meta["tokenizer"]["vocab_size"])
    assert len(ent["quartiles"]) == 3 and len(nuc["quartiles"]) == 3
    assert 1 <= nuc["quartiles"][0] <= nuc["median"] == nuc["quartiles"][1] <= nuc["quartiles"][2]
    assert target["max_abs_logit"] > 0
    acc = meta["measured"]["draft_vs_target"]
    assert 0 <= acc["greedy_teacher_forced"] <= 1 and 0 <= acc["t1_teacher_forced"] <= 1
    assert 0 <= acc["speculative_greedy"]["acceptance_rate"] <= 1
    assert meta["seconds"]["total"] > 0


def test_the_corpus_is_the_recorded_one(meta):
    from mtpcheck.fixture.scale import corpus_sha256, generate_scale_corpus

    c = meta["corpus"]
    docs = generate_scale_corpus(c["seed"], c["n_bytes"])
    assert len(docs) == c["documents"] and corpus_sha256(docs) == c["sha256"]


@needs_lm
def test_loads_through_the_adapter_with_a_real_size_vocabulary(lm):
    caps = lm.capabilities()
    assert caps.vocab_size >= 32000 and caps.eos_token_ids == [0]
    assert lm.target_path == FOLDER / "target" and lm.draft_path == FOLDER / "draft"
    assert lm.tokenizer.vocab_size >= 32000


@needs_lm
def test_the_tokenizer_round_trips(lm):
    ids = lm.encode(SENTENCE)
    assert lm.decode(ids) == SENTENCE
    assert len(ids) < len(SENTENCE.encode()) and max(ids) < lm.capabilities().vocab_size
    assert lm.encode("<|endoftext|>") == [0]  # EOS is a special token


@needs_lm
@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_speculation_on_equals_off(lm, text):
    prompt = lm.encode(text)
    off = lm.generate(req(prompt, False))
    on = lm.generate(req(prompt, {"num_draft_tokens": 3}))
    assert not off.speculation.used and on.speculation.used and on.speculation.rounds >= 1
    assert on.tokens == off.tokens and len(on.tokens) == 24


@needs_lm
def test_the_numpy_head_has_mlxs_gradients():
    import mlx.core as mx
    import mlx.nn as nn

    from mtpcheck.fixture.scale import head_losses

    ce_head, distill_head = head_losses()
    mx.random.seed(3)
    V, N, D, Dt = 300, 20, 8, 12
    h, W, y = mx.random.normal((N, D)), 0.3 * mx.random.normal((V, D)), mx.random.randint(0, V, (N,))
    th, tW = mx.random.normal((N, Dt)), 0.3 * mx.random.normal((V, Dt))

    def ref(h, W):
        z = h @ W.T
        ce = nn.losses.cross_entropy(z, y).mean()
        t = th @ tW.T
        logp = t - mx.logsumexp(t, axis=-1, keepdims=True)
        kl = (mx.exp(logp) * (logp - (z - mx.logsumexp(z, axis=-1, keepdims=True)))).sum(-1).mean()
        return ce + 0.7 * kl, mx.stack([ce, kl])

    def mine(h, W):
        parts = distill_head(h, W, y, th, tW)
        return parts[0] + 0.7 * parts[1], parts

    (_, want), g_want = mx.value_and_grad(ref, argnums=(0, 1))(h, W)
    (_, got), g_got = mx.value_and_grad(mine, argnums=(0, 1))(h, W)
    assert np.allclose(np.array(got), np.array(want), atol=1e-5)
    for a, b in zip(g_got, g_want, strict=True):
        assert np.allclose(np.array(a), np.array(b), atol=1e-6)
    ce_ref = mx.value_and_grad(lambda h, W: nn.losses.cross_entropy(h @ W.T, y).mean(), argnums=(0, 1))(h, W)
    ce_got = mx.value_and_grad(lambda h, W: ce_head(h, W, y)[0], argnums=(0, 1))(h, W)
    assert abs(ce_ref[0].item() - ce_got[0].item()) < 1e-5
    for a, b in zip(ce_got[1], ce_ref[1], strict=True):
        assert np.allclose(np.array(a), np.array(b), atol=1e-6)
