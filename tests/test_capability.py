"""The reference loader validates its assistant (seed 000) and the capability
clauses catch a backend whose declarations the artifact does not back."""

import json
import shutil

import pytest

from mtpcheck.fixture import FIXTURE_DIR
from mtpcheck.inspect import AssistantMismatchError


def test_mismatched_assistant_tokenizer_is_refused_at_load(tmp_path):
    from mtpcheck.backends.reference import load_reference

    folder = tmp_path / "fixture"
    shutil.copytree(FIXTURE_DIR, folder)
    tok = json.loads((folder / "assistant" / "tokenizer.json").read_text())
    tok["model"]["merges"] = tok["model"]["merges"][:-1]  # one merge fewer: another tokenizer
    (folder / "assistant" / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(AssistantMismatchError, match="tokenizer"):
        load_reference(fixture=str(folder))


def test_mismatched_assistant_vocabulary_is_refused_at_load(tmp_path):
    from mtpcheck.backends.reference import load_reference

    folder = tmp_path / "fixture"
    shutil.copytree(FIXTURE_DIR, folder)
    cfg = json.loads((folder / "assistant" / "config.json").read_text())
    cfg["vocab_size"] = 511
    (folder / "assistant" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AssistantMismatchError, match="vocab"):
        load_reference(fixture=str(folder))


def test_capability_honesty_catches_a_head_the_weights_lack(tmp_path):
    """A backend declaring embedded MTP over a target folder without MTP tensors fails CAP-HONESTY's check."""
    from mtpcheck.inspect import inspect_checkpoint

    folder = tmp_path / "target"
    shutil.copytree(FIXTURE_DIR / "target", folder)
    import mlx.core as mx

    weights = {k: v for k, v in mx.load(str(folder / "model.safetensors")).items() if not k.startswith("mtp.")}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    cap = inspect_checkpoint(folder).capability
    assert cap.kind == "none"  # the config still declares mtp_num_hidden_layers=1: a false positive
    report = inspect_checkpoint(folder)
    assert any("false" in str(f).lower() or "declares" in str(f) for f in report.findings), report.findings
