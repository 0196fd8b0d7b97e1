"""The ``mtpcheck inspect`` subcommand: argument parser, report formatting, exit codes."""


from __future__ import annotations

import argparse
import sys
from typing import Any

from mtpcheck.contracts.capability import (
    InspectionReport,
    PairReport,
)

from ._base import InspectError, _list_names
from .layout import inspect_checkpoint
from .pair import check_pair

# --------------------------------------------------------------------------- CLI

_PROG = "mtpcheck inspect"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``inspect`` subcommand on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "inspect",
        help="report MTP evidence from a checkpoint's tensor names and metadata",
        description="Inspect a checkpoint (folder, *.safetensors, index.json or *.gguf) and "
        "report whether its weights really carry MTP heads. Exit 0: no problem; 1: a named "
        "mismatch or false positive; 2: bad input.",
    )
    parser.add_argument("path", metavar="PATH", help="checkpoint folder or file")
    parser.add_argument(
        "--drafter", metavar="PATH", default=None, help="also check this drafter against PATH"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def format_report(report: InspectionReport, title: str = "checkpoint") -> str:
    """Human-readable multi-line summary of an :class:`InspectionReport`."""
    cap = report.capability
    lines = [
        f"{title}: {report.path} ({report.format}; {report.tensor_count} tensors in "
        f"{_list_names(report.weight_sources)}; {report.bytes_read} bytes read)"
    ]
    if report.config is not None:
        c = report.config
        declared = f"{c.mtp_field}={c.mtp_declared}" if c.mtp_field else "no MTP field"
        lines.append(
            f"  declared ({c.source}): model_type={c.model_type} hidden_size={c.hidden_size} "
            f"vocab_size={c.vocab_size} num_hidden_layers={c.num_hidden_layers}; {declared}"
        )
    lines.append(f"  MTP: {cap.kind}, validated depth {cap.validated_depth}")
    for ev in cap.evidence:
        lines.append(f"    evidence [{ev.kind}] {ev.source}: {ev.detail}")
    if report.declared_drafter:
        lines.append(f"  declares drafter: {report.declared_drafter}")
    for w in cap.warnings:
        lines.append(f"  warning: {w}")
    for f in report.findings:
        label = "FALSE POSITIVE" if f.code == "config_false_positive" else "MISMATCH"
        lines.append(f"  {label}: {f.message}")
    return "\n".join(lines)


def format_pair(pair: PairReport) -> str:
    """Human-readable multi-line summary of a :class:`PairReport`."""
    lines = [format_report(pair.target, "target"), format_report(pair.drafter, "drafter"), "pair:"]
    for c in pair.comparisons:
        state = "not compared" if not c.compared else ("ok" if c.match else "MISMATCH")
        lines.append(f"  {c.field}: target={c.target} drafter={c.drafter} [{state}]")
    for w in pair.warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


def _problems(report: InspectionReport, role: str) -> list[str]:
    return [f"{role}: {f.message}" for f in report.findings]


def run(args: argparse.Namespace) -> int:
    """Run ``mtpcheck inspect``. Exit 0: ok; 1: named mismatch/false positive; 2: bad input."""
    try:
        if getattr(args, "drafter", None):
            pair = check_pair(args.path, args.drafter, strict=False)
            out = pair.model_dump_json(indent=2) if args.json else format_pair(pair)
            problems = _problems(pair.target, "target") + _problems(pair.drafter, "drafter")
            problems += [
                f"drafter mismatch: {c.field}: target={c.target} drafter={c.drafter}"
                for c in pair.mismatches
            ]
        else:
            report = inspect_checkpoint(args.path)
            out = report.model_dump_json(indent=2) if args.json else format_report(report)
            problems = [f.message for f in report.findings]
    except (InspectError, OSError) as exc:
        print(f"{_PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # never a traceback on the command line
        print(
            f"{_PROG}: error: unexpected {type(exc).__name__}: {_one_line(str(exc))}",
            file=sys.stderr,
        )
        return 2
    print(out, file=sys.stdout)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"{_PROG}: {_one_line(problems[0])}{more}", file=sys.stderr)
        return 1
    return 0
