"""Checkpoint evidence: does the artifact really carry multi-token-prediction heads?

Runtimes often claim MTP support from a model family name or from a config field
such as ``mtp_num_hidden_layers``. The truth is in the artifact's tensors. This
module reads tensor *names* only (safetensors headers, the safetensors index, GGUF
headers) and ``config.json``; it never reads tensor data, and it bounds every read.

Public API::

    inspect_checkpoint(path) -> InspectionReport
    check_pair(target_path, drafter_path, *, strict=True) -> PairReport
    tokenizer_fingerprint(path) -> str
    cap_depth(capability, requested_depth, recurrent_ok) -> int
    add_parser(subparsers) / run(args) -> int      # the ``mtpcheck inspect`` subcommand

Errors: :class:`InspectError` (bad input: missing path, unreadable or malformed
file; a ``ValueError``) and its subclasses, :class:`AssistantMismatchError`
(drafter does not fit target) and :class:`CapabilityError` (depth refused).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from mtpcheck.contracts.capability import (
    DeclaredConfig,
    Evidence,
    FieldComparison,
    Finding,
    InspectionReport,
    MtpCapability,
    PairReport,
)

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_JSON_BYTES",
    "MAX_TOKENIZER_BYTES",
    "AssistantMismatchError",
    "CapabilityError",
    "ConfigError",
    "GGUFError",
    "InspectError",
    "SafetensorsHeaderError",
    "TokenizerError",
    "add_parser",
    "cap_depth",
    "check_pair",
    "classify_tensor_names",
    "inspect_checkpoint",
    "read_safetensors_header",
    "run",
    "tokenizer_fingerprint",
]

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Largest safetensors header (or GGUF metadata section) we agree to read."""
MAX_JSON_BYTES = 100 * 1024 * 1024
"""Largest config.json / index.json we agree to read."""
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024
"""Largest tokenizer.json we agree to read."""

_SAMPLE = 16
_MTP_DEPTH_FIELDS = ("mtp_num_hidden_layers", "num_nextn_predict_layers", "mtp_num_layers")
_DRAFTER_KEYS = (
    "drafter",
    "mtp_drafter",
    "drafter_path",
    "mtp_drafter_path",
    "draft_model",
    "draft_model_path",
)
_NEXTN_MARKERS = frozenset({"eh_proj", "enorm", "hnorm", "shared_head", "nextn"})


# --------------------------------------------------------------------------- errors


class InspectError(ValueError):
    """Bad input: a missing path, an unreadable file, or a malformed header."""


class SafetensorsHeaderError(InspectError):
    """A safetensors header that is truncated, oversized, not UTF-8, or not valid JSON."""


class GGUFError(InspectError):
    """A GGUF file whose header cannot be parsed."""


class ConfigError(InspectError):
    """An unreadable config.json or index.json, or a field a check needs is missing."""


class TokenizerError(InspectError):
    """A missing or malformed tokenizer.json (or GGUF tokenizer metadata)."""


class AssistantMismatchError(ValueError):
    """The drafter does not fit the target: a field differs between the two.

    ``mismatches`` holds ``(field, target_value, drafter_value)`` triples; ``field``,
    ``target_value`` and ``drafter_value`` describe the first.
    """

    def __init__(self, mismatches: list[tuple[str, Any, Any]]):
        if not mismatches:
            raise ValueError("AssistantMismatchError needs at least one mismatch")
        self.mismatches = list(mismatches)
        self.field, self.target_value, self.drafter_value = self.mismatches[0]
        parts = [f"{f}: target={t!r} drafter={d!r}" for f, t, d in self.mismatches]
        super().__init__("drafter does not match target: " + "; ".join(parts))


class CapabilityError(ValueError):
    """A requested MTP depth the checkpoint's validated capability cannot serve."""


# ------------------------------------------------------------------ small helpers


def _regular_file(path: Path, what: str, error: type[InspectError] = InspectError) -> int:
    """Return the size of a regular file, or raise a named error (never open a FIFO)."""
    if not path.exists():
        raise error(f"{path}: {what} not found")
    if not path.is_file():
        raise error(f"{path}: {what} is not a regular file")
    return path.stat().st_size


def _read_json_file(
    path: Path, what: str, limit: int, error: type[InspectError] = ConfigError
) -> tuple[Any, int]:
    """Read and parse a bounded JSON file. Returns (object, bytes read)."""
    size = _regular_file(path, what, error)
    if size > limit:
        raise error(
            f"{path}: {what} is {size} bytes, over the {limit} byte limit; refusing to read it"
        )
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: {what} is not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise error(f"{path}: {what} is not valid JSON: {exc}") from None
    return obj, len(raw)


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _list_names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


# ------------------------------------------------------------- safetensors header


def read_safetensors_header(path: str | Path) -> tuple[dict[str, Any], int]:
    """Read one safetensors header, never the tensor data.

    Layout: an 8-byte little-endian u64 ``N``, then ``N`` bytes of UTF-8 JSON.
    Returns ``(header, bytes_read)``; ``header`` maps tensor names to
    ``{"dtype", "shape", "data_offsets"}`` (``__metadata__`` is kept as is).
    Raises :class:`SafetensorsHeaderError` for a truncated, oversized, non-UTF-8,
    or non-JSON header, or for entries whose data would run past the file's end.
    """
    path = Path(path)
    size = _regular_file(path, "safetensors file", SafetensorsHeaderError)
    name = path.name
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise SafetensorsHeaderError(
                f"{name}: truncated safetensors header: the file holds {len(prefix)} bytes, "
                "fewer than the 8-byte length prefix"
            )
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES:
            raise SafetensorsHeaderError(
                f"{name}: safetensors header length {n} bytes exceeds the "
                f"{MAX_HEADER_BYTES} byte limit; refusing to read it"
            )
        if 8 + n > size:
            raise SafetensorsHeaderError(
                f"{name}: safetensors header claims {n} bytes but the file holds only "
                f"{size - 8} bytes after the length prefix (truncated or not a safetensors file)"
            )
        raw = fh.read(n)
    if len(raw) < n:
        raise SafetensorsHeaderError(
            f"{name}: truncated safetensors header: read {len(raw)} of {n} bytes"
        )
    bytes_read = 8 + len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsHeaderError(
            f"{name}: safetensors header is not valid UTF-8 (byte {8 + exc.start}); "
            "tensor names must be UTF-8"
        ) from None
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SafetensorsHeaderError(
            f"{name}: safetensors header is not valid JSON: {exc}"
        ) from None
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(
            f"{name}: safetensors header is a JSON {type(header).__name__}, not an object"
        )
    data_start = 8 + n
    for key, entry in header.items():
        if not _utf8_ok(key):
            raise SafetensorsHeaderError(
                f"{name}: tensor name {ascii(key)} is not valid UTF-8 (lone surrogate escape)"
            )
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise SafetensorsHeaderError(
                f"{name}: entry for tensor {ascii(key)} is a JSON "
                f"{type(entry).__name__}, not an object"
            )
        offsets = entry.get("data_offsets")
        shape = entry.get("shape")
        if not isinstance(entry.get("dtype"), str):
            raise SafetensorsHeaderError(f"{name}: tensor {ascii(key)} has no string dtype")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise SafetensorsHeaderError(f"{name}: tensor {ascii(key)} has a malformed shape")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise SafetensorsHeaderError(
                f"{name}: tensor {ascii(key)} has malformed data_offsets {ascii(offsets)}"
            )
        if data_start + offsets[1] > size:
            raise SafetensorsHeaderError(
                f"{name}: tensor {ascii(key)} data ends at byte {data_start + offsets[1]} but the "
                f"file holds {size} bytes (truncated file)"
            )
    return header, bytes_read


# -------------------------------------------------------------------- GGUF header

_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _BoundedReader:
    """Sequential reads over a file, every one checked against the file's size."""

    def __init__(self, fh: BinaryIO, size: int, name: str, order: str):
        self.fh, self.size, self.name, self.order = fh, size, name, order
        self.pos = 0
        self.bytes_read = 0

    def fail(self, msg: str) -> GGUFError:
        return GGUFError(f"{self.name}: malformed GGUF: {msg}")

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise self.fail(
                f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)"
            )
        if self.pos + n > MAX_HEADER_BYTES:
            raise self.fail(f"metadata section exceeds the {MAX_HEADER_BYTES} byte limit")
        data = self.fh.read(n)
        if len(data) < n:
            raise self.fail(f"{what} at byte {self.pos} is truncated")
        self.pos += n
        self.bytes_read += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(
                f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)"
            )
        self.fh.seek(n, 1)
        self.pos += n

    def u32(self, what: str) -> int:
        return struct.unpack(self.order + "I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack(self.order + "Q", self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {self.pos - n} is not valid UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _GGUF_SCALAR_SIZES:
            self.skip(_GGUF_SCALAR_SIZES[vtype], what)
        elif vtype == _GGUF_STRING:
            self.skip(self.u64(f"{what} length"), what)
        elif vtype == _GGUF_ARRAY:
            if depth >= 4:
                raise self.fail(f"{what} nests arrays more than 4 deep")
            itype = self.u32(f"{what} item type")
            count = self.u64(f"{what} item count")
            if itype in _GGUF_SCALAR_SIZES:
                self.skip(count * _GGUF_SCALAR_SIZES[itype], what)
            elif itype in (_GGUF_STRING, _GGUF_ARRAY):
                min_item = 8 if itype == _GGUF_STRING else 12
                if count * min_item > self.size - self.pos:
                    raise self.fail(f"{what} claims {count} items, more than the file can hold")
                for _ in range(count):
                    self.value(itype, what, depth + 1)
            else:
                raise self.fail(f"{what} has unknown array item type {itype}")
        else:
            raise self.fail(f"{what} has unknown value type {vtype}")


def _validate_gguf(path: Path, size: int) -> tuple[int, list[str]]:
    """Walk a GGUF header with bounded reads before handing it to ``gguf.GGUFReader``.

    GGUFReader trusts counts it reads, so a hostile array length can make it spin;
    this walk refuses any count the file cannot hold. Returns (header bytes read,
    tensor names).
    """
    name = path.name
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8 or head[:4] != b"GGUF":
            raise GGUFError(f"{name}: not a GGUF file (missing 'GGUF' magic or truncated)")
        (version,) = struct.unpack("<I", head[4:8])
        order = "<"
        if version & 0xFFFF == 0:
            (version,) = struct.unpack(">I", head[4:8])
            order = ">"
        if version not in (2, 3):
            raise GGUFError(f"{name}: unsupported GGUF version {version} (2 and 3 are read)")
        rd = _BoundedReader(fh, size, name, order)
        rd.pos = rd.bytes_read = 8
        tensor_count = rd.u64("tensor count")
        kv_count = rd.u64("key/value count")
        if kv_count * 12 > size or tensor_count * 24 > size:
            raise GGUFError(
                f"{name}: malformed GGUF: header claims {tensor_count} tensors and {kv_count} "
                f"metadata keys, more than a {size} byte file can hold"
            )
        for i in range(kv_count):
            key = rd.string(f"metadata key #{i}")
            rd.value(rd.u32(f"type of {ascii(key)}"), f"value of {ascii(key)}")
        names: list[str] = []
        for i in range(tensor_count):
            tname = rd.string(f"tensor name #{i}")
            n_dims = rd.u32(f"dimension count of {ascii(tname)}")
            if n_dims > 8:
                raise rd.fail(f"tensor {ascii(tname)} claims {n_dims} dimensions")
            rd.skip(8 * n_dims + 4 + 8, f"tensor info of {ascii(tname)}")
            names.append(tname)
        return rd.bytes_read, names


@dataclass
class _GgufInfo:
    architecture: str | None
    metadata: dict[str, Any]
    tensor_names: list[str]
    header_bytes: int
    tokens: list[str] | None = None
    merges: list[str] | None = None


_GGUF_WANTED = (
    "nextn_predict_layers",
    "block_count",
    "embedding_length",
    "vocab_size",
)


def _read_gguf(path: Path, *, want_tokenizer: bool = False) -> _GgufInfo:
    """Read a GGUF header with ``gguf.GGUFReader``; malformed files raise :class:`GGUFError`."""
    size = _regular_file(path, "GGUF file", GGUFError)
    header_bytes, _ = _validate_gguf(path, size)
    try:
        import gguf  # deferred: only GGUF inspection needs it
    except ImportError as exc:  # pragma: no cover - gguf is a dependency
        raise GGUFError(f"{path.name}: the 'gguf' package is needed to read GGUF files") from exc
    try:
        reader = gguf.GGUFReader(path, "r")
        fields = reader.fields

        def get(key: str) -> Any:
            f = fields.get(key)
            return None if f is None else f.contents()

        arch = get("general.architecture")
        meta: dict[str, Any] = {}
        if isinstance(arch, str):
            for suffix in _GGUF_WANTED:
                value = get(f"{arch}.{suffix}")
                if value is not None:
                    meta[f"{arch}.{suffix}"] = value
        tokens = merges = None
        tok_field = fields.get("tokenizer.ggml.tokens")
        if tok_field is not None:
            meta["tokenizer.ggml.tokens.count"] = len(tok_field.data)
            if want_tokenizer:
                tokens = list(tok_field.contents())
                merges_value = get("tokenizer.ggml.merges")
                merges = list(merges_value) if merges_value is not None else None
        names = [t.name for t in reader.tensors]
        del reader
    except InspectError:
        raise
    except Exception as exc:  # gguf raises many types for malformed input
        raise GGUFError(f"{path.name}: malformed GGUF: {type(exc).__name__}: {exc}") from None
    return _GgufInfo(
        architecture=arch if isinstance(arch, str) else None,
        metadata=meta,
        tensor_names=names,
        header_bytes=header_bytes,
        tokens=tokens,
        merges=merges,
    )


# ------------------------------------------------------------ tensor-name analysis

_DECODER_LAYER = re.compile(
    r"^(?P<prefix>(?:model\.|language_model\.|transformer\.)*)(?P<stem>layers|blk)\.(?P<idx>\d+)\.(?P<rest>.+)$"
)
_MTP_INDEXED = re.compile(
    r"(?:^|\.)(?P<fam>(?:mtp|nextn)(?:_[a-z]+)*)(?:\.layers)?\.(?P<idx>\d+)\."
)
_MTP_ANY = re.compile(r"(?:^|\.)(?:mtp|nextn)(?:_[a-z]+)*\.")
_ANY_LAYER = re.compile(r"(?:^|\.)(?:layers|blk)\.(?P<idx>\d+)\.")


@dataclass
class TensorClassification:
    """Which tensor names belong to MTP heads, and how many prediction layers they form."""

    mtp_names: list[str] = field(default_factory=list)
    layer_keys: set[tuple[str, int]] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)

    @property
    def depth(self) -> int:
        if self.layer_keys:
            return len(self.layer_keys)
        return 1 if self.mtp_names else 0

    @property
    def layer_indices(self) -> list[int]:
        return sorted({idx for _, idx in self.layer_keys})


def classify_tensor_names(
    names: Iterable[str], num_hidden_layers: int | None = None
) -> TensorClassification:
    """Find MTP tensors among ``names`` in the layouts real checkpoints use.

    * ``mtp.*`` / ``model.mtp.*`` / ``language_model.mtp.*`` (Qwen3.5, Qwen3-Next,
      mlx-vlm ``qwen3_5``: ``mtp.layers.N.*``), ``mtp_heads.N.*`` (reference
      fixture), ``mtp_block(s)``/``mtp_layers`` variants, ``*.nextn.*``;
    * DeepSeek-V3 / GLM-4.5 nextn layers: ``model.layers.N.*`` where layer ``N``
      holds ``eh_proj``/``enorm``/``hnorm``/``shared_head`` (normally
      ``N >= num_hidden_layers``); every tensor of such a layer is an MTP tensor;
    * GGUF: ``blk.N.nextn.*``; every tensor of such a block is an MTP tensor.

    A prediction layer is a distinct ``(family, index)``; MTP tensors with no
    index at all count as one layer.
    """
    result = TensorClassification()
    decoder: dict[tuple[str, str, int], list[str]] = {}
    decoder_parts: dict[tuple[str, str, int], set[str]] = {}
    for name in names:
        m = _DECODER_LAYER.match(name)
        if m:
            key = (m["prefix"], m["stem"], int(m["idx"]))
            decoder.setdefault(key, []).append(name)
            decoder_parts.setdefault(key, set()).add(m["rest"].split(".", 1)[0])
            continue
        m = _MTP_INDEXED.search(name)
        if m:
            result.mtp_names.append(name)
            result.layer_keys.add((m["fam"], int(m["idx"])))
        elif _MTP_ANY.search(name):
            result.mtp_names.append(name)
    for key in sorted(decoder):
        prefix, stem, idx = key
        beyond = num_hidden_layers is not None and idx >= num_hidden_layers
        markers = decoder_parts[key] & _NEXTN_MARKERS
        if markers:
            result.mtp_names.extend(decoder[key])
            result.layer_keys.add((f"{prefix}{stem}", idx))
            if num_hidden_layers is not None and not beyond and stem == "layers":
                result.warnings.append(
                    f"{prefix}{stem}.{idx} holds nextn tensors ({', '.join(sorted(markers))}) "
                    f"but lies inside num_hidden_layers={num_hidden_layers}"
                )
        elif beyond and stem == "layers":
            result.warnings.append(
                f"{prefix}{stem}.{idx} lies beyond num_hidden_layers={num_hidden_layers} but holds "
                "no eh_proj/enorm/hnorm/shared_head tensor; not counted as an MTP layer"
            )
    result.mtp_names.sort()
    return result


# ------------------------------------------------------------------------- config


@dataclass
class _Config:
    raw: dict[str, Any]
    declared: DeclaredConfig
    drafter: str | None
    warnings: list[str]
    bytes_read: int


def _lookup(cfg: dict[str, Any], key: str) -> tuple[str, Any] | None:
    """Field from the top level, else from a nested ``text_config``."""
    if cfg.get(key) is not None:
        return key, cfg[key]
    text = cfg.get("text_config")
    if isinstance(text, dict) and text.get(key) is not None:
        return f"text_config.{key}", text[key]
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _read_config(path: Path) -> _Config:
    cfg, nbytes = _read_json_file(path, "config.json", MAX_JSON_BYTES)
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: config.json is a JSON {type(cfg).__name__}, not an object")
    warnings: list[str] = []

    def int_field(key: str) -> int | None:
        found = _lookup(cfg, key)
        if found is None:
            return None
        where, value = found
        as_int = _as_int(value)
        if as_int is None:
            warnings.append(f"config.json {where}={value!r} is not a non-negative integer; ignored")
        return as_int

    model_types = [cfg.get("model_type")]
    text = cfg.get("text_config")
    if isinstance(text, dict):
        model_types.append(text.get("model_type"))
    model_type = next((t for t in model_types if isinstance(t, str)), None)
    # a *_mtp type anywhere wins: it marks a drafter
    model_type = next(
        (t for t in model_types if isinstance(t, str) and t.endswith("_mtp")), model_type
    )

    mtp_field = mtp_declared = None
    for key in _MTP_DEPTH_FIELDS:
        found = _lookup(cfg, key)
        if found is None:
            continue
        where, value = found
        as_int = _as_int(value)
        if as_int is None:
            warnings.append(f"config.json {where}={value!r} is not a non-negative integer; ignored")
            continue
        if mtp_field is None:
            mtp_field, mtp_declared = where, as_int
        elif as_int != mtp_declared:
            warnings.append(
                f"config.json declares both {mtp_field}={mtp_declared} and {where}={as_int}; "
                f"using {mtp_field}"
            )

    drafter = None
    for key in _DRAFTER_KEYS:
        found = _lookup(cfg, key)
        if found is not None and isinstance(found[1], str) and found[1].strip():
            drafter = found[1]
            break

    declared = DeclaredConfig(
        source="config.json",
        model_type=model_type,
        hidden_size=int_field("hidden_size"),
        vocab_size=int_field("vocab_size"),
        num_hidden_layers=int_field("num_hidden_layers"),
        mtp_field=mtp_field,
        mtp_declared=mtp_declared,
    )
    return _Config(
        raw=cfg, declared=declared, drafter=drafter, warnings=warnings, bytes_read=nbytes
    )


# ---------------------------------------------------------------- path resolution

_SHARD = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


@dataclass
class _Layout:
    root: Path  # folder holding config.json / tokenizer.json
    format: str  # "safetensors" | "gguf"
    index: Path | None = None
    files: list[Path] = field(default_factory=list)


def _is_gguf_file(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():  # never open a FIFO or device
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def _resolve(path: str | Path) -> _Layout:
    p = Path(path)
    if not p.exists():
        raise InspectError(f"{p}: no such file or directory")
    if p.is_dir():
        indexes = sorted(p.glob("*.safetensors.index.json"))
        index = next((i for i in indexes if i.name == "model.safetensors.index.json"), None)
        if index is None and len(indexes) == 1:
            index = indexes[0]
        elif index is None and len(indexes) > 1:
            raise InspectError(
                f"{p}: several safetensors index files ({_list_names([i.name for i in indexes])}); "
                "pass one of them"
            )
        shards = sorted(p.glob("*.safetensors"))
        if index is not None:
            return _Layout(root=p, format="safetensors", index=index)
        if shards:
            return _Layout(root=p, format="safetensors", files=shards)
        ggufs = sorted(g for g in p.glob("*.gguf") if not g.name.lower().startswith("mmproj"))
        if len(ggufs) == 1 or (ggufs and all(_SHARD.search(g.name) for g in ggufs)):
            return _Layout(root=p, format="gguf", files=ggufs)
        if ggufs:
            raise InspectError(
                f"{p}: holds {len(ggufs)} GGUF files ({_list_names([g.name for g in ggufs])}); "
                "pass one of them"
            )
        raise InspectError(f"{p}: no *.safetensors, *.safetensors.index.json or *.gguf file found")
    if not p.is_file():
        raise InspectError(f"{p}: not a regular file or directory")
    if p.name.endswith(".safetensors.index.json"):
        return _Layout(root=p.parent, format="safetensors", index=p)
    if _is_gguf_file(p):
        return _Layout(root=p.parent, format="gguf", files=[p])
    return _Layout(root=p.parent, format="safetensors", files=[p])


# -------------------------------------------------------------------- inspection


def _read_index(index: Path) -> tuple[dict[str, str], int, list[str]]:
    obj, nbytes = _read_json_file(index, "safetensors index", MAX_JSON_BYTES)
    wmap = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wmap, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()
    ):
        raise ConfigError(
            f"{index}: {index.name} has no weight_map object mapping tensor names to file names"
        )
    warnings = []
    missing = sorted({v for v in wmap.values() if not (index.parent / v).is_file()})
    if missing:
        warnings.append(f"{index.name} names shard files that are absent: {_list_names(missing)}")
    return wmap, nbytes, warnings


def inspect_checkpoint(path: str | Path) -> InspectionReport:
    """Inspect a checkpoint folder, safetensors file, index.json, or GGUF file.

    Reads tensor names and metadata only. Raises :class:`InspectError` (or a
    subclass) for bad input; named mismatches between metadata and weights are
    returned as ``report.findings``, not raised.
    """
    layout = _resolve(path)
    if layout.format == "gguf":
        return _inspect_gguf(path, layout)
    return _inspect_safetensors(path, layout)


def _inspect_safetensors(path: str | Path, layout: _Layout) -> InspectionReport:
    bytes_read = 0
    warnings: list[str] = []
    evidence: list[Evidence] = []
    config: _Config | None = None
    cfg_path = layout.root / "config.json"
    if cfg_path.exists():
        config = _read_config(cfg_path)
        bytes_read += config.bytes_read
        warnings.extend(config.warnings)

    per_source: dict[str, list[str]] = {}
    if layout.index is not None:
        wmap, nbytes, idx_warn = _read_index(layout.index)
        bytes_read += nbytes
        warnings.extend(idx_warn)
        weight_sources = [layout.index.name]
        where = f"{layout.index.name} weight_map"
        source_kind = "index"
        per_source[layout.index.name] = list(wmap)
    else:
        weight_sources = [f.name for f in layout.files]
        where = _list_names(weight_sources)
        source_kind = "tensor"
        for f in layout.files:
            header, nbytes = read_safetensors_header(f)
            bytes_read += nbytes
            per_source[f.name] = [k for k in header if k != "__metadata__"]
    names = [n for group in per_source.values() for n in group]

    declared = config.declared if config else None
    nhl = declared.num_hidden_layers if declared else None
    cls = classify_tensor_names(names, nhl)
    warnings.extend(cls.warnings)
    mtp_names = cls.mtp_names
    depth = cls.depth
    indices = cls.layer_indices

    mtp_type = bool(declared and declared.model_type and declared.model_type.endswith("_mtp"))
    if mtp_type and not mtp_names and names:
        # a stand-alone drafter may drop the "mtp." prefix: all its tensors are the head
        mtp_names = sorted(names)
        layers = {int(m["idx"]) for n in names if (m := _ANY_LAYER.search(n))}
        depth = len(layers) or 1
        indices = sorted(layers)

    mtp_set = set(mtp_names)
    for source, group in per_source.items():
        hits = sorted(n for n in group if n in mtp_set)
        if hits:
            evidence.append(
                Evidence(
                    source=source,
                    kind=source_kind,  # type: ignore[arg-type]
                    detail=f"{len(hits)} of {len(group)} tensor names are MTP tensors, "
                    f"e.g. {ascii(hits[0])[1:-1]}",
                )
            )
    if depth:
        evidence.append(
            Evidence(
                source=weight_sources[0] if len(weight_sources) == 1 else where,
                kind=source_kind,  # type: ignore[arg-type]
                detail=f"{depth} MTP prediction layer(s)"
                + (f" at indices {indices}" if indices else " (no layer index in the names)"),
            )
        )

    if names and (mtp_type or (mtp_names and len(mtp_set) == len(set(names)))):
        kind = "separate"
    elif mtp_names:
        kind = "embedded"
    else:
        kind = "none"
    if kind != "none" and depth == 0:  # pragma: no cover - defensive
        kind = "none"
    if kind == "none":
        depth = 0
    if mtp_type and declared is not None:
        evidence.append(
            Evidence(
                source="config.json",
                kind="config",
                detail=f"model_type={declared.model_type!r} marks a stand-alone MTP drafter",
            )
        )

    findings = _declared_vs_found(declared, depth, indices, where, "weight names")
    if mtp_type and kind == "none" and not findings:
        findings.append(
            Finding(
                code="config_false_positive",
                message=f"config.json model_type={declared.model_type!r} names an MTP drafter "
                f"but no MTP tensors were found in {where} (evidence: weight names)",
            )
        )
    if declared and declared.mtp_field and declared.mtp_declared:
        evidence.append(
            Evidence(
                source="config.json",
                kind="config",
                detail=f"declares {declared.mtp_field}={declared.mtp_declared}",
            )
        )
    if depth and declared is not None and not declared.mtp_declared and not mtp_type:
        warnings.append(
            f"the weights carry {depth} MTP prediction layer(s) but config.json declares none "
            f"({'/'.join(_MTP_DEPTH_FIELDS)} absent or 0); a runtime reading the config will "
            "ignore them"
        )

    drafter = config.drafter if config else None
    if drafter is not None:
        local = (layout.root / drafter).is_dir()
        evidence.append(
            Evidence(
                source="config.json",
                kind="drafter",
                detail=f"names drafter {drafter!r}"
                + ("; a local folder of that name exists" if local else "; not a local folder"),
            )
        )

    return InspectionReport(
        path=str(path),
        format="safetensors",
        weight_sources=weight_sources,
        bytes_read=bytes_read,
        tensor_count=len(names),
        mtp_tensor_count=len(mtp_names),
        mtp_tensor_sample=mtp_names[:_SAMPLE],
        mtp_layer_indices=indices,
        config=declared,
        declared_drafter=drafter,
        capability=MtpCapability(
            kind=kind, validated_depth=depth, evidence=evidence, warnings=warnings
        ),
        findings=findings,
    )


def _declared_vs_found(
    declared: DeclaredConfig | None,
    depth: int,
    indices: list[int],
    where: str,
    evidence_words: str,
) -> list[Finding]:
    if declared is None or not declared.mtp_declared:
        return []
    claim = f"{declared.source} declares {declared.mtp_field}={declared.mtp_declared}"
    if depth == 0:
        return [
            Finding(
                code="config_false_positive",
                message=f"{claim} but no MTP tensors were found in {where} "
                f"(evidence: {evidence_words})",
            )
        ]
    if depth != declared.mtp_declared:
        at = f" (indices {indices})" if indices else ""
        return [
            Finding(
                code="depth_mismatch",
                message=f"{claim} but {where} carries {depth} MTP prediction layer(s){at} "
                f"(evidence: {evidence_words})",
            )
        ]
    return []


def _inspect_gguf(path: str | Path, layout: _Layout) -> InspectionReport:
    infos = [_read_gguf(f) for f in layout.files]
    first = infos[0]
    names = [n for info in infos for n in info.tensor_names]
    weight_sources = [f.name for f in layout.files]
    where = _list_names(weight_sources)
    arch = first.architecture
    meta = first.metadata
    warnings: list[str] = []
    evidence: list[Evidence] = []

    def meta_int(suffix: str) -> int | None:
        return _as_int(meta.get(f"{arch}.{suffix}")) if arch else None

    nextn = meta_int("nextn_predict_layers")
    vocab = meta_int("vocab_size") or _as_int(meta.get("tokenizer.ggml.tokens.count"))
    declared = DeclaredConfig(
        source=weight_sources[0],
        model_type=arch,
        hidden_size=meta_int("embedding_length"),
        vocab_size=vocab,
        num_hidden_layers=meta_int("block_count"),
        mtp_field=f"{arch}.nextn_predict_layers" if nextn is not None else None,
        mtp_declared=nextn,
    )
    if arch is None:
        warnings.append(f"{weight_sources[0]} has no general.architecture metadata")
    if nextn is not None:
        evidence.append(
            Evidence(
                source=weight_sources[0],
                kind="gguf_metadata",
                detail=f"{arch}.nextn_predict_layers={nextn}",
            )
        )
    cls = classify_tensor_names(names)
    warnings.extend(cls.warnings)
    mtp_set = set(cls.mtp_names)
    for f, info in zip(layout.files, infos, strict=True):
        hits = [n for n in info.tensor_names if n in mtp_set]
        if hits:
            evidence.append(
                Evidence(
                    source=f.name,
                    kind="gguf_tensor",
                    detail=f"{len(hits)} of {len(info.tensor_names)} tensors are nextn/MTP "
                    f"tensors, e.g. {ascii(sorted(hits)[0])[1:-1]}",
                )
            )
    depth = cls.depth
    if depth:
        evidence.append(
            Evidence(
                source=weight_sources[0] if len(weight_sources) == 1 else where,
                kind="gguf_tensor",
                detail=f"{depth} MTP prediction layer(s)"
                + (f" at blocks {cls.layer_indices}" if cls.layer_indices else ""),
            )
        )
    if names and cls.mtp_names and len(set(cls.mtp_names)) == len(set(names)):
        kind = "separate"
    elif cls.mtp_names:
        kind = "embedded"
    else:
        kind = "none"
    findings = _declared_vs_found(declared, depth, cls.layer_indices, where, "GGUF tensor names")
    if depth and not nextn:
        warnings.append(
            f"the GGUF carries {depth} nextn/MTP layer(s) but declares no "
            f"{arch}.nextn_predict_layers; llama.cpp-style runtimes will ignore them"
        )
    return InspectionReport(
        path=str(path),
        format="gguf",
        weight_sources=weight_sources,
        bytes_read=sum(info.header_bytes for info in infos),
        tensor_count=len(names),
        mtp_tensor_count=len(cls.mtp_names),
        mtp_tensor_sample=cls.mtp_names[:_SAMPLE],
        mtp_layer_indices=cls.layer_indices,
        config=declared,
        declared_drafter=None,
        capability=MtpCapability(
            kind=kind, validated_depth=depth, evidence=evidence, warnings=warnings
        ),
        findings=findings,
    )


# ---------------------------------------------------------------- depth capping


def cap_depth(capability: MtpCapability, requested_depth: int, recurrent_ok: bool) -> int:
    """The MTP depth a runtime may draft with, given what the weights validate.

    Rule:

    * ``requested_depth == 0`` (no drafting) is always allowed;
    * a capability of kind ``"none"`` (``validated_depth == 0``) refuses any
      ``requested_depth >= 1`` with :class:`CapabilityError`;
    * with ``recurrent_ok`` (the runtime reuses a trained head recurrently, feeding
      its own hidden state back, so one head can draft several tokens) the
      requested depth is accepted as is;
    * otherwise the depth is capped at ``validated_depth``: a runtime may not draft
      with heads the checkpoint does not carry.
    """
    if isinstance(requested_depth, bool) or not isinstance(requested_depth, int):
        raise TypeError(f"requested_depth must be an int, got {type(requested_depth).__name__}")
    if requested_depth < 0:
        raise ValueError(f"requested_depth must be >= 0, got {requested_depth}")
    if requested_depth == 0:
        return 0
    if capability.kind == "none" or capability.validated_depth == 0:
        raise CapabilityError(
            f"MTP depth {requested_depth} requested but the checkpoint carries no MTP heads "
            f"(capability kind {capability.kind!r}, validated_depth 0)"
        )
    if recurrent_ok:
        return requested_depth
    return min(requested_depth, capability.validated_depth)


# ------------------------------------------------------------------ tokenizer


def _canonical_merges(merges: Any) -> list[list[str]] | None:
    """Merges as ``[[left, right], ...]`` whether stored as ``"a b"`` or ``["a", "b"]``."""
    if merges is None:
        return None
    if not isinstance(merges, list):
        raise TokenizerError(f"merges is a JSON {type(merges).__name__}, not a list")
    out: list[list[str]] = []
    for m in merges:
        if isinstance(m, str):
            left, sep, right = m.partition(" ")
            out.append([left, right] if sep else [m])
        elif isinstance(m, list) and all(isinstance(x, str) for x in m):
            out.append(list(m))
        else:
            raise TokenizerError(f"merge entry {ascii(m)[:60]} is neither a string nor a pair")
    return out


def _fingerprint(vocab: Any, merges: Any) -> str:
    canonical = json.dumps(
        {"vocab": vocab, "merges": _canonical_merges(merges)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _tokenizer_source(path: str | Path) -> tuple[str, Path]:
    """("json", tokenizer.json path) or ("gguf", file) for a checkpoint or tokenizer path."""
    p = Path(path)
    if p.is_dir():
        tok = p / "tokenizer.json"
        if not tok.exists():
            try:
                layout = _resolve(p)
            except InspectError:
                return "json", tok  # the error will name the missing tokenizer.json
            if layout.format == "gguf":
                return "gguf", layout.files[0]
        return "json", tok
    if not p.exists():
        raise TokenizerError(f"{p}: no such file or directory")
    if (
        p.name.endswith(".json")
        and p.name not in ("config.json",)
        and not p.name.endswith(".index.json")
    ):
        return "json", p
    if _is_gguf_file(p):
        return "gguf", p
    return "json", p.parent / "tokenizer.json"


def tokenizer_fingerprint(path: str | Path) -> str:
    """sha256 over the canonical JSON of a tokenizer's vocab and merges.

    ``path`` is a ``tokenizer.json``, a checkpoint folder (its ``tokenizer.json``),
    a safetensors file (the sibling ``tokenizer.json``) or a GGUF file (its
    ``tokenizer.ggml.tokens``/``merges``). Formatting and all other fields
    (added tokens, normalizer, pre-tokenizer, ...) are ignored; merges stored as
    ``"a b"`` and as ``["a", "b"]`` give the same fingerprint. Fingerprints from
    tokenizer.json and from GGUF metadata are not comparable with each other.
    """
    kind, src = _tokenizer_source(path)
    if kind == "gguf":
        info = _read_gguf(src, want_tokenizer=True)
        if info.tokens is None:
            raise TokenizerError(f"{src}: GGUF file has no tokenizer.ggml.tokens metadata")
        vocab = {tok: i for i, tok in enumerate(info.tokens)}
        return _fingerprint(vocab, info.merges)
    obj, _ = _read_json_file(src, "tokenizer.json", MAX_TOKENIZER_BYTES, TokenizerError)
    model = obj.get("model") if isinstance(obj, dict) else None
    if not isinstance(model, dict) or "vocab" not in model:
        raise TokenizerError(f"{src}: tokenizer.json has no model.vocab")
    try:
        return _fingerprint(model["vocab"], model.get("merges"))
    except TokenizerError as exc:
        raise TokenizerError(f"{src}: {exc}") from None


# ------------------------------------------------------------------- pair check


def check_pair(
    target_path: str | Path, drafter_path: str | Path, *, strict: bool = True
) -> PairReport:
    """Check that a drafter fits a target: hidden size, vocabulary size, tokenizer.

    The hidden size is compared when the drafter carries MTP tensors (an MTP head
    consumes the target's hidden states); an independent draft model (no MTP
    tensors) only has to share the vocabulary and tokenizer. The tokenizer
    fingerprint is :func:`tokenizer_fingerprint`; a missing tokenizer raises
    :class:`TokenizerError` naming the file.

    With ``strict`` (the default) any mismatch raises
    :class:`AssistantMismatchError`; otherwise the mismatches are returned in the
    report (``report.mismatches``).
    """
    target = inspect_checkpoint(target_path)
    drafter = inspect_checkpoint(drafter_path)
    warnings: list[str] = []
    comparisons: list[FieldComparison] = []

    def need(report: InspectionReport, role: str, attr: str) -> int:
        value = getattr(report.config, attr, None) if report.config else None
        if value is None:
            src = report.config.source if report.config else "config.json"
            raise ConfigError(
                f"cannot compare {attr}: the {role} {report.path} has no {attr} (looked in {src})"
            )
        return value

    if drafter.capability.kind == "none":
        warnings.append(
            "the drafter carries no MTP tensors: treated as an independent draft model, "
            "hidden_size not compared"
        )
        t_h = target.config.hidden_size if target.config else None
        d_h = drafter.config.hidden_size if drafter.config else None
        comparisons.append(
            FieldComparison(
                field="hidden_size", target=t_h, drafter=d_h, compared=False, match=t_h == d_h
            )
        )
    else:
        t_h, d_h = need(target, "target", "hidden_size"), need(drafter, "drafter", "hidden_size")
        comparisons.append(
            FieldComparison(field="hidden_size", target=t_h, drafter=d_h, match=t_h == d_h)
        )
    t_v, d_v = need(target, "target", "vocab_size"), need(drafter, "drafter", "vocab_size")
    comparisons.append(
        FieldComparison(field="vocab_size", target=t_v, drafter=d_v, match=t_v == d_v)
    )

    t_fp = tokenizer_fingerprint(target_path)
    d_fp = tokenizer_fingerprint(drafter_path)
    same_format = _tokenizer_source(target_path)[0] == _tokenizer_source(drafter_path)[0]
    if not same_format:
        warnings.append(
            "tokenizer fingerprints come from different formats (tokenizer.json vs GGUF "
            "metadata) and are not compared"
        )
    comparisons.append(
        FieldComparison(
            field="tokenizer",
            target=f"sha256:{t_fp}",
            drafter=f"sha256:{d_fp}",
            compared=same_format,
            match=t_fp == d_fp,
        )
    )
    report = PairReport(target=target, drafter=drafter, comparisons=comparisons, warnings=warnings)
    if strict and report.mismatches:
        raise AssistantMismatchError([(c.field, c.target, c.drafter) for c in report.mismatches])
    return report


# --------------------------------------------------------------------------- CLI

_PROG = "mtpcheck inspect"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``inspect`` subcommand on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "inspect",
        help="report MTP evidence from a checkpoint's tensor names and metadata",
        description="Inspect a checkpoint (folder, *.safetensors, index.json or *.gguf) and "
        "report whether its weights really carry MTP heads. Exit 0: no problem; 1: a named "
        "mismatch or false positive; 2: bad input.",
    )
    parser.add_argument("path", metavar="PATH", help="checkpoint folder or file")
    parser.add_argument(
        "--drafter", metavar="PATH", default=None, help="also check this drafter against PATH"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def format_report(report: InspectionReport, title: str = "checkpoint") -> str:
    """Human-readable multi-line summary of an :class:`InspectionReport`."""
    cap = report.capability
    lines = [
        f"{title}: {report.path} ({report.format}; {report.tensor_count} tensors in "
        f"{_list_names(report.weight_sources)}; {report.bytes_read} bytes read)"
    ]
    if report.config is not None:
        c = report.config
        declared = f"{c.mtp_field}={c.mtp_declared}" if c.mtp_field else "no MTP field"
        lines.append(
            f"  declared ({c.source}): model_type={c.model_type} hidden_size={c.hidden_size} "
            f"vocab_size={c.vocab_size} num_hidden_layers={c.num_hidden_layers}; {declared}"
        )
    lines.append(f"  MTP: {cap.kind}, validated depth {cap.validated_depth}")
    for ev in cap.evidence:
        lines.append(f"    evidence [{ev.kind}] {ev.source}: {ev.detail}")
    if report.declared_drafter:
        lines.append(f"  declares drafter: {report.declared_drafter}")
    for w in cap.warnings:
        lines.append(f"  warning: {w}")
    for f in report.findings:
        label = "FALSE POSITIVE" if f.code == "config_false_positive" else "MISMATCH"
        lines.append(f"  {label}: {f.message}")
    return "\n".join(lines)


def format_pair(pair: PairReport) -> str:
    """Human-readable multi-line summary of a :class:`PairReport`."""
    lines = [format_report(pair.target, "target"), format_report(pair.drafter, "drafter"), "pair:"]
    for c in pair.comparisons:
        state = "not compared" if not c.compared else ("ok" if c.match else "MISMATCH")
        lines.append(f"  {c.field}: target={c.target} drafter={c.drafter} [{state}]")
    for w in pair.warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


def _problems(report: InspectionReport, role: str) -> list[str]:
    return [f"{role}: {f.message}" for f in report.findings]


def run(args: argparse.Namespace) -> int:
    """Run ``mtpcheck inspect``. Exit 0: ok; 1: named mismatch/false positive; 2: bad input."""
    try:
        if getattr(args, "drafter", None):
            pair = check_pair(args.path, args.drafter, strict=False)
            out = pair.model_dump_json(indent=2) if args.json else format_pair(pair)
            problems = _problems(pair.target, "target") + _problems(pair.drafter, "drafter")
            problems += [
                f"drafter mismatch: {c.field}: target={c.target} drafter={c.drafter}"
                for c in pair.mismatches
            ]
        else:
            report = inspect_checkpoint(args.path)
            out = report.model_dump_json(indent=2) if args.json else format_report(report)
            problems = [f.message for f in report.findings]
    except (InspectError, OSError) as exc:
        print(f"{_PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # never a traceback on the command line
        print(
            f"{_PROG}: error: unexpected {type(exc).__name__}: {_one_line(str(exc))}",
            file=sys.stderr,
        )
        return 2
    print(out, file=sys.stdout)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"{_PROG}: {_one_line(problems[0])}{more}", file=sys.stderr)
        return 1
    return 0
