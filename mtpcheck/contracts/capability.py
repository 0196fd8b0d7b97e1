"""Checkpoint evidence contracts: what a model artifact actually carries for MTP.

These models are produced by :mod:`mtpcheck.inspect`. They describe evidence read
from a checkpoint's tensor names and metadata (never tensor data), so a runtime's
claim of multi-token-prediction support can be judged against the artifact.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CapabilityKind = Literal["embedded", "separate", "none"]
"""embedded: MTP heads live inside the target checkpoint; separate: the artifact is a
stand-alone MTP drafter; none: no MTP tensors were found."""

EvidenceKind = Literal[
    "tensor",  # safetensors tensor names (file headers)
    "index",  # model.safetensors.index.json weight_map
    "config",  # config.json fields
    "gguf_metadata",  # GGUF key/value metadata
    "gguf_tensor",  # GGUF tensor-info names
    "drafter",  # a drafter declared by, or paired with, the target
    "tokenizer",  # tokenizer fingerprint
]

CheckpointFormat = Literal["safetensors", "gguf"]

FindingCode = Literal[
    "config_false_positive",  # metadata declares MTP, weights carry none
    "depth_mismatch",  # metadata declares N prediction layers, weights carry M != N
    "drafter_without_tensors",  # a *_mtp drafter config with no tensors at all
]

PairField = Literal["hidden_size", "vocab_size", "tokenizer"]


class Evidence(BaseModel):
    """One observation backing (or refuting) an MTP capability."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        description="file the observation was read from, relative to the checkpoint"
    )
    kind: EvidenceKind
    detail: str


class MtpCapability(BaseModel):
    """What the weights prove, not what the model family name suggests."""

    model_config = ConfigDict(extra="forbid")

    kind: CapabilityKind
    validated_depth: int = Field(
        ge=0, description="number of distinct MTP prediction layers found in the weights; 0 if none"
    )
    evidence: list[Evidence] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


class Finding(BaseModel):
    """A named mismatch between what the artifact declares and what it carries."""

    model_config = ConfigDict(extra="forbid")

    code: FindingCode
    message: str


class DeclaredConfig(BaseModel):
    """Fields the artifact's metadata declares (config.json or GGUF key/values)."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="config.json, or the GGUF file name")
    model_type: str | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    num_hidden_layers: int | None = None
    mtp_field: str | None = Field(
        default=None,
        description="the field that declares MTP depth, e.g. 'mtp_num_hidden_layers', "
        "'text_config.num_nextn_predict_layers', or 'glm4moe.nextn_predict_layers'",
    )
    mtp_declared: int | None = Field(default=None, description="the declared MTP depth, if any")


class InspectionReport(BaseModel):
    """Result of inspecting one checkpoint (folder, safetensors file, or GGUF file)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    format: CheckpointFormat
    weight_sources: list[str] = Field(description="files whose tensor names were read")
    bytes_read: int = Field(ge=0, description="bytes read from disk (headers and JSON sidecars)")
    tensor_count: int = Field(ge=0)
    mtp_tensor_count: int = Field(ge=0)
    mtp_tensor_sample: list[str] = Field(
        default_factory=list, description="up to 16 MTP tensor names, sorted"
    )
    mtp_layer_indices: list[int] = Field(default_factory=list)
    config: DeclaredConfig | None = None
    declared_drafter: str | None = Field(
        default=None, description="drafter named by the target's config, if any"
    )
    capability: MtpCapability
    findings: list[Finding] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


class FieldComparison(BaseModel):
    """One field compared between a target and its drafter."""

    model_config = ConfigDict(extra="forbid")

    field: PairField
    target: int | str | None
    drafter: int | str | None
    compared: bool = Field(
        default=True, description="False when the rule does not apply (see PairReport.warnings)"
    )
    match: bool


class PairReport(BaseModel):
    """Result of checking that a drafter fits a target."""

    model_config = ConfigDict(extra="forbid")

    target: InspectionReport
    drafter: InspectionReport
    comparisons: list[FieldComparison]
    warnings: list[str] = Field(default_factory=list)

    @property
    def mismatches(self) -> list[FieldComparison]:
        return [c for c in self.comparisons if c.compared and not c.match]

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.target.ok and self.drafter.ok
