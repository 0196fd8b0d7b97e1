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

A package split by concern (docs/architecture.md): :mod:`.formats` (safetensors
and GGUF headers), :mod:`.layout` (tensor-name and config rules, the report of
one checkpoint, depth capping), :mod:`.pair` (tokenizer fingerprint, the
drafter/target check), :mod:`.cli` (the subcommand) and :mod:`._base` (errors,
read bounds). Every name of the former single module is importable from here.
"""

from ._base import (
    MAX_HEADER_BYTES,
    MAX_JSON_BYTES,
    MAX_TOKENIZER_BYTES,
    AssistantMismatchError,
    CapabilityError,
    ConfigError,
    GGUFError,
    InspectError,
    SafetensorsHeaderError,
    TokenizerError,
)
from .cli import add_parser, format_pair, format_report, run
from .formats import read_safetensors_header
from .layout import TensorClassification, cap_depth, classify_tensor_names, inspect_checkpoint
from .pair import check_pair, tokenizer_fingerprint

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
    "TensorClassification",
    "TokenizerError",
    "add_parser",
    "cap_depth",
    "check_pair",
    "classify_tensor_names",
    "format_pair",
    "format_report",
    "inspect_checkpoint",
    "read_safetensors_header",
    "run",
    "tokenizer_fingerprint",
]
