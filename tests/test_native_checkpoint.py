"""The native mlx-vlm fixture (mtpcheck/fixture/real/mlx_vlm/native): the
target and its MTP head as one Qwen3.5 checkpoint with embedded ``mtp.*``
tensors, converted from mlx_vlm/target + mlx_vlm/mtp by
``mtpcheck.fixture.realbackends.write_native``. The committed folder is what
the converter writes; mlx-vlm loads the target and splits the same head out
of it; speculation on it runs exactly as on the separate pair; a broken
conversion is caught."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.fixture.realbackends import REAL_DIR, TOKENIZER_FILES, native_config, write_native
from mtpcheck.inspect import inspect_checkpoint

HAVE_VLM = importlib.util.find_spec("mlx_vlm") is not None
pytestmark = pytest.mark.skipif(not HAVE_VLM, reason="mlx-vlm is not installed (pip install 'mtpcheck[mlx-vlm]')")

VLM = REAL_DIR / "mlx_vlm"
NATIVE = VLM / "native"
PROMPT_TEXT = "id,name,city,score\n1,grace,oslo,17\n2,victor,lima,88\n3,"


def tensors(folder: Path) -> tuple[dict, dict]:
    import mlx.core as mx

    return mx.load(str(folder / "model.safetensors"), return_metadata=True)


def same_arrays(a: dict, b: dict) -> list[str]:
    """Names whose arrays differ (shape, dtype or any element), or that one side lacks."""
    import mlx.core as mx

    bad = sorted(set(a) ^ set(b))
    bad += [k for k in sorted(set(a) & set(b))
            if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype or not mx.array_equal(a[k], b[k]).item()]
    return bad


def params(model) -> dict:
    from mlx.utils import tree_flatten

    return dict(tree_flatten(model.parameters()))


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("native") / "native"
    write_native(REAL_DIR, out, update_meta=False)
    return out


@pytest.fixture(scope="module")
def backends():
    from mtpcheck.backends.mlx_vlm import load_mlx_vlm

    return load_mlx_vlm(), load_mlx_vlm(checkpoint="native")


def test_the_committed_native_folder_is_a_fresh_conversion(fresh):
    (got, got_meta), (want, want_meta) = tensors(NATIVE), tensors(fresh)
    assert got_meta == want_meta == {"format": "mlx"}
    assert same_arrays(got, want) == []
    for name in ("config.json", *TOKENIZER_FILES):
        assert (NATIVE / name).read_bytes() == (fresh / name).read_bytes(), name
    # target tensors verbatim, the head's under "mtp.", nothing else
    (target, _), (head, _) = tensors(VLM / "target"), tensors(VLM / "mtp")
    assert same_arrays(got, {**target, **{"mtp." + k: v for k, v in head.items()}}) == []
    # the recorded sources are the committed inputs
    meta = json.loads((REAL_DIR / "realbackends.json").read_text())["native"]
    for rel, digest in meta["sources_sha256"].items():
        assert hashlib.sha256((REAL_DIR / rel).read_bytes()).hexdigest() == digest, rel
    assert meta["bytes"] == sum(f.stat().st_size for f in NATIVE.iterdir())
    cfg = json.loads((NATIVE / "config.json").read_text())
    assert cfg == native_config(json.loads((VLM / "target/config.json").read_text()),
                                json.loads((VLM / "mtp/config.json").read_text()))
    assert cfg["model_type"] == "qwen3_5" and cfg["text_config"]["mtp_num_hidden_layers"] == 1


def test_inspect_reports_the_embedded_head():
    native, target = inspect_checkpoint(NATIVE), inspect_checkpoint(VLM / "target")
    assert (native.capability.kind, native.capability.validated_depth, native.mtp_tensor_count) == ("embedded", 1, 15)
    assert not native.findings
    assert target.capability.kind == "none"


def test_mlx_vlm_splits_out_the_same_head_and_loads_the_same_target():
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.utils import load

    native, kind = load_drafter(str(NATIVE), kind="mtp")
    separate, _ = load_drafter(str(VLM / "mtp"), kind="mtp")
    assert (kind, native.config.model_type) == ("mtp", "qwen3_5_mtp")
    assert same_arrays(params(native), params(separate)) == []
    # the target: mtp.* dropped, the vision tower disabled for want of weights
    model, _ = load(str(NATIVE))
    ref, _ = load(str(VLM / "target"))
    assert model.vision_tower is None
    assert same_arrays(params(model), params(ref)) == []


def test_speculation_from_the_native_checkpoint_equals_the_separate_pair(backends):
    separate, native = backends
    assert native.target_path == native.drafter_path == NATIVE
    assert native.capabilities().checkpoint_evidence and not separate.capabilities().checkpoint_evidence
    assert (native.vocab_size, native.eos_ids) == (separate.vocab_size, separate.eos_ids) == (512, [0])
    prompt = separate.encode(PROMPT_TEXT)
    req = GenerationRequest(prompt_tokens=prompt, max_tokens=32, stop_token_ids=[],
                            sampling=SamplingParams(temperature=0.0, seed=3),
                            speculation={"mode": "native_mtp", "num_draft_tokens": 3})
    a, b = separate.generate(req), native.generate(req)
    assert a.speculation.used and b.speculation.used and len(a.tokens) == 32
    assert b.tokens == a.tokens
    assert b.speculation.accept_lens == a.speculation.accept_lens and sum(a.speculation.accept_lens) > 0
    assert b.speculation.draft_lens == a.speculation.draft_lens


def test_the_loader_options_name_the_native_folder(tmp_path):
    from mtpcheck.backends.mlx_vlm import resolve_folders

    assert resolve_folders(None, None, None, "native") == (NATIVE, NATIVE)
    assert resolve_folders(str(NATIVE), None, None, None) == (NATIVE, NATIVE)
    assert resolve_folders(str(VLM), None, None, None) == (VLM / "target", VLM / "mtp")
    assert resolve_folders(None, None, None, None) == (VLM / "target", VLM / "mtp")
    with pytest.raises(ValueError, match="checkpoint="):
        resolve_folders(None, None, None, "embedded")
    with pytest.raises(ValueError, match="one checkpoint"):
        resolve_folders(str(NATIVE), None, None, "separate")


def _broken(fresh: Path, tmp_path: Path, how: str) -> Path:
    import mlx.core as mx

    out = tmp_path / how
    shutil.copytree(fresh, out)
    weights, meta = tensors(out)
    cfg = json.loads((out / "config.json").read_text())
    if how == "mtp_tensor_dropped":
        del weights["mtp.fc.weight"]
    elif how == "mtp_prefix_missing":
        weights = {k.removeprefix("mtp."): v for k, v in weights.items()}
    elif how == "no_mlx_format_metadata":
        meta = {}
    elif how == "text_model_type":
        cfg = cfg["text_config"]
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata=meta)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("how, error", [
    ("mtp_tensor_dropped", r"(?s)could not load the MTP head from .*fc\.weight"),
    ("mtp_prefix_missing", "carries no MTP tensors"),
    ("text_model_type", "not an MTP head"),
])
def test_a_broken_conversion_fails_to_load(fresh, tmp_path, how, error):
    from mtpcheck.backends.mlx_vlm import load_mlx_vlm

    with pytest.raises(ValueError, match=error):
        load_mlx_vlm(checkpoint="native", target=str(_broken(fresh, tmp_path, how)))


def test_a_broken_conversion_is_seen_by_inspect_or_the_weight_comparison(fresh, tmp_path):
    from mlx_vlm.speculative.drafters import load_drafter

    # without the "mtp." prefix inspect finds no embedded head
    assert inspect_checkpoint(_broken(fresh, tmp_path, "mtp_prefix_missing")).capability.kind == "none"
    # mlx-vlm itself loads a qwen3_5_text folder as the *target* and calls it an mtp drafter
    wrong, kind = load_drafter(str(_broken(fresh, tmp_path, "text_model_type")), kind="mtp")
    assert (kind, wrong.config.model_type) == ("mtp", "qwen3_5_text")
    # without format=mlx the splitter takes the tensors for Hugging Face layout and
    # adds 1 to the head's RMSNorm weights: it loads, and only the comparison sees it
    shifted, _ = load_drafter(str(_broken(fresh, tmp_path, "no_mlx_format_metadata")), kind="mtp")
    separate, _ = load_drafter(str(VLM / "mtp"), kind="mtp")
    bad = same_arrays(params(shifted), params(separate))
    assert bad and all(k.endswith("norm.weight") or "norm_" in k for k in bad), bad
