"""`mtpcheck`: generate, explain-divergence, run, contracts, inspect.

Bad arguments give one clear line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage too)
        sys.stderr.write(f"mtpcheck: error: {message}\n")
        sys.exit(2)


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
        return value

    return parse


def _fail(message: str) -> int:
    sys.stderr.write(f"mtpcheck: error: {message}\n")
    return 2


def cmd_generate(args) -> int:
    import pydantic

    from mtpcheck.backends import UnknownBackendError, load_backend, parse_options
    from mtpcheck.contracts import (
        GenerationRequest,
        SpeculationUnavailableError,
        check_prompt_length,
    )

    try:
        spec = False if args.speculation == "off" else {
            "mode": "native_mtp", "require_acceleration": args.require_acceleration,
            **({"num_draft_tokens": args.num_draft_tokens} if args.num_draft_tokens is not None else {}),
            **({"drafter": args.drafter} if args.drafter else {}),
        }
        sampling = {"temperature": args.temperature, "seed": args.seed}
        for name in ("top_k", "top_p", "min_p", "repetition_penalty"):
            if getattr(args, name) is not None:
                sampling[name] = getattr(args, name)
        # validate the request before paying for a backend load
        req = GenerationRequest(prompt_tokens=[0], max_tokens=args.max_tokens, sampling=sampling, speculation=spec,
                                stop=args.stop or [])
        backend = load_backend(args.backend, parse_options(args.backend_option))
        if not backend.capabilities().text:
            return _fail(f"backend {args.backend!r} has no tokenizer")
        prompt = backend.encode(args.prompt)
        if not prompt:
            return _fail("the prompt encodes to no tokens")
        # refused here too, before any forward, for a backend that does not check it itself
        check_prompt_length(prompt, backend.capabilities().context_length)
        res = backend.generate(req.model_copy(update={"prompt_tokens": prompt}))
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        return _fail(f"{'.'.join(map(str, err['loc']))}: {err['msg']}")
    except (UnknownBackendError, SpeculationUnavailableError, ValueError) as exc:
        return _fail(str(exc))
    if args.json:
        print(res.model_dump_json(indent=2, exclude={"events", "trace"}))
        return 0
    s = res.speculation
    print(res.text)
    print("---")
    print(f"tokens: {len(res.tokens)}  finish: {res.finish_reason}  seed: {res.seed}")
    if s.used:
        print(f"speculation: {s.draft_kind} depth {s.num_draft_tokens}, {s.acceptance_rule}; rounds {s.rounds}, "
              f"drafted {s.drafted}, accepted {s.accepted} (rate "
              f"{'n/a' if s.acceptance_rate is None else format(s.acceptance_rate, '.2f')}), "
              f"{len(res.tokens) / max(s.rounds, 1):.2f} tokens per round")
    else:
        print(f"speculation: not used ({s.reason}): {s.message}")
    return 0


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of token ids (e.g. '12,7,301')") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: token ids must be one or more integers >= 0")
    return ids


def _at_least_one(text: str) -> int:
    value = _positive(int)(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def cmd_explain_divergence(args) -> int:
    """Greedy plain vs speculative on one backend: where they part and why
    (mtpcheck.machinery.triage). Exit 0: no divergence or a near-tie; 1: structural or
    undetermined; 2: bad input."""
    from mtpcheck.backends import UnknownBackendError, load_backend, parse_options
    from mtpcheck.contracts import SpeculationUnavailableError, check_prompt_length
    from mtpcheck.machinery.triage import explain_divergence

    try:
        backend = load_backend(args.backend, parse_options(args.backend_option))
        caps = backend.capabilities()
        if args.prompt_ids is not None:
            bad = [t for t in args.prompt_ids if t >= caps.vocab_size]
            if bad:
                return _fail(f"--prompt-ids: {bad[:5]} outside the vocabulary of size {caps.vocab_size}")
            prompt = args.prompt_ids
        else:
            if not caps.text:
                return _fail(f"backend {args.backend!r} has no tokenizer; pass --prompt-ids")
            prompt = backend.encode(args.prompt)
            if not prompt:
                return _fail("the prompt encodes to no tokens")
        check_prompt_length(prompt, caps.context_length)
        if caps.max_depth < 1 or not caps.mtp_kinds:
            return _fail(f"backend {args.backend!r} cannot speculate (max_depth={caps.max_depth}, "
                         f"mtp_kinds={caps.mtp_kinds}): nothing to compare")
        report = explain_divergence(backend, prompt, args.num_draft_tokens, args.max_tokens,
                                    logit_magnitude=args.logit_magnitude, name=args.backend)
    except (UnknownBackendError, SpeculationUnavailableError, ValueError) as exc:
        return _fail(str(exc))
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.verdict in ("no-divergence", "near-tie") else 1


def _xdist_args(jobs: str) -> list[str]:
    """--jobs N|auto -> pytest-xdist's arguments. Whole modules go to one worker
    (loadscope): a module's shared samples (DIST-ZERO and DIST-EQUIV judge the
    same runs) are then drawn once, not once per worker."""
    from mtpcheck.machinery.settings import SettingsError

    if jobs == "auto":
        n = os.cpu_count() or 1
    else:
        n = int(jobs) if jobs.isdigit() and int(jobs) > 0 else None
    if n is None:
        raise SettingsError(f"--jobs: expected a positive integer or 'auto', got {jobs!r}")
    if n == 1:
        return []
    if importlib.util.find_spec("xdist") is None:  # found, not imported: pytest loads it as a plugin
        raise SettingsError(f"--jobs {jobs}: needs pytest-xdist (pip install pytest-xdist, or mtpcheck[dev])")
    return ["-n", str(n), "--dist", "loadscope"]


def cmd_run(args) -> int:
    """The conformance run: the suite through pytest, a clause table, a JSON report.
    Settings are checked here first, so a bad one is exit 2 in one line."""
    import pytest

    from mtpcheck.backends import UnknownBackendError, parse_options, resolve_factory
    from mtpcheck.machinery.settings import (
        SettingsError,
        check_backend_options,
        check_id_file,
        check_seed,
        check_writable,
    )

    try:
        check_backend_options(args.backend, resolve_factory(args.backend), parse_options(args.backend_option))
        check_seed(args.seed)
        for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
            check_writable(path, flag)
        for flag, path in (("--xfails-file", args.xfails_file), ("--skips-file", args.skips_file)):
            check_id_file(path, flag)
        jobs = _xdist_args(args.jobs)
    except (UnknownBackendError, SettingsError) as exc:
        return _fail(str(exc).removeprefix("--mtp-backend-option: "))
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    pytest_args = ["--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "-q", "-rfE",
                   f"--mtp-backend={args.backend}", f"--mtp-profile={args.profile}", f"--mtp-seed={args.seed}"]
    pytest_args += [f"--mtp-backend-option={o}" for o in args.backend_option]
    for flag, value in (("--mtp-json", args.json), ("--mtp-markdown", args.markdown),
                        ("--mtp-xfails-file", args.xfails_file), ("--mtp-skips-file", args.skips_file)):
        if value:
            pytest_args.append(f"{flag}={value}")
    pytest_args += jobs
    pytest_args += args.pytest_args
    code = pytest.main(pytest_args)
    return int(code)


def cmd_contracts(args) -> int:
    from mtpcheck.catalogue import check, export_json, export_markdown, load_catalogue
    from mtpcheck.contracts.schemas import schema_drift, write_schemas

    folder = Path(args.dir)
    if args.action == "list":
        for c in load_catalogue().clause:
            print(f"{c.id:<26} {c.kind:<11} needs [{', '.join(c.requires)}]  {c.title}")
        return 0
    if args.action == "export":
        write_schemas(folder / "schemas")
        (folder / "clauses.json").write_text(export_json())
        (folder / "clauses.md").write_text(export_markdown())
        print(f"wrote {folder / 'schemas'}, {folder / 'clauses.json'} and {folder / 'clauses.md'}")
        return 0
    problems = check()
    drift = schema_drift(folder / "schemas") if (folder / "schemas").is_dir() else []
    for name, text in (("clauses.json", export_json()), ("clauses.md", export_markdown())):
        if (folder / name).is_file() and (folder / name).read_text() != text:
            drift.append(name)
    problems += [f"{folder}/{d}: drifted from the models; run `mtpcheck contracts export`" for d in drift]
    for p in problems:
        print(p)
    if not problems:
        print(f"{len(load_catalogue().clause)} clauses, every one tested; every suite test names a clause")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    from mtpcheck import __version__
    from mtpcheck import inspect as inspect_mod

    parser = _Parser(prog="mtpcheck", description="Conformance suite for speculative decoding runtimes")
    parser.add_argument("--version", action="version", version=f"mtpcheck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate with a backend and print the speculation report")
    g.add_argument("--prompt", required=True)
    g.add_argument("--backend", default="mlx")
    g.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--speculation", choices=["native_mtp", "off"], default="native_mtp")
    g.add_argument("--drafter", choices=["mtp", "assistant"])
    g.add_argument("--num-draft-tokens", type=_positive(int))
    g.add_argument("--require-acceleration", action="store_true")
    g.add_argument("--temperature", type=_positive(float), default=0.0)
    g.add_argument("--top-k", type=_positive(int))
    g.add_argument("--top-p", type=_positive(float))
    g.add_argument("--min-p", type=_positive(float))
    g.add_argument("--repetition-penalty", type=_positive(float))
    g.add_argument("--seed", type=_positive(int), default=0)
    g.add_argument("--max-tokens", type=_positive(int), default=64)
    g.add_argument("--stop", action="append")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_generate)

    x = sub.add_parser("explain-divergence", help="greedy plain vs speculative: the first divergence, near-tie or structural")
    x.add_argument("--backend", default="mlx")
    x.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE")
    which = x.add_mutually_exclusive_group(required=True)
    which.add_argument("--prompt", help="prompt text (backends with a tokenizer)")
    which.add_argument("--prompt-ids", type=_token_ids, metavar="IDS", help="prompt token ids, e.g. '12,7,301'")
    x.add_argument("--num-draft-tokens", type=_at_least_one, help="speculation depth (default: the backend's)")
    x.add_argument("--max-tokens", type=_at_least_one, default=64)
    x.add_argument("--logit-magnitude", type=float, default=None,
                   help="|logit| at which gaps are counted in ulps (the law fixes differences only; default: the "
                        "backend's logit_scale)")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=cmd_explain_divergence)

    r = sub.add_parser("run", help="run the conformance suite against a backend")
    r.add_argument("--backend", default="mlx")
    r.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--profile", choices=["ci", "dev", "thorough"], default="ci")
    r.add_argument("--seed", default="1234")
    r.add_argument("--json", metavar="PATH", help="the JSON report (docs/report.md)")
    r.add_argument("--markdown", metavar="PATH", help="the clause table with the evidence summary, for a pull request")
    r.add_argument("--xfails-file")
    r.add_argument("--skips-file")
    r.add_argument("--jobs", default="1", metavar="N|auto",
                   help="parallel pytest workers (pytest-xdist), one module to a worker; auto: one per CPU")
    r.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("contracts", help="the clause catalogue and the exported schemas")
    c.add_argument("action", choices=["check", "list", "export"])
    c.add_argument("--dir", default="contracts", help="where exported schemas and clauses.json live")
    c.set_defaults(func=cmd_contracts)

    inspect_mod.add_parser(sub)
    from mtpcheck.machinery import golden
    from mtpcheck.measurement import bench, scale
    from mtpcheck.mutants import run as mutants_run

    golden.add_parser(sub)
    bench.add_parser(sub)
    scale.add_parser(sub)
    mutants_run.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["main", "build_parser"]
