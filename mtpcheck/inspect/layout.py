"""Layout rules: what tensor names and config.json say about MTP heads, and the
inspection report of one checkpoint (safetensors folder, index, or GGUF), with depth capping."""


from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpcheck.contracts.capability import (
    DeclaredConfig,
    Evidence,
    Finding,
    InspectionReport,
    MtpCapability,
)

from ._base import (
    _DRAFTER_KEYS,
    _MTP_DEPTH_FIELDS,
    _NEXTN_MARKERS,
    _SAMPLE,
    MAX_JSON_BYTES,
    CapabilityError,
    ConfigError,
    InspectError,
    _list_names,
    _read_json_file,
)
from .formats import _read_gguf, read_safetensors_header

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
