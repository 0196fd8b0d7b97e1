"""Errors, read bounds and small helpers shared by the :mod:`mtpcheck.inspect` modules."""


from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
