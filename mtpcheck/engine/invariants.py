"""White-box rollback check: after every round the caches must equal a fresh
prefill of the committed tokens (bug class B08)."""

from __future__ import annotations

import mlx.core as mx

from .cache import cache_length
from .draft import AssistantDrafter, MtpDrafter
from .state import Snapshot


def _compare(name: str, got: list, want: list, atol: float) -> list[str]:
    if len(got) != len(want):
        return [f"{name}: {len(got)} state arrays, fresh prefill has {len(want)}"]
    problems = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            problems.append(f"{name}[{i}]: shape {g.shape}, fresh prefill {w.shape}")
        elif (err := float(mx.abs(g - w).max())) > atol:
            problems.append(f"{name}[{i}]: differs from fresh prefill by {err:.3g} > {atol}")
    return problems


def cache_problems(engine, snap: Snapshot, atol: float = 1e-4) -> list[str]:
    """Empty when target and draft caches equal a fresh prefill of the
    committed tokens and the last emitted token is pending (uncached)."""
    problems = []
    n = cache_length(snap.target_cache)
    if n != len(snap.history) - 1:
        problems.append(f"target cache length {n}, expected {len(snap.history) - 1} (all but the pending token)")
        return problems
    fresh = engine.target.make_cache()
    hidden, _ = engine.target(mx.array(snap.history[:n])[None], fresh)
    problems += _compare("target", [a for c in snap.target_cache for a in c.contents()],
                         [a for c in fresh for a in c.contents()], atol)
    d = snap.drafter
    if d is None:
        return problems
    L = d.length
    if L > n:
        problems.append(f"draft cache length {L} exceeds the target's {n}: speculative entries remain")
        return problems
    if L == 0:
        return problems
    if isinstance(d, MtpDrafter):
        mtp_cache = engine.target.make_mtp_cache()
        engine.target.mtp_forward(hidden[:, :L], mx.array(snap.history[1 : L + 1])[None], mtp_cache)
        want = [a for c in mtp_cache for a in c.contents()]
    elif isinstance(d, AssistantDrafter):
        a_cache = d.model.make_cache()
        d.model(mx.array(snap.history[:L])[None], a_cache)
        want = [a for c in a_cache for a in c.contents()]
    else:  # pragma: no cover - a new drafter kind must add its check here
        raise TypeError(f"no rollback check for drafter {type(d).__name__}")
    problems += _compare(f"{d.kind} draft", d.state(), want, atol)
    return problems

