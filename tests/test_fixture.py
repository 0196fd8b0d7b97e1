"""The shipped tiny fixture: files, tokenizer, models, and its measured quality."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("MLX_DISABLE_COMPILE", "1")

from mtpcheck.fixture import (  # noqa: E402
    FIXTURE_DIR,
    KINDS,
    PROMPT_VARIANTS,
    PROMPTS,
    check_values,
    corpus,  # noqa: E402
    heldout_chunks,
    load_fixture,
)

FILES = [
    "fixture.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "target/config.json",
    "target/model.safetensors",
    "assistant/config.json",
    "assistant/model.safetensors",
]
METRICS = [("mtp", "greedy"), ("mtp", "t1"), ("assistant", "greedy"), ("assistant", "t1")]


@pytest.fixture(scope="module")
def fx():
    return load_fixture()


@pytest.fixture(scope="module")
def measured(fx):
    target, assistant, tok, _ = fx
    return check_values(target, assistant, tok)


@pytest.fixture(scope="module")
def measured_random(fx):
    import mlx.core as mx

    from mtpcheck.engine.model import Model, ModelArgs

    _, _, tok, meta = fx
    mx.random.seed(meta["check"]["random_init_seed"])
    target = Model(ModelArgs(**meta["target"]["args"]))
    assistant = Model(ModelArgs(**meta["assistant"]["args"]))
    mx.eval(target.parameters(), assistant.parameters())
    return check_values(target, assistant, tok)


def test_files_present_and_small():
    sizes = {f: (FIXTURE_DIR / f).stat().st_size for f in FILES}
    assert all(s > 0 for s in sizes.values())
    assert sum(sizes.values()) <= 5 * 1024 * 1024, sizes


def test_shapes_and_vocab_agree(fx):
    target, assistant, tok, meta = fx
    V = tok.get_vocab_size()
    assert target.args.vocab_size == assistant.args.vocab_size == V == meta["tokenizer"]["vocab_size"]
    assert target.embed.weight.shape[0] == assistant.embed.weight.shape[0] == V
    assert target.args.kinds() == ["attn", "gla", "attn"] and target.args.mtp_layers == 1
    assert assistant.args.mtp_layers == 0 and assistant.args.dim < target.args.dim
    eos = meta["tokenizer"]["eos_token"]
    assert tok.token_to_id(eos) == meta["tokenizer"]["eos_id"] == 0
    assert tok.encode(eos).ids == [0]
    cfg = json.loads((FIXTURE_DIR / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["eos_token"] == eos


def test_tokenizer_round_trips(fx):
    _, _, tok, _ = fx
    assert set(PROMPTS) == set(KINDS) == set(PROMPT_VARIANTS)
    texts = [p for ps in PROMPT_VARIANTS.values() for p in ps]
    texts += corpus.documents("structured", 3) + corpus.documents("prose", 3)
    texts += ["unicode: é ü 字 🙂", "  leading spaces\ttabs\n\n"]
    for text in texts:
        ids = tok.encode(text).ids
        assert max(ids) < tok.get_vocab_size()
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_prompts_are_not_training_text():
    text = corpus.corpus_text()
    for kind, prompts in PROMPT_VARIANTS.items():
        assert PROMPTS[kind] == prompts[0]
        for p in prompts:
            assert p not in text, p


def test_finite_logits(fx):
    import mlx.core as mx

    target, assistant, tok, _ = fx
    for prompt in PROMPTS.values():
        x = mx.array([tok.encode(prompt).ids])
        h, logits = target(x)
        hh, lq = target.mtp_forward(h[:, :-1], x[:, 1:])
        _, lq2 = target.mtp_forward(hh[:, :-1], x[:, 2:])
        _, la = assistant(x)
        for a in (h, logits, hh, lq, lq2, la):
            assert bool(mx.all(mx.isfinite(a)).item())
        assert logits.shape == (1, x.shape[1], tok.get_vocab_size()) == la.shape


@pytest.mark.parametrize("kind", KINDS)
def test_acceptance_proxies_in_band(fx, measured, kind):
    _, _, _, meta = fx
    check = meta["check"]
    rec, got = check["values"][kind], measured[kind]
    assert got["positions"] == rec["positions"]
    assert abs(got["target_ce"] - rec["target_ce"]) <= check["target_ce_band"]
    for who, metric in METRICS:
        assert abs(got[who][metric] - rec[who][metric]) <= check["band"], (kind, who, metric, got[who])


@pytest.mark.parametrize("kind", KINDS)
def test_random_weights_fall_outside_band(fx, measured_random, kind):
    _, _, _, meta = fx
    check = meta["check"]
    rec, got = check["values"][kind], measured_random[kind]
    assert abs(got["target_ce"] - rec["target_ce"]) > check["target_ce_band"]
    for who, metric in METRICS:
        assert abs(got[who][metric] - rec[who][metric]) > check["band"], (kind, who, metric, got[who])


def test_structured_is_easier_than_prose(fx):
    measured = fx[3]["measured"]
    s, p = measured["structured"], measured["prose"]
    assert s["mtp"]["greedy"] >= 0.6
    assert s["target_ce"] < p["target_ce"]
    for who, metric in METRICS:
        assert s[who][metric] > p[who][metric], (who, metric)


def test_check_sample_is_regenerated(fx):
    _, _, tok, meta = fx
    for kind in KINDS:
        chunks = heldout_chunks(tok, kind)
        n = sum(len(c) - 1 for c in chunks)
        assert n == meta["check"]["values"][kind]["positions"]
        assert all(c[0] == 0 for c in chunks[:1])  # the stream starts with EOS


def test_corpus_is_deterministic():
    sha = lambda s: hashlib.sha256(s.encode("utf-8")).hexdigest()
    n = 20_000
    a, b = corpus.corpus_text(corpus.TRAIN_SEED, n), corpus.corpus_text(corpus.TRAIN_SEED, n)
    assert sha(a) == sha(b)
    assert sha(corpus.corpus_text(corpus.TRAIN_SEED + 1, n)) != sha(a)
    assert corpus.documents("prose", 5) == corpus.documents("prose", 5)
    assert corpus.documents("prose", 5) != corpus.documents("prose", 5, seed=1)
    assert a.count(corpus.EOS) == len(corpus.generate_corpus(corpus.TRAIN_SEED, n))
    kinds = {k for k, _ in corpus.generate_corpus(corpus.TRAIN_SEED, n)}
    assert kinds == set(KINDS)


def test_corpus_matches_the_one_the_fixture_was_trained_on(fx):
    c = fx[3]["corpus"]
    assert corpus.corpus_sha256(c["seed"], c["n_bytes"]) == c["sha256"]


def test_import_does_not_load_mlx():
    code = "import sys, mtpcheck.fixture; assert 'mlx' not in sys.modules, 'mlx imported'; print(mtpcheck.fixture.PROMPTS['prose'])"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
