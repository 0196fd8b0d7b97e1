"""Speculation on vs off on one loaded backend: the measurement behind
`mtpcheck bench` and the benchmark gates.

Repetitions are interleaved (off, on@1, ..., on@5, off, ...) so that drift of
a noisy machine hits every arm alike; figures are paired by repetition, then
medians (see `summarise`). The predicted
speedup follows Leviathan et al. (2023): expected tokens per round over the
cost of one round (k drafts plus one verification of k+1 positions), in
units of one plain decoding step, from the backend's own measured costs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mtpcheck.contracts import GenerationRequest, SamplingParams


@dataclass
class Arm:
    depth: int  # 0 = speculation off
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    accept_lens: list[int] = field(default_factory=list)
    draft_lens: list[int] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    def add(self, res, seconds: float) -> None:
        """Record one generation of this arm."""
        s = res.speculation
        self.seconds.append(seconds)
        self.tokens.append(len(res.tokens))
        self.accept_lens += s.accept_lens
        self.draft_lens += s.draft_lens
        self.draft_s.append(s.draft_time_s)
        self.verify_s.append(s.verify_time_s)
        self.rounds.append(s.rounds)

    def tokens_per_s(self) -> float:
        return statistics.median(t / s for t, s in zip(self.tokens, self.seconds, strict=True))

    def per_round(self) -> float:
        """Tokens emitted per round: accepted proposals plus the correction or bonus."""
        return 1.0 + self.mean_accepted()

    def mean_accepted(self) -> float:
        return sum(self.accept_lens) / max(len(self.accept_lens), 1)

    def acceptance_by_position(self) -> list[float]:
        """P(proposal j accepted | j drafted), j = 1..depth."""
        out = []
        for j in range(1, self.depth + 1):
            drafted = sum(1 for d in self.draft_lens if d >= j)
            out.append(sum(1 for a, d in zip(self.accept_lens, self.draft_lens, strict=True) if d >= j and a >= j) / max(drafted, 1))
        return out


class Sweep:
    """One loaded backend, one prompt: arms off and on at each depth, run one
    interleaved repetition at a time (off, on@1, ..., on@k) so that a noisy
    machine's drift hits every arm alike. `measure` is warmup + reps of these;
    the benchmarks time each repetition with pytest-benchmark."""

    def __init__(self, backend, prompt: list[int], depths=(1, 2, 3, 4, 5), max_tokens: int = 64,
                 sampling: SamplingParams | None = None):
        self.backend, self.prompt, self.max_tokens = backend, list(prompt), max_tokens
        self.sampling = sampling or SamplingParams(temperature=0.0)
        self.arms = {d: Arm(d) for d in (0, *depths)}

    def request(self, depth: int) -> GenerationRequest:
        spec = False if depth == 0 else {"mode": "native_mtp", "num_draft_tokens": depth}
        return GenerationRequest(prompt_tokens=self.prompt, max_tokens=self.max_tokens, sampling=self.sampling,
                                 speculation=spec, stop_token_ids=[])

    def rep(self, record: bool = True) -> None:
        """One repetition over every arm; `record=False` for warmup."""
        for d, arm in self.arms.items():
            req = self.request(d)
            t0 = time.perf_counter()
            res = self.backend.generate(req)
            dt = time.perf_counter() - t0
            # a backend behind HTTP times itself (the server's own timings, without transport or the
            # adapter's extra requests): `last_elapsed_s`, set by the generate call just made
            dt = getattr(self.backend, "last_elapsed_s", None) or dt
            if record:
                arm.add(res, dt)


def measure(backend, prompt: list[int], depths=(1, 2, 3, 4, 5), reps: int = 5, max_tokens: int = 64,
            sampling: SamplingParams | None = None, warmup: int = 1) -> dict[int, Arm]:
    sweep = Sweep(backend, prompt, depths, max_tokens, sampling)
    for rep in range(warmup + reps):
        sweep.rep(record=rep >= warmup)
    return sweep.arms


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(arms: dict[int, Arm]) -> list[dict]:
    """One row per depth: realised and predicted speedup, efficiency, acceptance.

    Repetition i of every arm ran back to back (interleaved), so figures are
    paired by repetition, then medians: realised speedup = median over i of
    tok/s(on, i) / tok/s(off, i); c and v = medians over i of that
    repetition's draft cost per proposal and verification cost per round, in
    units of its plain step 1 / tok/s(off, i); predicted = tokens per round /
    (d*c + v); efficiency = median over i of realised_i / predicted_i (the
    share of the speculative run's time that its draft and verify components
    account for; 1 - efficiency is the overhead). A load spike in one
    repetition moves none of them."""
    off = arms[0]
    off_tps = [t / s for t, s in zip(off.tokens, off.seconds, strict=True)]
    rows = []
    for d, arm in sorted(arms.items()):
        if d == 0:
            continue
        on_tps = [t / s for t, s in zip(arm.tokens, arm.seconds, strict=True)]
        per_round = arm.per_round()
        ratios, cs, vs, effs = [], [], [], []
        for i in range(min(len(on_tps), len(off_tps))):
            ratios.append(on_tps[i] / off_tps[i])
            if not arm.rounds[i]:
                continue
            t_plain = 1.0 / off_tps[i]  # seconds per plain token in this repetition
            c_i = arm.draft_s[i] / arm.rounds[i] / d / t_plain  # one draft token, in plain steps
            v_i = arm.verify_s[i] / arm.rounds[i] / t_plain  # one verification, in plain steps
            cs.append(c_i)
            vs.append(v_i)
            if d * c_i + v_i > 0:
                effs.append(ratios[-1] / (per_round / (d * c_i + v_i)))
        if not any(arm.draft_s) and not any(arm.verify_s):  # the backend reports no component timings
            cs, vs, effs = [], [], []
        c, v = _median(cs), _median(vs)
        predicted = per_round / (d * c + v) if math.isfinite(c + v) and (d * c + v) > 0 else float("nan")
        rows.append({
            "depth": d, "tokens_per_s": arm.tokens_per_s(), "off_tokens_per_s": off.tokens_per_s(),
            "speedup": _median(ratios), "predicted_speedup": predicted, "efficiency": _median(effs),
            "tokens_per_round": per_round, "mean_accepted": arm.mean_accepted(),
            "acceptance_by_position": arm.acceptance_by_position(), "draft_cost_c": c, "verify_cost_v": v,
        })
    return rows


# -- figures -------------------------------------------------------------------


def _finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def best_row(rows: list[dict]) -> dict:
    """The depth with the highest realised speedup."""
    return max(rows, key=lambda r: r["speedup"])


def figures(rows: list[dict]) -> dict:
    """The gated figures of one (backend, prompt kind) from `summarise` rows:
    realised speedup, predicted speedup and efficiency at the best depth, the
    median efficiency over depths, and the acceptance of the first proposal
    at the smallest depth measured (P(proposal 1 accepted) with one-token
    drafts when depth 1 is in the sweep)."""
    best = best_row(rows)
    first = min(rows, key=lambda r: r["depth"])
    effs = [r["efficiency"] for r in rows if _finite(r["efficiency"])]
    return {
        "best_depth": best["depth"],
        "speedup": best["speedup"],
        "predicted_speedup": best["predicted_speedup"],
        "efficiency": best["efficiency"],
        "median_efficiency": statistics.median(effs) if effs else float("nan"),
        "acceptance": first["acceptance_by_position"][0] if first["acceptance_by_position"] else float("nan"),
        "acceptance_depth": first["depth"],
        "tokens_per_round": best["tokens_per_round"],
        "off_tokens_per_s": best["off_tokens_per_s"],
    }


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def extra_info(rows: list[dict], arms: dict[int, Arm] | None = None) -> dict:
    """What the benchmarks store in pytest-benchmark's extra_info (JSON-safe:
    a figure the backend cannot give, such as the predicted speedup of a
    backend that reports no component timings, is null)."""
    info = {"figures": figures(rows), "rows": rows}
    if arms is not None:
        info["arms"] = {str(d): {"seconds": a.seconds, "tokens": a.tokens} for d, a in sorted(arms.items())}
    return _json_safe(info)


def _f(x, spec: str = ".2f") -> str:
    return format(x, spec) if _finite(x) else "n/a"


def format_table(rows: list[dict], title: str = "") -> list[str]:
    """One line per depth: on/off tok/s ratio, predicted, efficiency, tokens
    per round, c, v, acceptance by position."""
    lines = [title] if title else []
    if rows:
        lines.append(f"  speculation off: {rows[0]['off_tokens_per_s']:.1f} tok/s")
    lines.append(f"  {'depth':>5} {'tok/s':>7} {'on/off':>6} {'pred':>6} {'eff':>6} {'tok/rd':>6} "
                 f"{'c':>6} {'v':>6}  acceptance by position")
    for r in rows:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_by_position"])
        lines.append(f"  {r['depth']:>5} {r['tokens_per_s']:>7.1f} {r['speedup']:>6.2f} {_f(r['predicted_speedup']):>6} "
                     f"{_f(r['efficiency']):>6} {r['tokens_per_round']:>6.2f} {_f(r['draft_cost_c'], '.3f'):>6} "
                     f"{_f(r['verify_cost_v'], '.3f'):>6}  {acc}")
    return lines


# -- gates ---------------------------------------------------------------------

# the real adapters, by the names the gates file uses, while they are not built-in names
REAL_BACKENDS = {"mlx-lm": "mtpcheck.backends.mlx_lm:load_mlx_lm", "mlx-vlm": "mtpcheck.backends.mlx_vlm:load_mlx_vlm"}
GATES_PATH = Path(__file__).resolve().parent / "bench_gates.toml"
GATED = {"speedup": "speedup_floor", "efficiency": "efficiency_floor", "acceptance": "acceptance_floor"}


@dataclass
class GateResult:
    backend: str
    kind: str
    figure: str
    value: float | None
    floor: float
    run: str
    passed: bool | None  # None: the backend cannot give this figure (not gated)
    depth: int | None = None

    def line(self) -> str:
        where = f"{self.backend}/{self.kind}" + (f" depth {self.depth}" if self.depth else "")
        if self.passed is None:
            return f"gate {self.figure} not applied to {where}: the backend gives no such figure (run {self.run})"
        verdict = "passed" if self.passed else "FAILED"
        rel = ">=" if self.passed else "<"
        return f"gate {verdict}: {self.figure} {_f(self.value, '.3f')} {rel} floor {self.floor:g} for {where} (run {self.run})"


def load_gates(path: str | Path | None = None) -> dict:
    with open(path or GATES_PATH, "rb") as fh:
        return tomllib.load(fh)


def _floor(spec, kind: str) -> float | None:
    if isinstance(spec, dict):
        return spec.get(kind)
    return spec


def check_gates(backend: str, kind: str, rows: list[dict], gates: dict, run: str) -> list[GateResult]:
    """The floors of `gates[backend]` against the figures of one run. A
    backend without a section is not gated."""
    section = gates.get(backend) if isinstance(gates.get(backend), dict) else {}
    figs = figures(rows)
    out = []
    for figure, key in GATED.items():
        floor = _floor(section.get(key), kind)
        if floor is None:
            continue
        value = figs[figure]
        depth = figs["acceptance_depth"] if figure == "acceptance" else figs["best_depth"]
        passed = None if not _finite(value) else bool(value >= floor)
        out.append(GateResult(backend, kind, figure, value if _finite(value) else None, float(floor), run, passed, depth))
    return out


def check_regression(backend: str, kind: str, rows: list[dict], baseline: dict | None, gates: dict,
                     run: str) -> list[GateResult]:
    """The best-depth speedup against the baseline's (pytest-benchmark extra_info
    figures): it may drop by at most `speedup_drop` (a fraction)."""
    drop = (gates.get(backend) if isinstance(gates.get(backend), dict) else {}).get("speedup_drop")
    if drop is None or not baseline or not _finite(baseline.get("speedup")):
        return []
    floor = baseline["speedup"] * (1.0 - float(drop))
    value = figures(rows)["speedup"]
    return [GateResult(backend, kind, f"speedup vs baseline {baseline['speedup']:.3f} (-{float(drop):.0%})",
                       value, round(floor, 4), run, bool(value >= floor), figures(rows)["best_depth"])]


def baseline_figures(folder: str | Path) -> dict[str, dict]:
    """{benchmark name: extra_info figures} from the newest pytest-benchmark
    JSON under `folder` (searched recursively, by file name order)."""
    files = sorted(Path(folder).rglob("*.json"), key=lambda p: p.name)
    if not files:
        return {}
    data = json.loads(files[-1].read_text())
    return {b["name"]: (b.get("extra_info") or {}).get("figures") or {} for b in data.get("benchmarks", [])}


# -- plots and report ----------------------------------------------------------


def plot(backend: str, results: dict[str, list[dict]], out: str | Path) -> dict[str, str]:
    """PNG plots of one backend's runs (results: prompt kind -> rows):
    acceptance by position, speedup against depth (realised and predicted),
    predicted against realised. {} when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    kinds = list(results)

    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for r in results[kind]:
            acc = r["acceptance_by_position"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"depth {r['depth']}")
        ax.set(title=f"{backend} / {kind}", xlabel="proposal position", ylabel="P(accepted | drafted)", ylim=(0, 1.05))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
    paths["acceptance"] = _save(plt, fig, out / f"{backend}-acceptance.png")

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for kind in kinds:
        d = [r["depth"] for r in results[kind]]
        line = ax.plot(d, [r["speedup"] for r in results[kind]], marker="o", label=f"{kind} realised")[0]
        pred = [r["predicted_speedup"] if _finite(r["predicted_speedup"]) else float("nan") for r in results[kind]]
        ax.plot(d, pred, marker="x", linestyle="--", color=line.get_color(), label=f"{kind} predicted")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(title=f"{backend}: speedup against depth", xlabel="depth (proposals per round)", ylabel="on / off tok/s")
    ax.legend(fontsize=7)
    paths["speedup"] = _save(plt, fig, out / f"{backend}-speedup.png")

    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    pts = [(r["predicted_speedup"], r["speedup"], kind, r["depth"]) for kind in kinds for r in results[kind]
           if _finite(r["predicted_speedup"])]
    for kind in kinds:
        xs = [p for p, _, k, _ in pts if k == kind]
        ys = [q for _, q, k, _ in pts if k == kind]
        ax.scatter(xs, ys, label=kind)
    for p, q, _, d in pts:
        ax.annotate(str(d), (p, q), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if not pts:
        ax.text(0.5, 0.5, "no prediction:\nthe backend reports no\ndraft/verify timings", ha="center", va="center",
                transform=ax.transAxes)
    lo = min([0.5] + [min(p, q) for p, q, _, _ in pts]) * 0.95
    hi = max([1.5] + [max(p, q) for p, q, _, _ in pts]) * 1.05
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, label="realised = predicted")
    ax.plot([lo, hi], [0.85 * lo, 0.85 * hi], color="grey", linewidth=0.8, linestyle=":", label="85% of predicted")
    ax.set(title=f"{backend}: predicted vs realised", xlabel="predicted speedup", ylabel="realised speedup",
           xlim=(lo, hi), ylim=(lo, hi))
    ax.legend(fontsize=7, loc="upper left")
    paths["predicted_vs_realised"] = _save(plt, fig, out / f"{backend}-predicted-vs-realised.png")
    return paths


def _save(plt, fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def parse_depths(text: str) -> tuple[int, ...]:
    """"1-5" or "1,3,5" -> (1, 2, 3, 4, 5) / (1, 3, 5)."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a depth range such as 1-5 or 1,3,5") from None
        if a < 1 or b < a:
            raise argparse.ArgumentTypeError(f"{text!r}: depths are >= 1 and ranges ascend")
        out += range(a, b + 1)
    if not out:
        raise argparse.ArgumentTypeError("no depths given")
    return tuple(sorted(set(out)))


def bench_backend(name: str, backend, *, kinds=("structured", "prose"), depths=(1, 2, 3, 4, 5), reps: int = 5,
                  max_tokens: int = 64, sampling: SamplingParams | None = None, warmup: int = 1,
                  log=None) -> dict[str, dict]:
    """kind -> {"rows", "arms"} for one loaded backend, on PROMPTS[kind]."""
    from mtpcheck.fixture import PROMPTS

    out = {}
    for kind in kinds:
        prompt = list(backend.encode(PROMPTS[kind]))
        t0 = time.perf_counter()
        arms = measure(backend, prompt, depths=depths, reps=reps, max_tokens=max_tokens, sampling=sampling,
                       warmup=warmup)
        out[kind] = {"rows": summarise(arms), "arms": arms, "seconds": time.perf_counter() - t0}
        if log:
            log(f"{name}/{kind}: measured in {out[kind]['seconds']:.0f} s")
    return out


def run_bench(args) -> int:
    """`mtpcheck bench`: measure, print the tables, write plots and a JSON
    report, apply the gates (exit 1 when one fails)."""
    import datetime

    from mtpcheck.backends import UnknownBackendError, known_backends, load_backend, parse_options

    spec = args.backend
    if spec not in known_backends() and spec in REAL_BACKENDS:
        spec = REAL_BACKENDS[spec]
    try:
        backend = load_backend(spec, parse_options(args.backend_option))
    except (UnknownBackendError, ValueError, OSError) as exc:
        sys.stderr.write(f"mtpcheck: error: {exc}\n")
        return 2
    if not backend.capabilities().text or not hasattr(backend, "encode"):
        sys.stderr.write(f"mtpcheck: error: backend {args.backend!r} has no tokenizer for the fixture prompts\n")
        return 2
    try:
        gates = {} if args.no_gates else load_gates(args.gates)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        sys.stderr.write(f"mtpcheck: error: gates file: {exc}\n")
        return 2
    run_id = f"mtpcheck bench {args.backend} {datetime.datetime.now().strftime('%Y-%m-%dT%H:%M:%S')}"
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    sampling = SamplingParams(temperature=args.temperature, seed=0)
    print(f"mtpcheck bench: backend {args.backend}, depths {list(args.depths)}, {args.reps} reps (+1 warmup) "
          f"interleaved, {args.max_tokens} tokens, temperature {args.temperature}; medians")
    results = bench_backend(args.backend, backend, kinds=kinds, depths=args.depths, reps=args.reps,
                            max_tokens=args.max_tokens, sampling=sampling, log=print)
    gate_results: list[GateResult] = []
    report: dict = {"backend": args.backend, "run": run_id, "depths": list(args.depths), "reps": args.reps,
                    "max_tokens": args.max_tokens, "temperature": args.temperature, "kinds": {}}
    for kind, res in results.items():
        rows = res["rows"]
        for line in format_table(rows, f"{args.backend} / {kind}"):
            print(line)
        figs = figures(rows)
        print(f"  best depth {figs['best_depth']}: realised {figs['speedup']:.2f}, predicted "
              f"{_f(figs['predicted_speedup'])}, efficiency {_f(figs['efficiency'])} "
              f"(median over depths {_f(figs['median_efficiency'])})")
        gr = check_gates(args.backend, kind, rows, gates, run_id)
        gate_results += gr
        report["kinds"][kind] = extra_info(rows, res["arms"])
        report["kinds"][kind]["gates"] = [_json_safe(asdict(g)) for g in gr]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = plot(args.backend, {k: r["rows"] for k, r in results.items()}, out)
    report["plots"] = paths
    if not paths:
        print("plots: matplotlib is not installed (pip install matplotlib); JSON report only")
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in args.backend)
    json_path = out / f"bench-{safe}.json"
    json_path.write_text(json.dumps(report, indent=2))
    for p in paths.values():
        print(f"plot: {p}")
    print(f"report: {json_path}")
    for g in gate_results:
        print(g.line())
    return 1 if any(g.passed is False for g in gate_results) else 0


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `mtpcheck bench`."""
    p = subparsers.add_parser(
        "bench", help="speculation on vs off: speedup, predicted speedup, acceptance; plots and gates",
        description="Measure one loaded backend with speculation off and on at each depth, repetitions "
        "interleaved, medians; print the table, write PNG plots (matplotlib) and a JSON report, apply the "
        "floors of the gates file. Exit 1 when a gate fails.")
    p.add_argument("--backend", default="mlx")
    p.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--depths", type=parse_depths, default=(1, 2, 3, 4, 5), help="e.g. 1-5 or 1,3,5 (default 1-5)")
    p.add_argument("--reps", type=_at_least_one, default=5, help="interleaved repetitions after one warmup (default 5)")
    p.add_argument("--max-tokens", type=_at_least_one, default=64)
    p.add_argument("--kinds", default="structured,prose", help="fixture prompt kinds (default structured,prose)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--out", default="out/bench", help="folder for the plots and the JSON report")
    p.add_argument("--gates", default=None, help=f"gates file (default {GATES_PATH.name} in the package)")
    p.add_argument("--no-gates", action="store_true", help="measure and report only")
    p.set_defaults(func=run_bench)
    return p
