"""`mtpcheck mutants`: the conformance suite against every mutant of the zoo,
and the kill matrix (mutant x clause) written to docs/mutants.md.

One pytest subprocess per mutant (the plugin loads one backend per session),
run in parallel, each with `--mtp-json`; a mutant runs the clauses it
declares plus the clauses that could plausibly catch it (those whose
catalogue entry targets its bug class, and a few cheap sanity clauses), or
every clause with `--clauses all`. The matrix shows declared against actual.

A mutant is *killed* when every clause it declares fails; it *survives*
when no clause fails; it is *caught elsewhere* when only undeclared clauses
fail. Importing this module does not import mlx.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import MUTANTS, Mutant

WHITE_BOX = ("traces", "logprobs", "scheduler", "lookahead", "constraints")  # as mtpcheck.backends.blackbox (no mlx import)
HOOKS = ("traces", "scheduler", "lookahead", "constraints")  # what the server mask withholds

SANITY = ("REQ-BLOCK", "REPORT-HONEST", "STATS-CONSISTENT")  # cheap; a mutant should break only what it breaks
# the black-box column also runs these cheap output clauses on every mutant: its
# white-box declared clauses are withheld, so the output has to speak
BLACK_BOX_EXTRA = ("GREEDY-EQUIV", "SEED-DETERMINISM", "STOP-IN-BLOCK", "EVENTS-COMMIT-ONLY", "STREAM-COMMIT-ONLY")
# the server column adds what a server shows beyond its final tokens: requests in flight together, logprobs
SERVER_EXTRA = BLACK_BOX_EXTRA + ("CONCURRENT-EQUALS-SOLO", "LOGPROBS")
# suite clauses whose tests use no seed (temperature 0 throughout): the same result under every --mtp-seed
SEED_FREE = ("REQ-BLOCK", "REQ-OVERRIDE", "REPORT-HONEST", "REPORT-NO-SILENT-FALLBACK", "GREEDY-EQUIV", "STOP-IN-BLOCK")
KILLED = ("failed", "error")
# The samples of the distribution clauses cost ~10 s per sampling configuration on
# the toy backend (more under load). The zoo draws one of the four per mutant:
# temperature alone, unless the bug shows only under another one.
DIST_CONFIGS = ("temperature", "top_k", "top_p", "min_p", "topp_cool", "topp_hot", "topk_hot",
                "minp_cool")  # as mtpcheck.machinery.configs.DIST_CONFIGS (tests/test_mutants.py)
DIST_CONFIG = {
    "one-sided-temperature": "min_p",  # T = 1.2: the target left at T = 1 differs (T = 1 itself hides it)
    "target-filters-dropped": "top_k",  # filters: tokens outside the target's support
    "draft-sampler-unprocessed": "top_k",
    "residual-softmax": "top_k",
    "confident-draft-accepted": "top_k",
    "draft-law-unfiltered": "top_p",  # its strongest configuration on the fixture (docs/power.md, section D)
    "nucleus-before-temperature": "topp_cool",  # a nucleus cut before tempering: T = 1 hides it
}


def dist_select(config: str | None) -> str | None:
    """A pytest -k expression keeping one sampling configuration of the distribution clauses (None: all)."""
    if config is None:
        return None
    return " and ".join(f"not {c}" for c in DIST_CONFIGS if c != config)


DIST_SELECT = dist_select("temperature")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class MutantRun:
    name: str
    bug_class: str
    description: str
    declared: list[str]
    ran: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)  # clause -> worst outcome
    notes: dict[str, str] = field(default_factory=dict)  # clause -> first failure message
    duration_s: float = 0.0
    returncode: int | None = None
    error: str = ""
    black_box: bool = False  # run with the white-box capabilities withheld (mtpcheck.backends.blackbox)
    invisible: str = ""  # why output alone cannot show this bug (black-box column)
    server: bool = False  # with black_box: the server mask (only traces and hooks withheld)

    @property
    def black_box_verdict(self) -> str:
        """Black-box: killed by any clause (its declared ones may be withheld), else
        output-invisible when the zoo says why, else survived."""
        if self.error and not self.outcomes:
            return "no report"
        if self.killed_by:
            return "killed"
        return "output-invisible" if self.invisible else "survived"

    @property
    def killed_by(self) -> list[str]:
        return [c for c, o in self.outcomes.items() if o in KILLED]

    @property
    def missed(self) -> list[str]:
        """Declared clauses that did not catch it."""
        return [c for c in self.declared if self.outcomes.get(c) not in KILLED]

    @property
    def verdict(self) -> str:
        if self.error and not self.outcomes:
            return "no report"
        if not self.killed_by:
            return "survived"
        if not set(self.killed_by) & set(self.declared):
            return "caught elsewhere"
        return "killed" if not self.missed else "partly killed"


def catalogue_ids() -> list[str]:
    from mtpcheck.catalogue import load_catalogue

    return [c.id for c in load_catalogue().clause]


def plausible_clauses(m: Mutant, black_box: bool = False, server: bool = False) -> list[str]:
    """Declared clauses, clauses whose catalogue entry targets the bug class, sanity
    clauses (black-box: also BLACK_BOX_EXTRA; server: SERVER_EXTRA); only clauses of the catalogue."""
    from mtpcheck.catalogue import load_catalogue

    targeted = {c.id for c in load_catalogue().clause if m.bug_class in c.bug_classes}
    extra = SERVER_EXTRA if server else BLACK_BOX_EXTRA if black_box else ()
    wanted = set(m.clauses) | targeted | set(SANITY) | set(extra)
    return [c for c in catalogue_ids() if c in wanted]


def suite_command(backend_args: list[str], clauses: list[str] | None, json_path: Path, profile: str = "ci",
                  seed: int = 1234, select: str | None = None, timeout: float = 120.0, shrink: bool = True) -> list[str]:
    """The pytest command line of one suite run (--mtp-clauses only when clauses are given)."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "-q",
           "--no-header", "-rN", *([] if shrink else ["-p", "mtpcheck.mutants._noshrink"]), *backend_args, f"--mtp-profile={profile}", f"--mtp-seed={seed}",
           f"--mtp-timeout={timeout:g}", f"--mtp-json={json_path}"]
    if clauses:
        cmd.append(f"--mtp-clauses={','.join(clauses)}")
    if select:
        cmd += ["-k", select]
    return cmd


def suite_run(backend_args: list[str], clauses: list[str] | None, json_path: Path, profile: str = "ci",
              seed: int = 1234, select: str | None = None, timeout: float = 900.0,
              shrink: bool = True, call_timeout: float = 120.0) -> tuple[int | None, dict | None, str, float]:
    """Run the suite in a subprocess: (return code, JSON report or None, output tail, seconds).
    timeout: the whole run's; call_timeout: each backend call's (--mtp-timeout)."""
    json_path.unlink(missing_ok=True)
    env = {**os.environ, "MLX_DISABLE_COMPILE": "1"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(suite_command(backend_args, clauses, json_path, profile, seed, select, call_timeout,
                                            shrink=shrink),
                              cwd=json_path.parent, capture_output=True, text=True, timeout=timeout, env=env)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = None, f"timed out after {timeout:g} s: {str(exc.stdout or '')[-1000:]}"
    data = json.loads(json_path.read_text()) if json_path.exists() else None
    return code, data, tail, round(time.perf_counter() - t0, 1)


def backend_args(options: dict[str, str], backend: str = "toy") -> list[str]:
    return [f"--mtp-backend={backend}", *(f"--mtp-backend-option={k}={v}" for k, v in options.items())]


def mutant_backend_args(name: str, base: str = "toy", black_box: bool = False, server: bool = False) -> list[str]:
    mask = ["--mtp-backend-option=black_box=server"] if server else ["--mtp-backend-option=black_box=1"] if black_box else []
    return ["--mtp-backend=mtpcheck.mutants:load_mutant", f"--mtp-backend-option=name={name}",
            f"--mtp-backend-option=base={base}", *mask]


def run_mutant(m: Mutant, clauses: list[str], workdir: Path, profile: str = "ci", seed: int = 1234,
               base: str = "toy", select: str | None = DIST_SELECT, timeout: float = 900.0,
               black_box: bool = False, server: bool = False) -> MutantRun:
    """Run the suite against one mutant in a subprocess; read its JSON report.
    server: the server mask (black_box implied)."""
    black_box = black_box or server
    run = MutantRun(m.name, m.bug_class, m.description, list(m.clauses), list(clauses), black_box=black_box,
                    invisible="" if server and m.server_visible else m.invisible, server=server)
    json_path = workdir / f"{m.name}{'.server' if server else '.bb' if black_box else ''}.json"
    code, data, tail, run.duration_s = suite_run(mutant_backend_args(m.name, base, black_box, server), clauses, json_path,
                                                 profile, seed, select, timeout, shrink=False)
    run.returncode = code
    if data is None:
        run.error = tail
        return run
    for cid, row in data["clauses"].items():
        run.outcomes[cid] = row["outcome"]
        if row["notes"]:
            run.notes[cid] = row["notes"][0][:200]
    if code not in (0, 1):
        run.error = tail
    return run


def run_zoo(names: list[str], clause_mode: str = "plausible", jobs: int = 2, profile: str = "ci", seed: int = 1234,
            base: str = "toy", select: str | None = "per-mutant", workdir: Path | None = None,
            progress=None, black_box: bool = False, server: bool = False) -> list[MutantRun]:
    """Every named mutant against its clauses; `clause_mode` is declared | plausible | all.
    `select`: a pytest -k expression, None for everything, or "per-mutant": the
    distribution clauses on the mutant's sampling configuration (DIST_CONFIG)."""
    ids = catalogue_ids()

    def clauses_for(m: Mutant) -> list[str]:
        if clause_mode == "all":
            return ids
        if clause_mode == "declared":
            return list(m.clauses)
        return plausible_clauses(m, black_box or server, server)

    own = workdir is None
    tmp = tempfile.TemporaryDirectory(prefix="mtpcheck-mutants-") if own else None
    work = Path(tmp.name) if own else workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        def one(name: str) -> MutantRun:
            sel = dist_select(DIST_CONFIG.get(name, "temperature")) if select == "per-mutant" else select
            m = MUTANTS[name]
            r = run_mutant(m, clauses_for(m), work, m.profile or profile, seed, m.base or base, sel,
                           black_box=black_box, server=server)
            if progress:
                progress(r)
            return r

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            # longest first: mutants that run the distribution clauses
            order = sorted(names, key=lambda n: -sum(c.startswith(("DIST", "LOGPROBS", "SCHED")) for c in clauses_for(MUTANTS[n])))
            results = {r.name: r for r in pool.map(one, order)}
    finally:
        if tmp is not None:
            tmp.cleanup()
    return [results[n] for n in names]


# -- the kill matrix ------------------------------------------------------------------------

MARK = {"declared-killed": "**K**", "declared-missed": "**MISS**", "extra-killed": "k", "passed": ".",
        "skipped": "s", "not run": ""}


def cell(run: MutantRun, clause: str) -> str:
    o = run.outcomes.get(clause)
    declared = clause in run.declared
    if o is None:
        return MARK["declared-missed"] if declared else MARK["not run"]
    if o in KILLED:
        return (MARK["declared-killed"] if declared else MARK["extra-killed"]) + ("!" if o == "error" else "")
    if declared:
        return MARK["declared-missed"]
    return MARK["skipped"] if o == "skipped" else MARK["passed"]


def _masked_cells(run: MutantRun | None) -> str:
    """A masked column's two cells (killed by, verdict) for one mutant's row."""
    return f" {', '.join(run.killed_by) or '-'} | {run.black_box_verdict} |" if run else " | not run |"


def _unseen(runs: list[MutantRun], heading: str) -> list[str]:
    """A masked column's mutants it did not kill, with why (the zoo's reason, or what ran)."""
    unseen = [r for r in runs if r.black_box_verdict != "killed"]
    if not unseen:
        return []
    return ["", f"## {heading}", ""] + [
        f"- `{r.name}` ({r.black_box_verdict}): " + (r.invisible or
        f"ran {', '.join(c for c, o in r.outcomes.items() if o != 'skipped') or '-'}; none failed"
        + (f"; runner error: `{r.error[-300:].strip()}`" if r.error else "")) for r in unseen]


def render_markdown(runs: list[MutantRun], meta: dict, black: list[MutantRun] | None = None,
                    black_meta: dict | None = None, server: list[MutantRun] | None = None,
                    server_meta: dict | None = None) -> str:
    """The kill matrix; with `black` (runs with the white-box capabilities withheld) also the black-box column,
    with `server` (only traces and hooks withheld) the server column."""
    from mtpcheck.catalogue import load_catalogue

    clauses = load_catalogue().clause
    ran = [c for c in clauses if any(c.id in r.ran for r in runs)]
    abbrev = {c.id: f"C{i + 1}" for i, c in enumerate(ran)}
    verdicts = [r.verdict for r in runs]
    lines = [
        "# Mutant zoo: kill matrix",
        "",
        "<!-- Generated by `mtpcheck mutants` (mtpcheck/mutants/run.py); do not edit by hand. -->",
        "",
        "Generated by `mtpcheck mutants`; do not edit. Each mutant is the reference engine (toy models) with one",
        "bug of docs/bug-classes.md (B01-B17; mtpcheck/mutants/zoo.py), run against the conformance suite in its own pytest",
        f"process: profile `{meta['profile']}`, base seed {meta['seed']}, base backend `{meta['base']}`, "
        f"clauses: {meta['clause_mode']}"
        + (", the distribution clauses (DIST-*) on one of their sampling configurations per mutant: `temperature` "
           "unless the bug shows only under another (" + ", ".join(f"`{k}`: {v}" for k, v in DIST_CONFIG.items()) + ")"
           if meta.get("select") == "per-mutant" else "") + ".",
        *[f"`{m.name}` runs on base `{m.base or meta['base']}` at profile `{m.profile or meta['profile']}`: {m.needs}."
          for m in MUTANTS.values() if m.base or m.profile],
        "",
        f"**{verdicts.count('killed')} of {len(runs)} mutants killed by every clause they declare**; "
        f"{verdicts.count('partly killed')} partly killed, {verdicts.count('caught elsewhere')} caught only elsewhere, "
        f"{verdicts.count('survived')} survived, {verdicts.count('no report')} without a report. "
        f"Zoo wall time {meta['wall_s']:.0f} s with {meta['jobs']} parallel jobs on {meta['cpus']} CPUs "
        + (f"({meta['rerun']} since) " if meta.get("rerun") else "")
        + f"(sum of per-mutant times {sum(r.duration_s for r in runs):.0f} s).",
        "",
    ]
    bb = {r.name: r for r in black or []}
    if black:
        v = [r.black_box_verdict for r in black]
        lines += [
            f"**Black-box column** (`mtpcheck mutants --black-box`): the same mutants with the white-box capabilities "
            f"withheld ({', '.join(WHITE_BOX)}: what a runtime without hooks declares; mtpcheck/backends/blackbox.py), "
            f"so only output clauses speak; each runs its plausible clauses plus {', '.join(BLACK_BOX_EXTRA)}. "
            f"**{v.count('killed')} of {len(black)} killed black-box** (by any clause); "
            f"{v.count('output-invisible')} output-invisible (listed below with the reason), {v.count('survived')} "
            f"survived, {v.count('no report')} without a report. White-box: "
            f"{sum(bool(r.killed_by) for r in runs)} of {len(runs)} killed by some clause. Black-box wall time "
            f"{(black_meta or {}).get('wall_s', 0):.0f} s"
            + (f" ({black_meta['rerun']} since)" if (black_meta or {}).get("rerun") else "") + ".",
            "",
        ]
    sv = {r.name: r for r in server or []}
    if server:
        v = [r.black_box_verdict for r in server]
        lines += [
            f"**Server column** (`mtpcheck mutants --server`): the mask withholds only what a server cannot show "
            f"({', '.join(HOOKS)}) and keeps what it shows through its ordinary API: requests in flight together "
            f"(capability concurrent), logprobs, streams and a constraint in the request (request_constraints); "
            f"each runs its plausible clauses plus "
            f"{', '.join(SERVER_EXTRA)}. **{v.count('killed')} of {len(server)} killed by the server mask**; "
            f"{v.count('output-invisible')} invisible to a server (listed below), {v.count('survived')} survived, "
            f"{v.count('no report')} without a report. Server wall time {(server_meta or {}).get('wall_s', 0):.0f} s"
            + (f" ({server_meta['rerun']} since)" if (server_meta or {}).get("rerun") else "") + ".",
            "",
        ]
    lines += [
        "## Mutants",
        "",
        "| mutant | class | bug | declared | white-box: killed by (declared in bold) | verdict | s |"
        + (" black-box: killed by | black-box |" if black else "") + (" server: killed by | server |" if server else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if black else "") + ("---|---|" if server else ""),
    ]
    for r in runs:
        killed = ", ".join(f"**{c}**" if c in r.declared else c for c in r.killed_by) or "-"
        row = (f"| `{r.name}` | {r.bug_class} | {r.description} | {', '.join(r.declared)} | {killed} | "
               f"{r.verdict} | {r.duration_s:.0f} |")
        row += (_masked_cells(bb.get(r.name)) if black else "") + (_masked_cells(sv.get(r.name)) if server else "")
        lines.append(row)
    lines += ["", "## Clauses", "", "| clause | kind | mutants it kills (declared in bold) | ran against |", "|---|---|---|---|"]
    for c in ran:
        kills = [f"**{r.name}**" if c.id in r.declared else r.name for r in runs if r.outcomes.get(c.id) in KILLED]
        lines.append(f"| {c.id} | {c.kind} | {', '.join(kills) or '-'} | {sum(c.id in r.ran for r in runs)} |")
    never = [c.id for c in clauses if c not in ran]
    if never:
        lines += ["", f"Not run against any mutant: {', '.join(never)}."]
    lines += ["", "## Matrix", "",
              "`K` declared and failed (killed), `MISS` declared but passed, `k` failed though not declared, `.` ran and "
              "passed, `s` skipped, blank: not run; `!` the failure was an error in a fixture (the backend raised).", "",
              "| mutant | " + " | ".join(abbrev[c.id] for c in ran) + " |",
              "|---|" + "---|" * len(ran)]
    for r in runs:
        lines.append(f"| `{r.name}` | " + " | ".join(cell(r, c.id) for c in ran) + " |")
    lines += ["", "Columns: " + "; ".join(f"{abbrev[c.id]} {c.id}" for c in ran) + "."]
    problems = [r for r in runs if r.verdict != "killed"]
    if problems:
        lines += ["", "## Not killed as declared", ""]
        for r in problems:
            lines.append(f"- `{r.name}` ({r.verdict}): declared {r.declared}, missed {r.missed}, failed {r.killed_by}"
                         + (f"; runner error: `{r.error[-300:].strip()}`" if r.error else ""))
    lines += _unseen(black or [], "Not killed black-box") + _unseen(server or [], "Not killed by the server mask")
    notes = [(r.name, c, n) for r in runs for c, n in r.notes.items() if c in r.declared and r.outcomes.get(c) in KILLED]
    if notes:
        lines += ["", "## How each declared clause caught its mutant (first message)", ""]
        lines += [f"- `{name}` / {c}: {n.replace('|', '/')}" for name, c, n in notes]
    return "\n".join(lines) + "\n"


# -- the command --------------------------------------------------------------------------------


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("mutants", help="run the suite against the mutant zoo; write the kill matrix")
    p.add_argument("names", nargs="*", help="mutants to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and their declared clauses")
    p.add_argument("--clauses", choices=["declared", "plausible", "all"], default="plausible",
                   help="which clauses each mutant runs (default: plausible)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel pytest processes")
    p.add_argument("--profile", choices=["ci", "dev", "thorough"], default="ci")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--base", default="toy", help="backend the mutants are built on (default: toy)")
    p.add_argument("--all-configs", action="store_true", help="distribution clauses on all four sampling configurations")
    p.add_argument("--out", default=str(ROOT / "docs" / "mutants.md"), help="kill matrix (markdown); '-' for none")
    p.add_argument("--json", help="also write the runs as JSON")
    p.add_argument("--black-box", action="store_true",
                   help="the black-box column: every mutant with the white-box capabilities withheld; the other "
                        "column is read from --columns and the matrix shows both")
    p.add_argument("--server", action="store_true",
                   help="the server column: every mutant with only traces and hooks withheld (requests in flight "
                        "together, logprobs, streams and request constraints kept)")
    p.add_argument("--columns", default=str(ROOT / "docs" / "mutants.json"),
                   help="where both columns' runs are kept between runs (default docs/mutants.json); '-' for none")
    p.set_defaults(func=mutants_main)
    return p


def mutants_main(args) -> int:
    """Exit 0 when every mutant run is killed by every clause it declares."""
    if args.list:
        for m in MUTANTS.values():
            print(f"{m.name:36} {m.bug_class:4} {','.join(m.clauses):54} {m.description}")
        return 0
    unknown = [n for n in args.names if n not in MUTANTS]
    if unknown:
        sys.stderr.write(f"mtpcheck: error: unknown mutants {unknown}; see `mtpcheck mutants --list`\n")
        return 2
    names = args.names or list(MUTANTS)
    select = None if args.all_configs else "per-mutant"

    def progress(r: MutantRun) -> None:
        print(f"{r.name:36} {r.verdict:16} {r.duration_s:6.1f} s  killed by {','.join(r.killed_by) or '-'}", flush=True)

    t0 = time.perf_counter()
    runs = run_zoo(names, args.clauses, args.jobs, args.profile, args.seed, args.base, select, progress=progress,
                   black_box=args.black_box, server=args.server)
    meta = {"profile": args.profile, "seed": args.seed, "base": args.base, "clause_mode": args.clauses,
            "select": select, "jobs": args.jobs, "cpus": os.cpu_count(), "wall_s": time.perf_counter() - t0}
    elapsed = meta["wall_s"]  # this run's (a partial rerun's meta keeps the full run's)
    column = "server" if args.server else "black-box" if args.black_box else "white-box"
    columns = load_columns(args.columns)
    if args.columns != "-":  # keep this column for the next run of the other one
        old_runs, old_meta = columns.get(column, ([], {}))
        if args.names and old_meta.get("wall_s"):  # a partial rerun keeps the full run's wall time
            meta = {**old_meta, "rerun": f"{len(runs)} mutants rerun in {meta['wall_s']:.0f} s"}
        old = {r.name: r for r in old_runs}
        old.update({r.name: r for r in runs})
        columns[column] = ([old[n] for n in MUTANTS if n in old], meta)
        Path(args.columns).write_text(json.dumps({c: {"meta": m, "runs": [asdict(r) for r in rs]}
                                                  for c, (rs, m) in columns.items()}, indent=1) + "\n")
    else:
        columns[column] = (runs, meta)
    if args.out != "-" and "white-box" in columns:
        white, white_meta = columns["white-box"]
        black, black_meta = columns.get("black-box", (None, None))
        server, server_meta = columns.get("server", (None, None))
        Path(args.out).write_text(render_markdown(white, white_meta, black, black_meta, server, server_meta))
        print(f"wrote {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "runs": [asdict(r) | {"verdict": r.verdict} for r in runs]},
                                              indent=2) + "\n")
    if args.black_box or args.server:
        bad = [r.name for r in runs if r.black_box_verdict not in ("killed", "output-invisible")]
        print(f"{sum(r.black_box_verdict == 'killed' for r in runs)} of {len(runs)} mutants killed {column}, "
              f"{sum(r.black_box_verdict == 'output-invisible' for r in runs)} output-invisible, in "
              f"{elapsed:.0f} s" + (f"; not: {', '.join(bad)}" if bad else ""))
        return 1 if bad else 0
    bad = [r.name for r in runs if r.verdict != "killed"]
    print(f"{len(runs) - len(bad)} of {len(runs)} mutants killed as declared in {elapsed:.0f} s"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def load_columns(path: str) -> dict[str, tuple[list[MutantRun], dict]]:
    """The kept columns ('white-box', 'black-box', 'server') of docs/mutants.json; {} when absent."""
    if path == "-" or not Path(path).is_file():
        return {}
    data = json.loads(Path(path).read_text())
    return {c: ([MutantRun(**r) for r in v["runs"]], v["meta"]) for c, v in data.items()}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
    parser = argparse.ArgumentParser(prog="mtpcheck")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["mutants", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
