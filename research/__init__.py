"""Research programs: each measures the suite, its fixtures or the runtimes
and regenerates a docs page (research/README.md lists them). They live in the
checkout, not the package: run them from the checkout root as
`python -m research.<program>`. They may import anything of mtpcheck but its
test modules (the statistical plan they measure is mtpcheck.machinery.configs);
nothing in mtpcheck imports them (tests/test_layers.py)."""

from pathlib import Path

# the checkout the programs run from: the docs pages they rewrite live here,
# whichever copy of mtpcheck is installed
ROOT = Path(__file__).resolve().parents[1]


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
