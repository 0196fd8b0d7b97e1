"""mtpcheck: the conformance suite for speculative decoding.

Importing this package (and its pytest plugin) must not import mlx: backends
load it lazily, so the suite can judge runtimes that are not built on MLX.

The public names below are resolved on first access (PEP 562): every pytest
session in an environment where mtpcheck is installed imports this package
for the plugin, and must not pay for numpy and pydantic unless it uses them.
"""

from __future__ import annotations

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "Backend": "mtpcheck.backend",
    "Capabilities": "mtpcheck.contracts",
    "GenerationRequest": "mtpcheck.contracts",
    "GenerationResult": "mtpcheck.contracts",
    "SamplingParams": "mtpcheck.contracts",
    "SpeculationReport": "mtpcheck.contracts",
    "SpeculationRequest": "mtpcheck.contracts",
    "SpeculationUnavailableError": "mtpcheck.contracts",
}

__all__ = [
    "Backend",
    "Capabilities",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "SpeculationReport",
    "SpeculationRequest",
    "SpeculationUnavailableError",
    "__version__",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mtpcheck' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
