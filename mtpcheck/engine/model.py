"""A tiny decoder-only transformer with an embedded MTP head, in MLX.

Target: embedding -> blocks (attention or gated linear attention) -> RMSNorm
-> tied LM head. MTP head (DeepSeek-V3 / Qwen3.5 style): the target's hidden
state h_i and the embedding of token x_{i+1} are normalised, concatenated,
projected, run through its own block(s), normalised, and read out with the
shared LM head to predict x_{i+2}. One trained head is reused recurrently for
deeper drafts (seed 001). The external assistant is the same class, smaller,
without a head.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .cache import KVCache, RecurrentCache


@dataclass
class ModelArgs:
    vocab_size: int
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    hidden_dim: int = 128
    layer_kinds: list[str] = field(default_factory=list)  # "attn" | "gla"; empty = all attn
    mtp_layers: int = 0  # blocks in the MTP head; 0 = no head
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def kinds(self) -> list[str]:
        return self.layer_kinds or ["attn"] * self.n_layers


@functools.lru_cache(maxsize=4096)
def causal_mask(L: int, offset: int, dtype=mx.float32) -> mx.array | None:
    """Additive mask [L, offset+L]: query i (at offset+i) sees keys <= offset+i.
    Built on the host and cached: a tiny model's forward is per-op overhead."""
    if L == 1:
        return None
    q = np.arange(offset, offset + L)[:, None]
    k = np.arange(offset + L)[None, :]
    return mx.array(np.where(k <= q, 0.0, -1e9).astype(np.float32)).astype(dtype)  # the fused kernel wants the activations' dtype


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = a.n_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.wv = nn.Linear(a.dim, a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)
        self.rope = nn.RoPE(self.head_dim, base=a.rope_theta)

    def __call__(self, x: mx.array, cache: KVCache | None) -> mx.array:
        B, L, D = x.shape  # x: [B, L, D]
        split = lambda t: t.reshape(B, L, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))  # [B, H, L, hd]
        offset = 0 if cache is None else cache.length
        q, k = self.rope(q, offset=offset), self.rope(k, offset=offset)
        if cache is not None:
            k, v = cache.update(k, v)  # [B, H, offset+L, hd]
        mask = causal_mask(L, offset, q.dtype)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5, mask=mask)
        return self.wo(o.transpose(0, 2, 1, 3).reshape(B, L, D))


class GatedLinearAttention(nn.Module):
    """S_t = g_t * S_{t-1} + k_t^T v_t ; o_t = q_t S_t, with a scalar decay g_t
    per head. Its state cannot be trimmed, which is the point: rollback of
    this layer needs checkpoints."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = a.n_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.wv = nn.Linear(a.dim, a.dim, bias=False)
        self.wg = nn.Linear(a.dim, a.n_heads, bias=True)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)
        self.out_norm = nn.RMSNorm(self.head_dim, eps=a.norm_eps)

    def __call__(self, x: mx.array, cache: RecurrentCache | None) -> mx.array:
        B, L, D = x.shape
        H, hd = self.n_heads, self.head_dim
        split = lambda t: t.reshape(B, L, H, hd).transpose(0, 2, 1, 3)
        q, k, v = split(self.wq(x)), split(self.wk(x)) * hd**-0.5, split(self.wv(x))  # [B, H, L, hd]
        log_g = nn.log_sigmoid(self.wg(x) + 3.0).transpose(0, 2, 1)  # [B, H, L], decay near 0.95 at init
        G = mx.cumsum(log_g, axis=-1)  # [B, H, L]
        tril = mx.tril(mx.ones((L, L), dtype=mx.bool_))
        decay = mx.exp(mx.where(tril, G[..., :, None] - G[..., None, :], -mx.inf))  # [B, H, L, L]
        o = ((q @ k.transpose(0, 1, 3, 2)) * decay) @ v  # intra-chunk
        S0 = None if cache is None else cache.state
        if S0 is not None:
            o = o + mx.exp(G)[..., None] * (q @ S0)  # carried state
        if cache is not None:
            # state after each input t: exp(G_t) S0 + sum_{s<=t} decay[t,s] k_s^T v_s
            kv = k[..., :, :, None] * v[..., :, None, :]  # [B, H, L, hd, hd]
            states = mx.einsum("bhts,bhsij->bhtij", decay, kv)
            if S0 is not None:
                states = states + mx.exp(G)[..., None, None] * S0[:, :, None]
            cache.record([states[:, :, t] for t in range(L)])
        o = self.out_norm(o).transpose(0, 2, 1, 3).reshape(B, L, D)
        return self.wo(o)


class MLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.gate = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.up = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.down = nn.Linear(a.hidden_dim, a.dim, bias=False)

    def __call__(self, x):
        return self.down(nn.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, a: ModelArgs, kind: str = "attn"):
        super().__init__()
        self.kind = kind
        self.norm1 = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.mixer = Attention(a) if kind == "attn" else GatedLinearAttention(a)
        self.norm2 = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.mlp = MLP(a)

    def __call__(self, x, cache):
        x = x + self.mixer(self.norm1(x), cache)
        return x + self.mlp(self.norm2(x))


class MTPHead(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.hnorm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.enorm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.proj = nn.Linear(2 * a.dim, a.dim, bias=False)
        self.layers = [Block(a, "attn") for _ in range(a.mtp_layers)]
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)

    def __call__(self, h: mx.array, next_emb: mx.array, cache: list | None) -> mx.array:
        """h, next_emb: [B, L, D] -> the head's hidden state [B, L, D]."""
        x = self.proj(mx.concatenate([self.enorm(next_emb), self.hnorm(h)], axis=-1))
        for i, layer in enumerate(self.layers):
            x = layer(x, None if cache is None else cache[i])
        return x


class Model(nn.Module):
    # logits leave in float32 (the host reads them; bf16 has no numpy buffer format), rounded
    # through logit_dtype first: the reference as a stand-in for a half-precision runtime;
    # logit_jitter moves each logit by up to that many of its ulps, by its row in the forward
    # chunk: paths that chunk a sequence differently (verify, plain, teacher-forced) disagree
    logit_dtype = mx.float32
    logit_jitter = 0

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.embed = nn.Embedding(a.vocab_size, a.dim)
        self.layers = [Block(a, kind) for kind in a.kinds()]
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        if a.mtp_layers:
            self.mtp = MTPHead(a)

    def __call__(self, tokens: mx.array, cache: list | None = None) -> tuple[mx.array, mx.array]:
        """tokens [B, L] -> (hidden [B, L, D] before the final norm, logits [B, L, V])."""
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, None if cache is None else cache[i])
        return x, self.logits(self.norm(x))

    def logits(self, h: mx.array) -> mx.array:
        z = self.embed.as_linear(h).astype(self.logit_dtype).astype(mx.float32)  # [B, L, V]
        if not self.logit_jitter:
            return z
        L, V = z.shape[-2], z.shape[-1]
        step = (mx.arange(V)[None, :] * 7 + mx.arange(L)[:, None] * 13) % (2 * self.logit_jitter + 1) - self.logit_jitter
        eps = {mx.float16: 2.0**-10, mx.bfloat16: 2.0**-7}.get(self.logit_dtype, 2.0**-23)
        ulp = eps * mx.power(2.0, mx.floor(mx.log2(mx.maximum(mx.abs(z), 2.0**-14))))
        return (z + step * ulp).astype(self.logit_dtype).astype(mx.float32)

    def mtp_forward(self, h: mx.array, next_tokens: mx.array, cache: list | None = None):
        """(h [B, L, D], x_{i+1} [B, L]) -> (head hidden [B, L, D], logits for x_{i+2} [B, L, V])."""
        out = self.mtp(h, self.embed(next_tokens), cache)
        return out, self.logits(self.mtp.norm(out))

    def make_cache(self) -> list:
        return [KVCache() if k == "attn" else RecurrentCache() for k in self.args.kinds()]

    def make_mtp_cache(self) -> list:
        return [KVCache() for _ in range(self.args.mtp_layers)]


def save_model(model: Model, folder: Path, dtype=mx.float16) -> None:
    """folder/config.json + folder/model.safetensors (float16 keeps fixtures small)."""
    from mlx.utils import tree_flatten

    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(dtype) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = {"model_type": "mtpcheck_tiny", **asdict(model.args)}
    config["mtp_num_hidden_layers"] = model.args.mtp_layers
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_model(folder: Path) -> Model:
    config = json.loads((Path(folder) / "config.json").read_text())
    args = ModelArgs(**{k: v for k, v in config.items() if k in ModelArgs.__dataclass_fields__})
    model = Model(args)
    weights = mx.load(str(Path(folder) / "model.safetensors"))
    model.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()], strict=True)
    mx.eval(model.parameters())
    return model
