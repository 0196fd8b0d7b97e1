"""The Backend protocol every runtime under test implements.

Small surface, richer capabilities optional: a capability a backend does not
declare turns the clauses that need it into skips that name it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from mtpcheck.contracts import Capabilities, GenerationRequest, GenerationResult, SamplingParams


@runtime_checkable
class Backend(Protocol):
    def capabilities(self) -> Capabilities:
        """What this runtime can do; read once per session."""
        ...

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """One request, speculation on or off as the request says, on the
        same loaded runtime every call (seed 001, "Comparing fairly")."""
        ...

    def target_distributions(
        self, prompt: list[int], continuation: list[int], sampling: SamplingParams
    ) -> np.ndarray:
        """Processed target law [len(continuation), V], float64, speculation
        off, teacher-forced: row i is the law of continuation[i] given
        prompt + continuation[:i]. Ground truth for statistical clauses.
        Backends without it raise NotImplementedError and declare
        `target_distributions=False`."""
        ...


class DraftLawBackend(Protocol):
    """Optional: backends that can replay their drafter's law (capability
    `draft_distributions`): the ground truth of the proposal law."""

    def draft_distributions(self, request: GenerationRequest, tokens: list[int], accept_lens: list[int],
                            draft_lens: list[int]) -> np.ndarray:
        """[len(tokens), V], float64: row i the processed law the proposal at
        output index i was drawn from (the round's accepted proposals and its
        first rejected one, read from the report's accept_lens and draft_lens),
        given the emitted prefix; zeros where no proposal stood."""
        ...


class ParallelSamplesBackend(Protocol):
    """Optional: backends that serve n samples of one request in one call
    (capability `parallel_samples`, OpenAI's `n`)."""

    def generate_n(self, request: GenerationRequest, n: int) -> list[GenerationResult]:
        """n samples of the request, in the runtime's order; with a seed, the
        same n samples on every call."""
        ...


class RawLogitsBackend(Protocol):
    """Optional: backends that expose their target's raw logits (capability
    `raw_logits`): CTRL-CONTRACT's ground truth for penalties and logit bias."""

    def target_logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        """Unprocessed target logits [len(continuation), V], speculation off,
        teacher-forced: row i the next-token logits after prompt +
        continuation[:i], before logit bias, penalties, temperature and filters."""
        ...


class TextBackend(Protocol):
    """Optional: backends with a tokenizer (capability `text`)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...
