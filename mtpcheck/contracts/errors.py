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
