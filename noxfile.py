"""nox sessions: tests, lint, conformance (for backend authors)."""

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"


@nox.session
def tests(session):
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs, env={"MLX_DISABLE_COMPILE": "1"})


@nox.session
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", "mtpcheck", "research", "tests", "benchmarks", "noxfile.py")


@nox.session
def mutants(session):
    """The mutant zoo against the suite; writes the kill matrix to docs/mutants.md.
    `nox -s mutants -- --black-box`: the black-box column (white-box capabilities withheld)."""
    session.install("-e", ".")
    session.run("mtpcheck", "mutants", *session.posargs, env={"MLX_DISABLE_COMPILE": "1"})


@nox.session
def conformance(session):
    """Point the suite at your runtime:
    nox -s conformance -- --mtp-backend=pkg.mod:factory [--mtp-backend-option KEY=VALUE ...]"""
    session.install("-e", ".")
    args = session.posargs or ["--mtp-backend=mlx"]
    session.run("pytest", "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", *args,
                env={"MLX_DISABLE_COMPILE": "1"})
