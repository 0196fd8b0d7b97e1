"""Golden-output snapshots (syrupy) of generations, per backend.

A golden is what one backend produced for one fixed case: a fixture prompt
(structured or prose) x a sampling configuration (greedy, temperature 1,
top-p 0.9) x a seed (0, 1) x a speculation depth (1, 3). They live under
``golden/<backend>/test_golden.ambr`` at the repository root (or under
``$MTPCHECK_GOLDEN_DIR``), one amber file per backend, one entry per case,
each entry a JSON document (stable field order, as the pydantic models
declare their fields).

Pieces, for syrupy:

* ``golden_ext.GoldenExtension`` (through :func:`golden_extension`): the amber
  storage rooted at ``golden/<backend>/``, the serializer (:func:`serialize`),
  the comparator (:func:`compare`: tokens, ints, strings and booleans
  exactly; floats within ``|a - b| <= ABS_TOL + REL_TOL * |golden|``), and a
  readable token-level diff (:func:`diff_lines`) that names the first
  divergent token position.
* matchers (:data:`DEFAULT_MATCHERS`): :func:`strip_timings` drops
  ``draft_time_s`` and ``verify_time_s``; :func:`strip_run_dependent` also
  drops the other fields that depend on the run rather than on the output
  (``trace``, ``events``); :func:`normalise_paths` keeps only the last
  component of absolute paths (a drafter loaded from a checkout).

The cases (:data:`CASES`), the backends (:data:`GOLDEN_BACKENDS`) and
``mtpcheck golden update|check [--backend NAME]`` (:func:`add_parser`) live
here too; the tests are ``tests/test_golden.py``.

Importing this module does not import mlx.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from mtpcheck.contracts import GenerationRequest, GenerationResult, SamplingParams

# -- the cases ---------------------------------------------------------------

ABS_TOL = 1e-5
REL_TOL = 1e-4
FLOAT_DIGITS = 7  # significant digits kept on disk (far inside the tolerance)

SAMPLINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "t1": {"temperature": 1.0},
    "topp0.9": {"temperature": 1.0, "top_p": 0.9},
}
KINDS = ("structured", "prose")
SEEDS = (0, 1)
DEPTHS = (1, 3)
MAX_TOKENS = 16

# name -> "package.module:factory" (resolved by mtpcheck.backends.load_backend);
# the reference is required, the real adapters are skipped, with the reason,
# where their library or their fixture is missing.
GOLDEN_BACKENDS: dict[str, str] = {
    "mlx": "mtpcheck.backends.reference:load_reference",
    "mlx-lm": "mtpcheck.backends.mlx_lm:load_mlx_lm",
    "mlx-vlm": "mtpcheck.backends.mlx_vlm:load_mlx_vlm",
}
REQUIRED_BACKENDS = ("mlx",)
ENV_DIR = "MTPCHECK_GOLDEN_DIR"
ENV_BACKENDS = "MTPCHECK_GOLDEN_BACKENDS"


@dataclass(frozen=True)
class GoldenCase:
    kind: str
    sampling: str
    seed: int
    depth: int
    max_tokens: int = MAX_TOKENS

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.sampling}-seed{self.seed}-depth{self.depth}"

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(**SAMPLINGS[self.sampling], seed=self.seed)

    def request(self, prompt: list[int]) -> GenerationRequest:
        return GenerationRequest(
            prompt_tokens=prompt, max_tokens=self.max_tokens, sampling=self.sampling_params(),
            speculation={"mode": "native_mtp", "num_draft_tokens": self.depth},
        )

    def describe(self) -> dict[str, Any]:
        return {"prompt": self.kind, "sampling": SAMPLINGS[self.sampling], "seed": self.seed,
                "depth": self.depth, "max_tokens": self.max_tokens}


CASES: list[GoldenCase] = [GoldenCase(k, s, seed, d)
                           for k, s, seed, d in itertools.product(KINDS, SAMPLINGS, SEEDS, DEPTHS)]


class GoldenRecord(BaseModel):
    """What one golden entry holds: the case, the prompt ids, each output
    token's own text (for the diff), and the backend's result."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    case: dict[str, Any]
    prompt_tokens: list[int]
    pieces: list[str] | None = None
    result: GenerationResult


def prompt_tokens(backend, kind: str, prompts: Mapping[str, str]) -> list[int]:
    """The prompt text of this kind (``prompts[kind]``) through the backend's own tokenizer."""
    return list(backend.encode(prompts[kind]))


def run_case(name: str, backend, case: GoldenCase, prompts: Mapping[str, str]) -> GoldenRecord:
    """One golden entry. `prompts` maps each of KINDS to its prompt text: the
    caller's (tests/test_golden.py passes the fixture's, mtpcheck.fixture.PROMPTS)."""
    prompt = prompt_tokens(backend, case.kind, prompts)
    res = backend.generate(case.request(prompt))
    decode = getattr(backend, "decode", None)
    pieces = [decode([t]) for t in res.tokens] if decode else None
    return GoldenRecord(backend=name, case=case.describe(), prompt_tokens=prompt, pieces=pieces, result=res)


def selected_backends() -> list[str] | None:
    """Backends named in $MTPCHECK_GOLDEN_BACKENDS (None: all)."""
    names = [b.strip() for b in os.environ.get(ENV_BACKENDS, "").split(",") if b.strip()]
    return names or None


def load_golden_backend(name: str):
    """(backend, None) or (None, reason). The reference must load: its failure raises."""
    from mtpcheck.backends import load_backend

    spec = GOLDEN_BACKENDS.get(name, name)
    if name in REQUIRED_BACKENDS:
        return load_backend(spec), None
    module_name = spec.partition(":")[0]
    try:  # a real adapter's shipped fixture: absent -> skip before importing its library
        import importlib

        fixture_dir = getattr(importlib.import_module(module_name), "fixture_dir", None)
        folder = fixture_dir() if fixture_dir else None
    except Exception as exc:
        return None, f"backend {name!r} did not import ({type(exc).__name__}: {exc})"
    if folder is not None and not Path(folder).is_dir():
        return None, f"backend {name!r}: its fixture {folder} is not there (not built or not shipped yet)"
    try:
        return load_backend(spec), None
    except Exception as exc:  # a real adapter that cannot load here is skipped, with the reason
        text = " ".join(str(exc).split())
        return None, f"backend {name!r} did not load ({type(exc).__name__}: {text[:300]})"


# -- serialization -----------------------------------------------------------

STRIP = object()  # a matcher's answer: drop this key
TIMING_FIELDS = frozenset({"draft_time_s", "verify_time_s"})
RUN_DEPENDENT_FIELDS = TIMING_FIELDS | {"trace", "events"}
Matcher = Callable[..., Any]


def _key(path) -> Any:
    return path[-1][0] if path else None


def strip_timings(*, data: Any, path) -> Any:
    """Drop the wall-clock timings of the speculation report."""
    return STRIP if _key(path) in TIMING_FIELDS else data


def strip_run_dependent(*, data: Any, path) -> Any:
    """Drop timings and the other fields that describe the run, not the output:
    ``trace`` (white-box, asked for separately) and ``events`` (the stream
    restates tokens, logprobs and text)."""
    return STRIP if _key(path) in RUN_DEPENDENT_FIELDS else data


def normalise_paths(*, data: Any, path) -> Any:
    """An absolute path (a drafter loaded from this checkout) -> its last component."""
    if isinstance(data, str) and data.startswith("/") and "\n" not in data and len(data) < 4096:
        return "<path>/" + Path(data).name
    return data


DEFAULT_MATCHERS: tuple[Matcher, ...] = (strip_run_dependent, normalise_paths)


def _plain(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")  # fields in declaration order
    return data


def _round(x: float) -> float | str:
    if math.isnan(x) or math.isinf(x):
        return repr(x)
    return float(f"{x:.{FLOAT_DIGITS}g}")


def _walk(data: Any, path: tuple, matchers: Iterable[Matcher], exclude, include) -> Any:
    for m in matchers:
        data = m(data=data, path=path)
        if data is STRIP:
            return STRIP
    data = _plain(data)
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():  # insertion order: stable, as declared
            if exclude is not None and exclude(prop=k, path=path):
                continue
            if include is not None and not include(prop=k, path=path):
                continue
            w = _walk(v, (*path, (k, type(v))), matchers, exclude, include)
            if w is not STRIP:
                out[str(k)] = w
        return out
    if isinstance(data, list | tuple):
        items = [_walk(v, (*path, (i, type(v))), matchers, exclude, include) for i, v in enumerate(data)]
        return [v for v in items if v is not STRIP]
    if isinstance(data, float):
        return _round(data)
    return data


def _render(value: Any, indent: int = 0) -> str:
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        body = ",\n".join(f"{inner}{json.dumps(k)}: {_render(v, indent + 1)}" for k, v in value.items())
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(value, list):
        if all(not isinstance(v, dict | list) for v in value):  # scalars: one line
            return "[" + ", ".join(json.dumps(v, ensure_ascii=False) for v in value) + "]"
        return "[\n" + ",\n".join(inner + _render(v, indent + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False)


def to_document(data: Any, *, exclude=None, include=None, matcher: Matcher | None = None,
                matchers: Iterable[Matcher] = DEFAULT_MATCHERS) -> Any:
    """The JSON-able, filtered form of a result: what :func:`serialize` renders."""
    chain = (*matchers, *((matcher,) if matcher else ()))
    return _walk(data, (), chain, exclude, include)


def serialize(data: Any, *, exclude=None, include=None, matcher: Matcher | None = None,
              matchers: Iterable[Matcher] = DEFAULT_MATCHERS) -> str:
    """A pydantic result (or a dict of them) as a JSON text: fields in the
    models' declared order, lists of scalars on one line, floats to
    FLOAT_DIGITS significant digits, run-dependent fields stripped."""
    return _render(to_document(data, exclude=exclude, include=include, matcher=matcher, matchers=matchers))


# -- comparison and diff -----------------------------------------------------


def floats_close(now: float, golden: float) -> bool:
    return abs(now - golden) <= ABS_TOL + REL_TOL * abs(golden)


def compare(now: Any, golden: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Differences (path, golden, now): floats within the tolerance, anything
    else exactly (ints never compare equal to floats by tolerance, tokens are ints)."""
    if isinstance(golden, dict) and isinstance(now, dict):
        out = []
        for k in list(golden) + [k for k in now if k not in golden]:
            sub = f"{path}.{k}" if path else k
            if k not in now:
                out.append((sub, golden[k], "<missing>"))
            elif k not in golden:
                out.append((sub, "<missing>", now[k]))
            else:
                out += compare(now[k], golden[k], sub)
        return out
    if isinstance(golden, list) and isinstance(now, list):
        if len(golden) != len(now):
            return [(path, golden, now)]
        return [d for i, (a, b) in enumerate(zip(now, golden, strict=True)) for d in compare(a, b, f"{path}[{i}]")]
    if isinstance(golden, float) and isinstance(now, float):
        return [] if floats_close(now, golden) else [(path, golden, now)]
    if type(golden) is not type(now) or golden != now:
        return [(path, golden, now)]
    return []


def first_divergence(a: list, b: list) -> int | None:
    """First index where the lists differ (a prefix ends there too); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _parse(text: Any) -> Any:
    try:
        return json.loads(str(text))
    except (TypeError, ValueError):
        return None


def _result(doc: Any) -> dict:
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        return doc["result"]
    return doc if isinstance(doc, dict) else {}


def _window(tokens: list, pieces: list | None, at: int, span: int = 3) -> str:
    lo, hi = max(at - span, 0), min(at + span + 1, len(tokens))
    cells = []
    for i in range(lo, hi):
        piece = f" {json.dumps(pieces[i], ensure_ascii=False)}" if pieces and i < len(pieces) else ""
        cell = f"{tokens[i]}{piece}"
        cells.append(f">{cell}<" if i == at else cell)
    if at >= len(tokens):
        cells.append("><end><")
    return ("... " if lo else "") + " | ".join(cells) + (" ..." if hi < len(tokens) else "")


def token_diff(now: Any, golden: Any, name: str = "") -> list[str]:
    """Readable lines: the first divergent token position with the tokens (and
    their text) around it on both sides, then every other differing field."""
    now_doc, golden_doc = (_parse(x) if isinstance(x, str) else x for x in (now, golden))
    if now_doc is None or golden_doc is None:
        return [f"golden {name} is not a golden JSON document; regenerate it with `mtpcheck golden update`"]
    rn, rg = _result(now_doc), _result(golden_doc)
    tn, tg = rn.get("tokens") or [], rg.get("tokens") or []
    pn = now_doc.get("pieces") if isinstance(now_doc, dict) else None
    pg = golden_doc.get("pieces") if isinstance(golden_doc, dict) else None
    lines = [f"golden output changed{f' ({name})' if name else ''}"]
    pos = first_divergence(tn, tg)
    if pos is None:
        lines.append(f"  tokens: identical ({len(tg)} tokens)")
    else:
        lines.append(f"  tokens: first divergent position {pos} (golden {len(tg)} tokens, now {len(tn)})")
        lines.append(f"    golden: {_window(tg, pg, pos)}")
        lines.append(f"    now:    {_window(tn, pn, pos)}")
    if rn.get("text") != rg.get("text"):
        lines.append(f"  text golden: {json.dumps(rg.get('text'), ensure_ascii=False)}")
        lines.append(f"  text now:    {json.dumps(rn.get('text'), ensure_ascii=False)}")
    sn, sg = rn.get("speculation") or {}, rg.get("speculation") or {}
    rounds_at = first_divergence(sn.get("accept_lens") or [], sg.get("accept_lens") or [])
    if rounds_at is not None:
        lines.append(f"  speculation.accept_lens: first divergent round {rounds_at}: "
                     f"golden {sg.get('accept_lens')} now {sn.get('accept_lens')}")
    skip_prefix = ("result.tokens", "result.text", "pieces", "result.speculation.accept_lens",  # shown above
                   "tokens", "text", "speculation.accept_lens")  # the same, for a bare GenerationResult
    rest = [d for d in compare(now_doc, golden_doc) if not d[0].startswith(skip_prefix)]
    floats = [d for d in rest if isinstance(d[1], float) and isinstance(d[2], float)]
    others = [d for d in rest if d not in floats]
    for p, g, n in others[:20]:
        lines.append(f"  {p}: golden {json.dumps(g, ensure_ascii=False)} -> now {json.dumps(n, ensure_ascii=False)}")
    if len(others) > 20:
        lines.append(f"  ... and {len(others) - 20} more differing fields")
    if floats:
        p, g, n = floats[0]
        lines.append(f"  {len(floats)} float(s) outside |now - golden| <= {ABS_TOL:g} + {REL_TOL:g}*|golden|, "
                     f"first {p}: golden {g!r} -> now {n!r}")
    return lines


_EXTENSIONS: dict[tuple[str, str], type] = {}


def default_root() -> Path:
    """$MTPCHECK_GOLDEN_DIR, else ``golden/`` beside the package (the repository root)."""
    env = os.environ.get(ENV_DIR)
    return Path(env).resolve() if env else Path(__file__).resolve().parents[2] / "golden"


def golden_extension(backend: str, root: str | Path | None = None) -> type:
    """The extension class storing this backend's goldens under ``<root>/<backend>/``
    (one class per pair, as syrupy groups collections by extension class)."""
    # syrupy is imported here, not at module level: `mtpcheck run` imports this module for
    # its parser before pytest starts, and pytest warns it cannot rewrite a plugin imported early
    from mtpcheck.machinery.golden_ext import GoldenExtension

    root = Path(root).resolve() if root is not None else default_root()
    key = (backend, str(root))
    if key not in _EXTENSIONS:
        name = "GoldenExtension_" + "".join(c if c.isalnum() else "_" for c in backend)
        _EXTENSIONS[key] = type(name, (GoldenExtension,), {
            "root": root, "backend": backend, "serialize_doc": staticmethod(serialize),
            "parse_doc": staticmethod(_parse), "compare_docs": staticmethod(compare), "diff_docs": staticmethod(token_diff)})
    return _EXTENSIONS[key]


# -- `mtpcheck golden` -------------------------------------------------------


def find_tests(explicit: str | None = None) -> Path | None:
    if explicit:
        return Path(explicit)
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = base / "tests" / "test_golden.py"
        if candidate.is_file():
            return candidate
    return None


def run(args) -> int:
    """``mtpcheck golden update|check``: the golden tests through pytest,
    with ``--snapshot-update`` for update."""
    import pytest

    tests = find_tests(args.tests)
    if tests is None or not tests.is_file():
        sys.stderr.write("mtpcheck: error: tests/test_golden.py not found (run from the repository root or pass --tests)\n")
        return 2
    if args.backend and args.backend not in GOLDEN_BACKENDS:
        sys.stderr.write(f"mtpcheck: error: unknown golden backend {args.backend!r}; known: "
                         f"{', '.join(GOLDEN_BACKENDS)}\n")
        return 2
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    if args.backend:
        os.environ[ENV_BACKENDS] = args.backend
    if args.dir:
        os.environ[ENV_DIR] = str(Path(args.dir).resolve())
    pytest_args = [str(tests), "-p", "no:cacheprovider", "-q", "-rs", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if args.action == "update":
        pytest_args.append("--snapshot-update")
    return int(pytest.main(pytest_args))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``mtpcheck golden update|check [--backend NAME] [--dir DIR]``."""
    p = subparsers.add_parser(
        "golden", help="rewrite (update) or verify (check) the golden-output snapshots",
        description="Golden outputs per backend under golden/<backend>/. 'update' reruns every case and "
        "rewrites the entries that changed (and deletes unused ones); 'check' compares. Other backends are "
        "left as they are.")
    p.add_argument("action", choices=["update", "check"])
    p.add_argument("--backend", choices=sorted(GOLDEN_BACKENDS), help="only this backend (default: all that load)")
    p.add_argument("--dir", help=f"golden root (default: golden/ at the repository root, or ${ENV_DIR})")
    p.add_argument("--tests", help="the golden test file (default: tests/test_golden.py)")
    p.set_defaults(func=run)
    return p


__all__ = [
    "ABS_TOL",
    "CASES",
    "DEFAULT_MATCHERS",
    "GOLDEN_BACKENDS",
    "REL_TOL",
    "GoldenCase",
    "GoldenRecord",
    "add_parser",
    "compare",
    "first_divergence",
    "golden_extension",
    "load_golden_backend",
    "normalise_paths",
    "run",
    "run_case",
    "serialize",
    "strip_run_dependent",
    "strip_timings",
    "token_diff",
]
