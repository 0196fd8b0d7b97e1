"""Pair checks: does a drafter fit its target (hidden size, vocabulary, tokenizer fingerprint)?"""


from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mtpcheck.contracts.capability import (
    FieldComparison,
    InspectionReport,
    PairReport,
)

from ._base import (
    MAX_TOKENIZER_BYTES,
    AssistantMismatchError,
    ConfigError,
    InspectError,
    TokenizerError,
    _read_json_file,
)
from .formats import _read_gguf
from .layout import _is_gguf_file, _resolve, inspect_checkpoint

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
