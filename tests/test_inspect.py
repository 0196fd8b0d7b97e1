"""Tests for mtpcheck.inspect: checkpoint evidence for MTP heads.

Every artifact is synthetic and written into tmp_path by the test itself:
safetensors files with json + struct, GGUF files with gguf.GGUFWriter.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpcheck.contracts.capability import (
    Evidence,
    InspectionReport,
    MtpCapability,
    PairReport,
)
from mtpcheck.inspect import (
    MAX_HEADER_BYTES,
    AssistantMismatchError,
    CapabilityError,
    GGUFError,
    InspectError,
    SafetensorsHeaderError,
    TokenizerError,
    add_parser,
    cap_depth,
    check_pair,
    classify_tensor_names,
    inspect_checkpoint,
    read_safetensors_header,
    run,
    tokenizer_fingerprint,
)

# ----------------------------------------------------------------------- writers


def write_safetensors(path: Path, tensors: dict[str, tuple[int, ...]], metadata=None) -> Path:
    """A valid safetensors file: u64 LE header length, JSON header, zeroed F32 data."""
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, shape in tensors.items():
        nbytes = 4 * math.prod(shape)
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return path


def write_raw_header(path: Path, header_bytes: bytes, claimed: int | None = None) -> Path:
    n = len(header_bytes) if claimed is None else claimed
    path.write_bytes(struct.pack("<Q", n) + header_bytes)
    return path


def write_config(folder: Path, **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


VOCAB = {"a": 0, "b": 1, "ab": 2, "c": 3}
MERGES = ["a b"]


def write_tokenizer(folder: Path, vocab=None, merges=None, *, indent=None, extra=None) -> Path:
    tok = {
        "version": "1.0",
        "added_tokens": [],
        "model": {
            "type": "BPE",
            "vocab": VOCAB if vocab is None else vocab,
            "merges": MERGES if merges is None else merges,
        },
    }
    if extra:
        tok.update(extra)
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(tok, indent=indent))
    return path


def base_layers(n: int, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
    t: dict[str, tuple[int, ...]] = {
        f"{prefix}embed_tokens.weight": (4, 2),
        "lm_head.weight": (4, 2),
    }
    for i in range(n):
        t[f"{prefix}layers.{i}.self_attn.q_proj.weight"] = (2, 2)
        t[f"{prefix}layers.{i}.mlp.down_proj.weight"] = (2, 2)
    return t


def write_gguf(
    path: Path,
    tensor_names: list[str],
    *,
    arch: str = "glm4moe",
    nextn: int | None = None,
    hidden: int = 8,
    tokens: list[str] | None = None,
    merges: list[str] | None = None,
) -> Path:
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(3)
    w.add_embedding_length(hidden)
    if nextn is not None:
        w.add_nextn_predict_layers(nextn)
    if tokens is not None:
        w.add_token_list(tokens)
    if merges is not None:
        w.add_token_merges(merges)
    for name in tensor_names:
        w.add_tensor(name, np.zeros((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="mtpcheck")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inspect", *argv])
    rc = run(args)
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------- embedded MTP heads


@pytest.mark.parametrize(
    "prefix", ["mtp.layers.", "model.mtp.layers.", "language_model.mtp.layers.", "mtp_heads."]
)
def test_embedded_mtp_tensors_counted_per_layer(tmp_path, prefix):
    folder = write_config(
        tmp_path / "m",
        model_type="qwen3_5",
        hidden_size=2,
        vocab_size=4,
        num_hidden_layers=2,
        mtp_num_hidden_layers=2,
    )
    tensors = base_layers(2)
    for i in (0, 1):
        tensors[f"{prefix}{i}.self_attn.q_proj.weight"] = (2, 2)
        tensors[f"{prefix}{i}.mlp.up_proj.weight"] = (2, 2)
    write_safetensors(folder / "model.safetensors", tensors)

    report = inspect_checkpoint(folder)
    assert isinstance(report, InspectionReport)
    cap = report.capability
    assert cap.kind == "embedded"
    assert cap.validated_depth == 2
    assert report.mtp_layer_indices == [0, 1]
    assert report.mtp_tensor_count == 4
    assert report.findings == []
    assert any(e.kind == "tensor" and e.source == "model.safetensors" for e in cap.evidence)
    assert any(e.kind == "config" and "mtp_num_hidden_layers=2" in e.detail for e in cap.evidence)


def test_qwen3_next_unindexed_mtp_tensors_and_text_config(tmp_path):
    # mlx-vlm qwen3_5 style: MTP fields live in text_config; mtp.fc has no layer index
    folder = write_config(
        tmp_path / "m",
        model_type="qwen3_5",
        text_config={
            "model_type": "qwen3_5_text",
            "hidden_size": 2,
            "vocab_size": 4,
            "num_hidden_layers": 1,
            "mtp_num_hidden_layers": 1,
        },
    )
    tensors = base_layers(1, prefix="language_model.model.")
    tensors |= {
        "mtp.fc.weight": (2, 4),
        "mtp.norm.weight": (2,),
        "mtp.layers.0.self_attn.q_proj.weight": (2, 2),
    }
    write_safetensors(folder / "model.safetensors", tensors)
    report = inspect_checkpoint(folder)
    assert report.config is not None
    assert report.config.mtp_field == "text_config.mtp_num_hidden_layers"
    assert report.config.hidden_size == 2
    assert report.capability.kind == "embedded"
    assert report.capability.validated_depth == 1
    assert report.mtp_tensor_count == 3
    assert report.findings == []


def test_names_that_only_look_like_mtp_are_not_counted():
    cls = classify_tensor_names(
        [
            "model.layers.0.mlp.gate_proj.weight",
            "smtp.layers.0.w",
            "model.mtpx.weight",
            "nextnorm.w",
        ]
    )
    assert cls.mtp_names == []
    assert cls.depth == 0


# ------------------------------------------------------------ DeepSeek-style nextn


def test_deepseek_nextn_layers_beyond_num_hidden_layers(tmp_path):
    folder = write_config(
        tmp_path / "ds",
        model_type="deepseek_v3",
        hidden_size=2,
        vocab_size=4,
        num_hidden_layers=2,
        num_nextn_predict_layers=1,
    )
    tensors = base_layers(2)
    tensors |= {
        "model.layers.2.eh_proj.weight": (2, 4),
        "model.layers.2.enorm.weight": (2,),
        "model.layers.2.hnorm.weight": (2,),
        "model.layers.2.shared_head.head.weight": (4, 2),
        "model.layers.2.self_attn.q_proj.weight": (2, 2),
        # an extra block with no nextn projection: warned about, not counted
        "model.layers.3.self_attn.q_proj.weight": (2, 2),
    }
    write_safetensors(folder / "model.safetensors", tensors)
    report = inspect_checkpoint(folder)
    assert report.capability.kind == "embedded"
    assert report.capability.validated_depth == 1
    assert report.mtp_layer_indices == [2]
    assert report.mtp_tensor_count == 5  # the whole layer 2, layer 3 excluded
    assert report.findings == []
    assert any("layers.3" in w and "not counted" in w for w in report.capability.warnings)


def test_declared_depth_differs_from_weights_is_a_named_mismatch(tmp_path):
    folder = write_config(
        tmp_path / "ds",
        model_type="deepseek_v3",
        hidden_size=2,
        vocab_size=4,
        num_hidden_layers=2,
        num_nextn_predict_layers=2,
    )
    tensors = base_layers(2) | {
        "model.layers.2.eh_proj.weight": (2, 4),
        "model.layers.2.enorm.weight": (2,),
    }
    write_safetensors(folder / "model.safetensors", tensors)
    report = inspect_checkpoint(folder)
    assert [f.code for f in report.findings] == ["depth_mismatch"]
    msg = report.findings[0].message
    assert "num_nextn_predict_layers=2" in msg and "1 MTP prediction layer" in msg
    assert report.capability.validated_depth == 1


def test_weights_with_mtp_but_config_silent_is_a_warning(tmp_path):
    folder = write_config(
        tmp_path / "m", model_type="qwen3", hidden_size=2, vocab_size=4, num_hidden_layers=1
    )
    write_safetensors(folder / "model.safetensors", base_layers(1) | {"mtp.layers.0.w": (2, 2)})
    report = inspect_checkpoint(folder)
    assert report.findings == []
    assert report.capability.kind == "embedded"
    assert any("declares none" in w for w in report.capability.warnings)


# -------------------------------------------------------------- separate drafter


def test_separate_mtp_drafter_by_model_type(tmp_path):
    folder = write_config(
        tmp_path / "drafter",
        model_type="qwen3_5_mtp",
        hidden_size=2,
        vocab_size=4,
        mtp_num_hidden_layers=1,
    )
    # a stand-alone drafter may drop the "mtp." prefix from its names
    write_safetensors(
        folder / "model.safetensors",
        {
            "fc.weight": (2, 4),
            "layers.0.self_attn.q_proj.weight": (2, 2),
            "layers.0.mlp.up_proj.weight": (2, 2),
            "norm.weight": (2,),
        },
    )
    report = inspect_checkpoint(folder)
    assert report.capability.kind == "separate"
    assert report.capability.validated_depth == 1
    assert report.mtp_tensor_count == 4
    assert report.findings == []
    assert any("qwen3_5_mtp" in e.detail for e in report.capability.evidence)


def test_separate_drafter_holding_only_mtp_tensors(tmp_path):
    folder = tmp_path / "heads"
    folder.mkdir()
    write_safetensors(
        folder / "model.safetensors",
        {"mtp.layers.0.w": (2, 2), "mtp.layers.1.w": (2, 2), "mtp.norm.weight": (2,)},
    )
    report = inspect_checkpoint(folder)
    assert report.config is None
    assert report.capability.kind == "separate"
    assert report.capability.validated_depth == 2


def test_target_declaring_a_drafter_is_reported(tmp_path):
    write_config(tmp_path / "drafter", model_type="qwen3_5_mtp")
    folder = write_config(
        tmp_path / "target",
        model_type="qwen3_5",
        hidden_size=2,
        vocab_size=4,
        mtp_drafter="../drafter",
    )
    write_safetensors(folder / "model.safetensors", base_layers(1))
    report = inspect_checkpoint(folder)
    assert report.declared_drafter == "../drafter"
    drafter_ev = [e for e in report.capability.evidence if e.kind == "drafter"]
    assert drafter_ev and "local folder of that name exists" in drafter_ev[0].detail
    assert report.capability.kind == "none"


# ---------------------------------------------------------- config false positive


def test_config_only_mtp_is_a_false_positive_in_words(tmp_path):
    folder = write_config(
        tmp_path / "m",
        model_type="qwen3_5",
        hidden_size=2,
        vocab_size=4,
        num_hidden_layers=2,
        mtp_num_hidden_layers=1,
    )
    write_safetensors(folder / "model.safetensors", base_layers(2))
    report = inspect_checkpoint(folder)
    assert report.capability.kind == "none"
    assert report.capability.validated_depth == 0
    assert not report.ok
    assert [f.code for f in report.findings] == ["config_false_positive"]
    assert report.findings[0].message == (
        "config.json declares mtp_num_hidden_layers=1 but no MTP tensors were found in "
        "model.safetensors (evidence: weight names)"
    )


def test_mtp_model_type_without_any_tensor_is_a_false_positive(tmp_path):
    folder = write_config(tmp_path / "d", model_type="qwen3_5_mtp", hidden_size=2, vocab_size=4)
    write_safetensors(folder / "model.safetensors", {})
    report = inspect_checkpoint(folder)
    assert report.capability.kind == "none"
    assert [f.code for f in report.findings] == ["config_false_positive"]


# ------------------------------------------------------------------ index.json


def test_index_weight_map_is_used_without_reading_shards(tmp_path):
    folder = write_config(
        tmp_path / "m",
        model_type="qwen3_5",
        hidden_size=2,
        vocab_size=4,
        num_hidden_layers=1,
        mtp_num_hidden_layers=1,
    )
    wmap = {n: "model-00001-of-00002.safetensors" for n in base_layers(1)}
    wmap["mtp.layers.0.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors"
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wmap}))
    # shards present but garbage: the index alone must be read
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"\xff" * 64)
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 64)
    report = inspect_checkpoint(folder)
    assert report.weight_sources == ["model.safetensors.index.json"]
    assert report.capability.kind == "embedded"
    assert report.capability.validated_depth == 1
    assert report.bytes_read == index.stat().st_size + (folder / "config.json").stat().st_size
    assert any(e.kind == "index" for e in report.capability.evidence)


def test_index_false_positive_names_the_index(tmp_path):
    folder = write_config(tmp_path / "m", num_nextn_predict_layers=1, num_hidden_layers=1)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: "a.safetensors" for n in base_layers(1)}})
    )
    report = inspect_checkpoint(folder)
    assert report.findings[0].message == (
        "config.json declares num_nextn_predict_layers=1 but no MTP tensors were found in "
        "model.safetensors.index.json weight_map (evidence: weight names)"
    )
    assert any("absent" in w for w in report.capability.warnings)


def test_index_without_weight_map_is_bad_input(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(InspectError, match="weight_map"):
        inspect_checkpoint(folder)


# --------------------------------------------------------- malformed safetensors


def test_truncated_header_shorter_than_length_prefix(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00")
    with pytest.raises(SafetensorsHeaderError, match="truncated safetensors header"):
        inspect_checkpoint(path)


def test_header_claiming_more_bytes_than_the_file_holds(tmp_path):
    path = write_raw_header(tmp_path / "model.safetensors", b'{"a": 1}', claimed=4096)
    with pytest.raises(SafetensorsHeaderError, match="claims 4096 bytes but the file holds only 8"):
        inspect_checkpoint(path)


def test_absurd_header_length_is_refused_before_reading(tmp_path):
    path = write_raw_header(tmp_path / "model.safetensors", b"{}", claimed=MAX_HEADER_BYTES + 1)
    with pytest.raises(SafetensorsHeaderError, match="exceeds the .* byte limit"):
        inspect_checkpoint(path)
    path = write_raw_header(tmp_path / "x.safetensors", b"{}", claimed=2**64 - 1)
    with pytest.raises(SafetensorsHeaderError, match="refusing"):
        read_safetensors_header(path)


@pytest.mark.parametrize(
    "body, pattern",
    [
        (b'{"a": {"dtype": "F32", ', "not valid JSON"),
        (b"[1, 2, 3]", "not an object"),
        (b"[" * 100_000, "not valid JSON"),  # recursion bomb
        (b'{"a": ' + b"9" * 5000 + b"}", "not valid JSON"),  # int digit limit
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', "truncated file"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', "data_offsets"),
    ],
)
def test_invalid_json_headers_are_named_errors(tmp_path, body, pattern):
    path = write_raw_header(tmp_path / "model.safetensors", body)
    with pytest.raises(SafetensorsHeaderError, match=pattern):
        inspect_checkpoint(path)


def test_non_utf8_tensor_names(tmp_path):
    body = b'{"mtp.layers.0.\xff\xfe": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
    path = write_raw_header(tmp_path / "model.safetensors", body)
    with pytest.raises(SafetensorsHeaderError, match="not valid UTF-8"):
        inspect_checkpoint(path)
    # a JSON escape for a lone surrogate is valid JSON but not a UTF-8 name
    body = b'{"mtp.\\ud800": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
    path = write_raw_header(tmp_path / "b.safetensors", body)
    with pytest.raises(SafetensorsHeaderError, match="not valid UTF-8"):
        inspect_checkpoint(path)


def test_bytes_read_stay_bounded_for_a_large_tensor(tmp_path):
    folder = write_config(
        tmp_path / "m", model_type="qwen3", hidden_size=512, vocab_size=512, num_hidden_layers=1
    )
    path = write_safetensors(
        folder / "model.safetensors",
        {"model.embed_tokens.weight": (512, 512), "mtp.layers.0.w": (2, 2)},
    )
    assert path.stat().st_size > 1_000_000
    report = inspect_checkpoint(folder)
    assert 0 < report.bytes_read < 64 * 1024
    header, nbytes = read_safetensors_header(path)
    assert nbytes < 1024 and "mtp.layers.0.w" in header


def test_missing_path_and_empty_folder_are_bad_input(tmp_path):
    with pytest.raises(InspectError, match="no such file or directory"):
        inspect_checkpoint(tmp_path / "nope")
    with pytest.raises(InspectError, match="no \\*.safetensors"):
        inspect_checkpoint(tmp_path)


def test_invalid_config_json_is_bad_input(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    write_safetensors(folder / "model.safetensors", base_layers(1))
    with pytest.raises(InspectError, match="config.json is not valid JSON"):
        inspect_checkpoint(folder)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=256))
def test_fuzz_random_bytes_never_crash(tmp_path, data):
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(data)
    try:
        report = inspect_checkpoint(path)
    except (SafetensorsHeaderError, GGUFError):  # a file starting b"GGUF" is sniffed as GGUF
        return
    assert report.format == "safetensors"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda c: (
                st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12), c, max_size=3)
            ),
            max_leaves=12,
        ).map(lambda o: json.dumps(o).encode()),
    ),
    slack=st.integers(0, 16),
)
def test_fuzz_valid_prefix_random_body_never_crash(tmp_path, body, slack):
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body + bytes(slack))
    try:
        report = inspect_checkpoint(path)
    except SafetensorsHeaderError:
        return
    assert report.bytes_read == 8 + len(body)


# ----------------------------------------------------------------------- GGUF


def test_gguf_with_nextn_metadata_and_tensors(tmp_path):
    path = write_gguf(
        tmp_path / "m.gguf",
        [
            "blk.0.attn_q.weight",
            "blk.1.attn_q.weight",
            "blk.2.attn_q.weight",
            "blk.2.nextn.eh_proj.weight",
            "blk.2.nextn.enorm.weight",
        ],
        nextn=1,
    )
    report = inspect_checkpoint(path)
    assert report.format == "gguf"
    assert report.config.mtp_field == "glm4moe.nextn_predict_layers"
    assert report.config.mtp_declared == 1
    assert report.capability.kind == "embedded"
    assert report.capability.validated_depth == 1
    assert report.mtp_layer_indices == [2]
    assert report.mtp_tensor_count == 3
    assert report.findings == []
    kinds = {e.kind for e in report.capability.evidence}
    assert {"gguf_metadata", "gguf_tensor"} <= kinds
    assert 0 < report.bytes_read < path.stat().st_size


def test_gguf_without_nextn(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", ["blk.0.attn_q.weight"], arch="llama")
    report = inspect_checkpoint(tmp_path)  # folder with a single GGUF
    assert report.capability.kind == "none"
    assert report.config.mtp_field is None
    assert report.findings == []
    assert report.weight_sources == [path.name]


def test_gguf_metadata_claiming_nextn_without_tensors_is_a_false_positive(tmp_path):
    write_gguf(tmp_path / "m.gguf", ["blk.0.attn_q.weight"], nextn=1)
    report = inspect_checkpoint(tmp_path / "m.gguf")
    assert [f.code for f in report.findings] == ["config_false_positive"]
    assert "glm4moe.nextn_predict_layers=1" in report.findings[0].message
    assert "GGUF tensor names" in report.findings[0].message


def test_gguf_nextn_tensors_without_metadata_warn(tmp_path):
    write_gguf(tmp_path / "m.gguf", ["blk.0.attn_q.weight", "blk.1.nextn.eh_proj.weight"])
    report = inspect_checkpoint(tmp_path / "m.gguf")
    assert report.capability.validated_depth == 1
    assert report.findings == []
    assert any("nextn_predict_layers" in w for w in report.capability.warnings)


def test_malformed_gguf_files(tmp_path):
    good = write_gguf(tmp_path / "good.gguf", ["blk.0.attn_q.weight"], nextn=1)
    data = good.read_bytes()
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(data[:60])
    with pytest.raises(GGUFError, match="malformed GGUF"):
        inspect_checkpoint(bad)
    magic = tmp_path / "magic.gguf"
    magic.write_bytes(b"GGML" + data[4:])
    with pytest.raises(GGUFError, match="not a GGUF file"):
        inspect_checkpoint(magic)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GGUFError):
        inspect_checkpoint(empty)
    # one key whose uint8 array claims 2**62 items: gguf.GGUFReader alone would spin
    hostile = tmp_path / "hostile.gguf"
    key = b"general.junk"
    hostile.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", len(key))
        + key
        + struct.pack("<IIQ", 9, 0, 2**62)
        + bytes(32)
    )
    with pytest.raises(GGUFError, match="runs past the end"):
        inspect_checkpoint(hostile)
    counts = tmp_path / "counts.gguf"
    counts.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40) + bytes(16))
    with pytest.raises(GGUFError, match="more than a"):
        inspect_checkpoint(counts)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tail=st.binary(max_size=160), counts=st.tuples(st.integers(0, 4), st.integers(0, 4)))
def test_fuzz_gguf_header_never_crash(tmp_path, tail, counts):
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, *counts) + tail)
    try:
        inspect_checkpoint(path)
    except GGUFError:
        pass


# ----------------------------------------------------------------- depth rules


def test_cap_depth_rules():
    none = MtpCapability(kind="none", validated_depth=0)
    one = MtpCapability(
        kind="embedded",
        validated_depth=1,
        evidence=[Evidence(source="model.safetensors", kind="tensor", detail="x")],
    )
    assert cap_depth(none, 0, recurrent_ok=False) == 0
    with pytest.raises(CapabilityError, match="no MTP heads"):
        cap_depth(none, 1, recurrent_ok=True)
    assert cap_depth(one, 3, recurrent_ok=False) == 1
    assert cap_depth(one, 3, recurrent_ok=True) == 3
    assert cap_depth(one, 1, recurrent_ok=False) == 1
    with pytest.raises(ValueError):
        cap_depth(one, -1, recurrent_ok=False)


def test_contracts_forbid_extra_fields():
    with pytest.raises(ValueError):
        MtpCapability(kind="none", validated_depth=0, bogus=1)
    with pytest.raises(ValueError):
        MtpCapability(kind="embedded", validated_depth=-1)


# ------------------------------------------------------------------- pair check


def make_target(root: Path, hidden=2, vocab=4, **tok) -> Path:
    folder = write_config(
        root / "target",
        model_type="qwen3_5",
        hidden_size=hidden,
        vocab_size=vocab,
        num_hidden_layers=1,
    )
    write_safetensors(folder / "model.safetensors", base_layers(1))
    write_tokenizer(folder, **tok)
    return folder


def make_drafter(root: Path, hidden=2, vocab=4, **tok) -> Path:
    folder = write_config(
        root / "drafter",
        model_type="qwen3_5_mtp",
        hidden_size=hidden,
        vocab_size=vocab,
        mtp_num_hidden_layers=1,
    )
    write_safetensors(folder / "model.safetensors", {"mtp.layers.0.w": (2, 2)})
    write_tokenizer(folder, **tok)
    return folder


def test_pair_matching(tmp_path):
    # formatting and unrelated fields do not change the fingerprint
    target = make_target(tmp_path)
    drafter = make_drafter(tmp_path, indent=4, extra={"normalizer": {"type": "NFC"}})
    report = check_pair(target, drafter)
    assert isinstance(report, PairReport)
    assert report.ok and report.mismatches == []
    assert [c.field for c in report.comparisons] == ["hidden_size", "vocab_size", "tokenizer"]
    assert all(c.match for c in report.comparisons)
    assert tokenizer_fingerprint(target) == tokenizer_fingerprint(drafter / "tokenizer.json")


def test_pair_hidden_size_mismatch(tmp_path):
    target, drafter = make_target(tmp_path, hidden=2), make_drafter(tmp_path, hidden=3)
    with pytest.raises(AssistantMismatchError) as info:
        check_pair(target, drafter)
    assert isinstance(info.value, ValueError)
    assert info.value.field == "hidden_size"
    assert (info.value.target_value, info.value.drafter_value) == (2, 3)
    assert "hidden_size: target=2 drafter=3" in str(info.value)


def test_pair_vocab_size_mismatch(tmp_path):
    target, drafter = make_target(tmp_path, vocab=4), make_drafter(tmp_path, vocab=5)
    with pytest.raises(AssistantMismatchError, match="vocab_size: target=4 drafter=5"):
        check_pair(target, drafter)
    report = check_pair(target, drafter, strict=False)
    assert [c.field for c in report.mismatches] == ["vocab_size"]


def test_pair_tokenizer_merges_mismatch(tmp_path):
    target = make_target(tmp_path)
    drafter = make_drafter(tmp_path, merges=["a b", "ab c"])
    with pytest.raises(AssistantMismatchError) as info:
        check_pair(target, drafter)
    assert info.value.field == "tokenizer"
    fp_t, fp_d = tokenizer_fingerprint(target), tokenizer_fingerprint(drafter)
    assert fp_t != fp_d
    assert fp_t in str(info.value) and fp_d in str(info.value)


def test_fingerprint_merges_string_and_pair_forms_agree(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_tokenizer(a, merges=["a b"])
    write_tokenizer(b, merges=[["a", "b"]])
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    write_tokenizer(b, vocab={**VOCAB, "d": 4})
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(b)


def test_pair_missing_tokenizer_names_the_file(tmp_path):
    target = make_target(tmp_path)
    drafter = make_drafter(tmp_path)
    (drafter / "tokenizer.json").unlink()
    with pytest.raises(
        TokenizerError, match=r"drafter[/\\]tokenizer.json: tokenizer.json not found"
    ):
        check_pair(target, drafter)


def test_pair_of_gguf_files(tmp_path):
    names = ["blk.0.attn_q.weight", "blk.1.nextn.eh_proj.weight"]
    t = write_gguf(tmp_path / "t.gguf", names, nextn=1, tokens=list(VOCAB), merges=MERGES)
    d = write_gguf(tmp_path / "d.gguf", names[1:], nextn=1, tokens=list(VOCAB), merges=MERGES)
    assert check_pair(t, d).ok
    d2 = write_gguf(tmp_path / "d2.gguf", names[1:], nextn=1, tokens=list(VOCAB), merges=[])
    with pytest.raises(AssistantMismatchError, match="tokenizer"):
        check_pair(t, d2)
    no_tok = write_gguf(tmp_path / "n.gguf", names, nextn=1)
    with pytest.raises(TokenizerError, match="n.gguf"):
        tokenizer_fingerprint(no_tok)


# -------------------------------------------------------------------------- CLI


def test_cli_exit_0_for_a_consistent_checkpoint(tmp_path, capsys):
    folder = write_config(
        tmp_path / "m",
        model_type="qwen3_5",
        hidden_size=2,
        vocab_size=4,
        num_hidden_layers=1,
        mtp_num_hidden_layers=1,
    )
    write_safetensors(folder / "model.safetensors", base_layers(1) | {"mtp.layers.0.w": (2, 2)})
    rc, out, err = cli([str(folder)], capsys)
    assert rc == 0, err
    assert err == ""
    assert "MTP: embedded, validated depth 1" in out
    rc, out, err = cli([str(folder), "--json"], capsys)
    assert rc == 0
    report = InspectionReport.model_validate_json(out)
    assert report.capability.validated_depth == 1


def test_cli_exit_1_for_a_false_positive(tmp_path, capsys):
    folder = write_config(
        tmp_path / "m",
        model_type="qwen3_5",
        hidden_size=2,
        vocab_size=4,
        num_hidden_layers=1,
        mtp_num_hidden_layers=1,
    )
    write_safetensors(folder / "model.safetensors", base_layers(1))
    rc, out, err = cli([str(folder)], capsys)
    assert rc == 1
    assert "FALSE POSITIVE" in out
    assert len(err.strip().splitlines()) == 1
    assert "declares mtp_num_hidden_layers=1 but no MTP tensors" in err


def test_cli_exit_1_for_a_drafter_mismatch(tmp_path, capsys):
    target, drafter = make_target(tmp_path, hidden=2), make_drafter(tmp_path, hidden=3)
    rc, out, err = cli([str(target), "--drafter", str(drafter)], capsys)
    assert rc == 1
    assert len(err.strip().splitlines()) == 1
    assert "hidden_size: target=2 drafter=3" in err
    rc, out, err = cli([str(target), "--drafter", str(drafter), "--json"], capsys)
    assert rc == 1
    pair = PairReport.model_validate_json(out)
    assert [c.field for c in pair.mismatches] == ["hidden_size"]
    drafter_ok = make_drafter(tmp_path / "ok", hidden=2)
    rc, out, err = cli([str(target), "--drafter", str(drafter_ok)], capsys)
    assert rc == 0, err


@pytest.mark.parametrize("case", ["missing", "truncated", "bad_gguf", "no_tokenizer"])
def test_cli_exit_2_for_bad_input_with_one_line(tmp_path, capsys, case):
    if case == "missing":
        argv = [str(tmp_path / "nope")]
    elif case == "truncated":
        write_raw_header(tmp_path / "model.safetensors", b'{"a":', claimed=1000)
        argv = [str(tmp_path / "model.safetensors")]
    elif case == "bad_gguf":
        (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(10))
        argv = [str(tmp_path / "m.gguf")]
    else:
        target, drafter = make_target(tmp_path), make_drafter(tmp_path)
        (target / "tokenizer.json").unlink()
        argv = [str(target), "--drafter", str(drafter)]
    rc, out, err = cli(argv, capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mtpcheck inspect: error: ")
    assert "Traceback" not in err
    assert out == ""
