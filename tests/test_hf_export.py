"""The padded Hugging Face export of the llama fixtures (mtpcheck.fixture.hf_export),
the checkpoints the vllm backend serves: heads padded from 16 / 12 to 32
dimensions, proved equal to the unpadded model. The rotation identity is
checked in numpy; the whole model against mlx-lm, which loads both folders
with its own llama code (head_dim and rope_theta from config.json)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

HAVE_LM = importlib.util.find_spec("mlx_lm") is not None
LOGIT_TOL = 1e-4  # float32 both sides; measured max |diff| 5e-6 (target), 3e-6 (draft)


def _rope_half(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """HF rotate-half RoPE of one head vector x [h] at position pos."""
    h = x.shape[0]
    inv = theta ** (-np.arange(0, h, 2) / h)
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)
    a, b = x[: h // 2], x[h // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin])


@pytest.mark.parametrize("h", [12, 16])
def test_padded_rows_keep_every_rotated_dot_product(h):
    from mtpcheck.fixture.hf_export import HEAD_DIM, _pad_rows

    rng = np.random.default_rng(h)
    q, k = rng.standard_normal((h, 1)).astype(np.float32), rng.standard_normal((h, 1)).astype(np.float32)
    theta = 10000.0
    theta2 = theta ** (HEAD_DIM / (2 * h))
    qp, kp = _pad_rows(q, 1, h, rope=True)[:, 0], _pad_rows(k, 1, h, rope=True)[:, 0]
    for pq, pk in [(0, 0), (7, 3), (100, 1), (1500, 1499)]:
        want = _rope_half(q[:, 0], pq, theta) @ _rope_half(k[:, 0], pk, theta)
        got = _rope_half(qp, pq, theta2) @ _rope_half(kp, pk, theta2)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_export_folder_is_an_hf_llama_with_32_dim_heads():
    from mtpcheck.fixture import hf_export

    for label, src in hf_export.fixtures().items():
        out = hf_export.cached_export(src)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] == 32, label
        assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
        h = cfg["mtpcheck_padded_from"]["head_dim"]
        assert cfg["rope_theta"] == pytest.approx(cfg["mtpcheck_padded_from"]["rope_theta"] ** (32 / (2 * h)))


def test_export_refuses_another_architecture(tmp_path):
    from mtpcheck.fixture.hf_export import padded

    with pytest.raises(ValueError, match="head size 64"):
        padded({"num_attention_heads": 1, "num_key_value_heads": 1, "hidden_size": 64}, {})


@pytest.mark.skipif(not HAVE_LM, reason="mlx-lm not installed (extra mlx-lm)")
@pytest.mark.parametrize("label", ["llama-target", "llama-draft"])
def test_padded_model_equals_the_fixture_under_mlx_lm(label):
    import mlx.core as mx
    from mlx_lm import load

    from mtpcheck.fixture import PROMPTS, hf_export

    src = hf_export.fixtures()[label]
    ref, tok = load(str(src))
    ref.set_dtype(mx.float32)
    pad, _ = load(str(hf_export.cached_export(src)))
    worst = 0.0
    for text in list(PROMPTS.values())[:3]:
        prompt = tok.encode(text, add_special_tokens=False)[:48]
        a, b = np.array(ref(mx.array([prompt]))), np.array(pad(mx.array([prompt])))
        worst = max(worst, float(np.abs(a - b).max()))
        seq_a, seq_b = list(prompt), list(prompt)
        for _ in range(24):  # greedy continuation, token for token
            seq_a.append(int(np.argmax(np.array(ref(mx.array([seq_a])))[0, -1])))
            seq_b.append(int(np.argmax(np.array(pad(mx.array([seq_b])))[0, -1])))
        assert seq_a == seq_b, label
    assert worst < LOGIT_TOL, f"{label}: max |logit diff| {worst:.3g}"
