"""Start-up checks of a run's settings, shared by the pytest plugin (a
pytest.UsageError, exit 4) and `mtpcheck run` (exit 2): a bad value is the
user's error, said once in one line naming the value and what is allowed."""

from __future__ import annotations

import os
from pathlib import Path

from mtpcheck.backends import check_backend_options, factory_options  # noqa: F401 - part of the start-up checks
from mtpcheck.contracts import SEED_LIMIT, SettingsError


def check_timeout(value: float | str | None, option: str = "--mtp-timeout") -> float | None:
    """Seconds per backend call; None or 0 mean no timeout (the option's own `0: none`)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{option}: {value!r} is not a number of seconds") from None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise SettingsError(f"{option}: {value!r} is not allowed; give seconds > 0, or 0 for no timeout")
    return seconds or None


def check_seed(text: str | int) -> int:
    """The base seed: an integer in [0, 2**63), or 'random'."""
    text = str(text).strip()
    if text == "random":
        import secrets

        return secrets.randbelow(2**31)
    try:
        seed = int(text)
    except ValueError:
        raise SettingsError(f"--mtp-seed: {text!r} is not an integer or 'random'") from None
    if not 0 <= seed < SEED_LIMIT:
        raise SettingsError(f"--mtp-seed: {seed} is outside [0, 2**63); give a seed in 0..{SEED_LIMIT - 1} or 'random'")
    return seed


def check_writable(path: str | Path | None, option: str) -> None:
    """The report can be written there: checked before the run, not after it."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise SettingsError(f"{option}: {str(path)!r} is a folder; give a file path")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:  # the report writer creates missing folders
        folder = folder.parent
    if not folder.is_dir():
        raise SettingsError(f"{option}: cannot create {str(path)!r}: {str(folder)!r} is not a folder")
    if target.exists() and not os.access(target, os.W_OK) or not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise SettingsError(f"{option}: {str(path)!r} is not writable (no write permission in {str(folder)!r})")


def check_id_file(path: str | None, option: str) -> list:
    """The xfails/skips file's entries; a missing, folder or non-UTF-8 file is a usage error."""
    from mtpcheck.machinery.report import IdFileError, read_id_file

    if not path:
        return []
    try:
        return read_id_file(path)
    except IdFileError as exc:
        raise SettingsError(f"{option}: {exc}") from None
