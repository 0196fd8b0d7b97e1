"""pytest11 entry point: options and fixtures only; logic lives in the library.

Must not import mlx at load time: the plugin is loaded by every pytest run in
an environment where mtpcheck is installed.
"""

from __future__ import annotations


def pytest_addoption(parser):
    group = parser.getgroup("mtpcheck", "mtpcheck: speculative decoding conformance")
    group.addoption("--mtp-backend", default="mlx", help="backend name, entry point, or package.module:factory (default: mlx)")
    group.addoption("--mtp-backend-option", action="append", default=[], metavar="KEY=VALUE",
                    help="option passed to the backend factory (repeatable)")
