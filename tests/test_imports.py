import subprocess
import sys


def test_importing_the_package_and_plugin_does_not_import_mlx():
    code = ("import sys, mtpcheck, mtpcheck.plugin, mtpcheck.machinery.checks, mtpcheck.machinery.harness, mtpcheck.machinery.report, "
            "mtpcheck.laws.stats, mtpcheck.catalogue, mtpcheck.inspect, mtpcheck.backends, mtpcheck.fixture, mtpcheck.cli; "
            "print(sorted(m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
