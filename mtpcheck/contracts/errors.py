"""Named errors. A backend author reads these names in failures."""


class MtpCheckError(Exception):
    """Base of mtpcheck's own errors."""


class SpeculationUnavailableError(MtpCheckError):
    """Speculation was required (require_acceleration) but cannot run.

    Raised before generation starts; `reason` is a SpeculationReport reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class BackendError(MtpCheckError):
    """A backend raised, hung, or returned something malformed."""


class PromptTooLongError(MtpCheckError, ValueError):
    """A prompt longer than the backend's declared context (Capabilities.context_length).

    A ValueError too: it is a bad request, refused before any forward."""

    def __init__(self, length: int, limit: int):
        super().__init__(f"prompt_tokens: {length} tokens exceed the context length {limit}")
        self.length, self.limit = length, limit


def check_prompt_length(prompt_tokens, limit: int | None) -> None:
    """Refuse a prompt longer than `limit` tokens (None: no bound) before any
    forward: attention over an unbounded prompt grows quadratically in memory.
    Backends call it first thing in generate() and target_distributions()."""
    n = len(prompt_tokens)
    if limit is not None and n > limit:
        raise PromptTooLongError(n, limit)


class SettingsError(MtpCheckError, ValueError):
    """A bad setting: one line naming the option, the value and what is allowed."""
