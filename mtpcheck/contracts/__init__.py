"""Pydantic contracts shared by the engine, the backends and the suite."""

from .errors import (
    BackendError,
    MtpCheckError,
    PromptTooLongError,
    SettingsError,
    SpeculationUnavailableError,
    check_prompt_length,
)
from .models import (
    Capabilities,
    Event,
    FinishEvent,
    GenerationRequest,
    GenerationResult,
    OutputConstraint,
    RoundTrace,
    SamplingParams,
    SpeculationReport,
    SpeculationRequest,
    StopEvent,
    StreamChunk,
    TextEvent,
    TokenEvent,
)

__all__ = [
    "BackendError",
    "Capabilities",
    "Event",
    "FinishEvent",
    "GenerationRequest",
    "OutputConstraint",
    "GenerationResult",
    "MtpCheckError",
    "PromptTooLongError",
    "RoundTrace",
    "SamplingParams",
    "SettingsError",
    "SpeculationReport",
    "SpeculationRequest",
    "SpeculationUnavailableError",
    "StopEvent",
    "StreamChunk",
    "TextEvent",
    "TokenEvent",
    "check_prompt_length",
]
