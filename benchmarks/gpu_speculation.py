"""Speculation on a GPU, in absolute figures (run on a lent H200 through MLX's
CUDA backend; runs anywhere MLX runs, `--small` for a CPU smoke test).

What it measures, on one loaded random target in the memory-bound regime:
  t1     one plain decoding step (1 token)                      [ms]
  v_k    one verification of k+1 tokens, as a multiple of t1
  c      one MTP-head draft step, as a multiple of t1
  o      the reference engine's per-round host overhead (sampling laws in
         float64, uniforms, commit), as a multiple of t1
and end to end through the reference engine: plain tokens/s, speculative
tokens/s with the real (untrained, so ~0 acceptance) MTP head, and with an
oracle drafter of controlled acceptance a (it proposes the target's own
greedy continuation with probability a, at zero cost), against the speedup
the measured costs predict (Leviathan et al.): E[tokens/round] / (v_k + o).

Writes a JSON report to --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import time

os.environ.setdefault("MLX_DISABLE_COMPILE", "1")


def timed(fn, reps: int) -> float:
    """Median seconds of fn() (fn must evaluate its result)."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


class OracleDrafter:
    """Proposes the target's greedy continuation with probability `a` per
    position (a hash of the position decides), else a wrong token; q is
    one-hot (greedy drafting). Costs nothing: isolates verification cost."""

    kind = "assistant"  # external, stateless

    def __init__(self, reference: list[int], prompt_len: int, a: float, vocab: int):
        self.ref, self.P, self.a, self.V = reference, prompt_len, a, vocab
        self.length = 0

    def observe(self, start, hidden):
        pass

    def draft(self, history, target_len, k, sp, seed, cursor=None):
        import numpy as np

        from mtpcheck.engine.draft import DraftBlock

        block = DraftBlock.empty(target_len + 1, self.V)
        for s in range(k):
            pos = target_len + 1 + s
            i = pos - self.P
            right = self.ref[i] if 0 <= i < len(self.ref) else 0
            h = int.from_bytes(hashlib.blake2b(pos.to_bytes(8, "little"), digest_size=8).digest(), "little")
            tok = right if (h / 2**64) < self.a else (right + 1) % self.V
            q = np.zeros(self.V)
            q[tok] = 1.0  # one-hot (np.eye(V)[tok] would build a V x V matrix per proposal)
            block.append(tok, q, 0.0)
        return block

    def after_verify(self, before, after, hidden):
        pass

    def state(self):
        return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="tiny dims for a CPU smoke test")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="gpu_report.json")
    args = ap.parse_args(argv)

    import mlx.core as mx
    import numpy as np

    from mtpcheck.contracts import GenerationRequest, SamplingParams
    from mtpcheck.engine.decode import Engine
    from mtpcheck.engine.model import Model, ModelArgs
    from mtpcheck.engine.sampling import process

    dims = (dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, hidden_dim=128) if args.small else
            dict(vocab_size=32000, dim=2048, n_layers=16, n_heads=16, hidden_dim=5632))
    mx.random.seed(0)
    target = Model(ModelArgs(**dims, mtp_layers=1))
    target.set_dtype(mx.bfloat16)
    mx.eval(target.parameters())
    n_params = sum(v.size for _, v in __import__("mlx.utils", fromlist=["tree_flatten"]).tree_flatten(target.parameters()))
    report = {"device": str(mx.default_device()), "mlx": mx.__version__, "python": platform.python_version(),
              "model": dims, "params": int(n_params), "dtype": "bfloat16"}
    print(json.dumps(report), flush=True)

    def save():  # after every section: a run cut short by its time limit keeps what it measured
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)

    # -- component costs --------------------------------------------------------
    prompt = list(range(1, 33))
    cache = target.make_cache()
    _, logits = target(mx.array(prompt)[None], cache)
    mx.eval(logits)
    P = len(prompt)

    def step(k):
        def run():
            _, lg = target(mx.array([[5] * (k + 1)]), cache)
            mx.eval(lg)
            for c in cache:
                c.trim_to(P)
        return run

    t1 = timed(step(0), 20)
    v = {k: timed(step(k), 10) / t1 for k in range(1, 9)}
    mcache = target.make_mtp_cache()
    h = mx.zeros((1, 1, dims["dim"]), dtype=mx.bfloat16)

    def head():
        out, lg = target.mtp_forward(h, mx.array([[5]]), mcache)
        mx.eval(lg)
        for c in mcache:
            c.trim_to(0)

    c_head = timed(head, 20) / t1
    row = np.array(logits[0, -1].astype(mx.float32), dtype=np.float64)
    sp = SamplingParams(temperature=0.0)
    o_row = timed(lambda: process(row, sp, prompt), 50) / t1
    report["costs"] = {"t1_ms": t1 * 1e3, "verify_multiple_of_t1": v, "mtp_head_c": c_head,
                       "host_processing_per_row_multiple_of_t1": o_row}
    print(json.dumps(report["costs"]), flush=True)
    save()

    # -- end to end through the reference engine ----------------------------------
    # the assistant slot only has to be filled: the oracle replaces the drafter it would build
    engine = Engine(target, target, acceptance="rejection")
    req = lambda spec: GenerationRequest(prompt_tokens=prompt, max_tokens=args.tokens, sampling=sp,  # noqa: E731
                                         speculation=spec, stop_token_ids=[])
    plain = engine.generate(req(False))
    ref = plain.tokens

    def tps(spec, drafter=None):
        orig = engine.make_drafter
        if drafter is not None:
            engine.make_drafter = lambda plan: drafter() if plan.used else None
        try:
            runs, last = [], None
            for _ in range(args.reps + 1):
                t0 = time.perf_counter()
                last = engine.generate(req(spec))
                runs.append(len(last.tokens) / (time.perf_counter() - t0))
            return statistics.median(runs[1:]), last
        finally:
            engine.make_drafter = orig

    e2e = {"plain_tokens_per_s": tps(False)[0]}
    for k in (1, 3, 5):
        rate, res = tps({"drafter": "mtp", "num_draft_tokens": k})
        e2e[f"mtp_head_depth{k}"] = {"tokens_per_s": rate, "acceptance_rate": res.speculation.acceptance_rate,
                                     "same_tokens_as_plain": res.tokens == ref}
    for a in (0.6, 0.8, 0.95):
        for k in (1, 3, 5, 8):
            rate, res = tps({"drafter": "assistant", "num_draft_tokens": k},
                            lambda a=a, k=k: OracleDrafter(ref, P, a, dims["vocab_size"]))
            s = res.speculation
            per_round = 1 + s.accepted / max(s.rounds, 1)
            # one round costs a verification and k+1 processed rows; plain costs its measured step
            predicted = per_round / e2e["plain_tokens_per_s"] / ((v[k] + (k + 1) * o_row) * t1)
            realised = rate / e2e["plain_tokens_per_s"]
            assert s.used, s.message
            e2e[f"oracle_a{a}_depth{k}"] = {"tokens_per_s": rate, "speedup": realised, "predicted": predicted,
                                           "efficiency": realised / predicted, "tokens_per_round": per_round,
                                           "same_tokens_as_plain": res.tokens == ref}
            print(k, a, json.dumps(e2e[f"oracle_a{a}_depth{k}"]), flush=True)
            report["end_to_end"] = e2e
            save()

    # -- the shipped tiny fixture (overhead-bound anywhere: absolute figures) ---------
    from mtpcheck.backends.reference import load_reference
    from mtpcheck.fixture import PROMPTS
    from mtpcheck.measurement.bench import measure, summarise

    for drafter in ("mtp", "assistant"):
        backend = load_reference(drafter=drafter)
        fixture = {}
        for kind, text in PROMPTS.items():
            rows = summarise(measure(backend, backend.encode(text), depths=(1, 2, 3, 4, 5), reps=args.reps, max_tokens=64))
            fixture[kind] = rows
            for r in rows:
                print(drafter, kind, json.dumps({k: r[k] for k in ("depth", "tokens_per_s", "off_tokens_per_s", "speedup",
                                                                  "predicted_speedup", "efficiency", "tokens_per_round")}), flush=True)
        report[f"fixture_{drafter}"] = fixture
        save()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
