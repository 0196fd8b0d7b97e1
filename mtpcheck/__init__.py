"""mtpcheck: the conformance suite for speculative decoding.

Importing this package (and its pytest plugin) must not import mlx: backends
load it lazily, so the suite can judge runtimes that are not built on MLX.
"""

from mtpcheck.backend import Backend
from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculationReport,
    SpeculationRequest,
    SpeculationUnavailableError,
)

__version__ = "0.1.0"

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
