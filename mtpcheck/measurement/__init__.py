"""Measurement programs (docs/architecture.md): speed benchmarks with gates
(bench), one request through several runtimes (side_by_side, two_engines),
the suite's power and its false-failure calibration (power, calibrate), the
acceptance of the real-backend fixtures (real_acceptance). They use the
machinery (its statistical plan: mtpcheck.machinery.configs), backends and
fixture; they import none of the suite's test modules, and nothing in the
suite imports them."""

from pathlib import Path


def write_section(out: Path, start: str, end: str, block: str) -> None:
    """Replace the generated block between `start` and `end` in a doc (the
    block includes both markers), or append it when the doc has none."""
    text = out.read_text() if out.exists() else ""
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    out.write_text(text)
    print(f"wrote {out}")
