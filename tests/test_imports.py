import subprocess
import sys


def test_importing_the_package_and_plugin_does_not_import_mlx():
    code = ("import sys, mtpcheck, mtpcheck.plugin, mtpcheck.machinery.checks, mtpcheck.machinery.harness, mtpcheck.machinery.report, "
            "mtpcheck.laws.stats, mtpcheck.catalogue, mtpcheck.inspect, mtpcheck.backends, mtpcheck.fixture, mtpcheck.cli; "
            "print(sorted(m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_canonical_paths_import_and_the_old_aliases_are_gone():
    """mtpcheck.assertions, .checks, .scheduling and .strategies were aliases
    of the mtpcheck.machinery modules (issue 15); docs and code use the
    canonical paths, and the aliases no longer import (issue 22)."""
    import importlib

    import pytest

    for name in ("assertions", "checks", "scheduling", "strategies", "configs"):
        importlib.import_module(f"mtpcheck.machinery.{name}")
    for old in ("mtpcheck.assertions", "mtpcheck.checks", "mtpcheck.scheduling", "mtpcheck.strategies"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_the_scheduling_protocol_is_a_contract_reexported_by_the_machinery():
    """The engine implements the protocol from mtpcheck.contracts.scheduling;
    mtpcheck.machinery.scheduling (docs/scheduler.md) hands out the same objects."""
    from mtpcheck.contracts import scheduling as contract
    from mtpcheck.machinery import scheduling

    for name in contract.__all__:
        assert getattr(scheduling, name) is getattr(contract, name), name
