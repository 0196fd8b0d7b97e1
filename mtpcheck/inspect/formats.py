"""File formats: bounded readers of safetensors headers and GGUF headers (tensor names and metadata only, never tensor data)."""


from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ._base import (
    MAX_HEADER_BYTES,
    GGUFError,
    InspectError,
    SafetensorsHeaderError,
    _regular_file,
    _utf8_ok,
)

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
