"""Backend selection, as in array-api-tests: a built-in name, an entry point
in the group "mtpcheck.backends", or "package.module:factory". The factory
is called with the --mtp-backend-option KEY=VALUE pairs as keyword strings."""

from __future__ import annotations

import importlib
import inspect
import traceback
from importlib.metadata import entry_points

from mtpcheck.contracts import MtpCheckError, SettingsError

BUILTINS: dict[str, str] = {
    "mlx": "mtpcheck.backends.reference:load_reference",
    "toy": "mtpcheck.backends.toy:load_toy",
    "mlx-vlm": "mtpcheck.backends.mlx_vlm:load_mlx_vlm",
    "mlx-lm": "mtpcheck.backends.mlx_lm:load_mlx_lm",
    "mlx-lm-server": "mtpcheck.backends.mlx_lm_server:load_mlx_lm_server",
    "llama-server": "mtpcheck.backends.llama_server:load_llama_server",
    "openai-http": "mtpcheck.backends.openai_http:load_openai_http",
    "transformers": "mtpcheck.backends.transformers_backend:load_transformers",
    "vllm": "mtpcheck.backends.vllm_server:load_vllm",
    "openvino": "mtpcheck.backends.openvino_backend:load_openvino",
}
ENTRY_POINT_GROUP = "mtpcheck.backends"


class UnknownBackendError(MtpCheckError):
    pass


def known_backends() -> dict[str, str]:
    found = dict(BUILTINS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def resolve_factory(name: str):
    """Name -> factory callable; one-line errors that list the known names."""
    known = known_backends()
    target = known.get(name)
    if target is None and ":" not in name:
        raise UnknownBackendError(
            f"unknown backend {name!r}; known: {', '.join(sorted(known))} (or use package.module:factory)"
        )
    module_name, _, attr = (target or name).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownBackendError(f"backend {name!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownBackendError(f"backend {name!r}: module {module_name!r} has no attribute {attr!r}") from None


def parse_options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UnknownBackendError(f"backend option {pair!r} is not KEY=VALUE")
        options[key.strip()] = value
    return options


class BackendLoadError(UnknownBackendError):
    """The backend's factory raised: its own exception and where it came from.
    (An UnknownBackendError, so callers that report a bad backend in one line still do.)"""


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame of the exception (where it was raised)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}"


def factory_options(factory) -> list[str] | None:
    """The keyword options a backend factory accepts, from its signature; None if it takes **kwargs."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_backend_options(name: str, factory, options: dict[str, str]) -> None:
    """Unknown option keys fail before the factory runs, listing the accepted ones."""
    accepted = factory_options(factory)
    if accepted is None:
        return
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise SettingsError(f"--mtp-backend-option: backend {name!r} has no option {', '.join(map(repr, unknown))}; "
                            f"it accepts: {', '.join(accepted) or 'no options'}")


def load_backend(name: str, options: dict[str, str] | None = None):
    """Call the factory with the options; unknown keys are a SettingsError
    (checked against its signature first, so that a TypeError raised inside
    the factory is reported as the bug it is, not as a bad option)."""
    factory = resolve_factory(name)
    check_backend_options(name, factory, options or {})
    try:
        return factory(**(options or {}))
    except Exception as exc:
        what = getattr(factory, "__qualname__", repr(factory))
        raise BackendLoadError(f"backend {name!r}: factory {what}() raised {type(exc).__name__}: {exc} "
                               f"(at {_where(exc)})") from exc
