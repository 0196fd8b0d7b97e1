"""Deliberately broken backends: the reference engine with one bug each, put
where a runtime would have it (BUG-CLASSES.md). The suite must fail each on
the clauses it declares; `mtpcheck.mutants:load_mutant` is a backend factory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Mutant:
    name: str
    bug_class: str
    description: str
    clauses: tuple[str, ...]  # clauses expected to catch it
    apply: Callable  # engine -> None, mutating it in place


# -- the bugs ----------------------------------------------------------------


def _one_sided_temperature(engine) -> None:
    """B02: verification reads the target's logits at temperature 1 while the
    draft (and the prefill token) use the requested temperature."""
    from mtpcheck.contracts import SamplingParams

    verify = engine._verify

    def at_temperature_one(x):
        return x.model_copy(update={"temperature": 1.0}) if isinstance(x, SamplingParams) and x.temperature else x

    def unprocessed_target(*args, **kwargs):
        return verify(*map(at_temperature_one, args), **{k: at_temperature_one(v) for k, v in kwargs.items()})

    engine._verify = unprocessed_target


def _unnormalised_residual(engine) -> None:
    """B04: on rejection the residual (p - q)+ is sampled without normalising
    it; the mass it lacks falls through to the target's mode."""
    from mtpcheck.engine.acceptance import (
        Rule,
        Verdict,
        rejection_accept_probability,
        verify_rejection,
    )

    def raw_residual(p, q, d):
        return np.maximum(p - q, 0.0)

    def verify(ps, qs, proposals, au, tu):
        v = verify_rejection(ps, qs, proposals, au, tu)
        if v.next_kind != "correction":
            return v
        j = v.accepted
        r = raw_residual(ps[j], qs[j], proposals[j])
        i = int(np.searchsorted(np.cumsum(r), tu[j], side="right"))
        tok = i if i < len(r) and r[i] > 0 else int(np.argmax(ps[j]))
        return Verdict(j, tok, "correction", r)

    engine.rule = Rule("rejection", rejection_accept_probability, raw_residual, verify)


def _recurrent_state_not_restored(engine) -> None:
    """B08: after a rejection the KV caches are trimmed but the gated linear-
    attention state is not restored from its checkpoint: the rejected
    proposals stay folded into the recurrent state."""
    from mtpcheck.engine.cache import KVCache, RecurrentCache

    class StaleState(RecurrentCache):
        def trim_to(self, length):
            state = self.state
            super().trim_to(length)
            self.state = state

    kinds = engine.target.args.kinds()
    engine.target.make_cache = lambda: [KVCache() if k == "attn" else StaleState() for k in kinds]


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        Mutant("one-sided-temperature", "B02", "target law left at temperature 1 in verification",
               ("DIST-EQUIV", "TRACE-ACCEPT"), _one_sided_temperature),
        Mutant("unnormalised-residual", "B04", "residual (p-q)+ sampled unnormalised, leftover to the mode",
               ("TRACE-RESIDUAL-BONUS",), _unnormalised_residual),
        Mutant("recurrent-state-not-restored", "B08", "recurrent state keeps the rejected suffix",
               ("GREEDY-EQUIV", "TRACE-ACCEPT"), _recurrent_state_not_restored),
    ]
}


def load_mutant(name: str, base: str = "toy", **options: str):
    """Backend factory: `--mtp-backend=mtpcheck.mutants:load_mutant
    --mtp-backend-option name=NAME [--mtp-backend-option base=mlx]`."""
    from mtpcheck.backends import load_backend

    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    backend = load_backend(base, options)
    MUTANTS[name].apply(backend.engine)
    backend.engine.name = f"mutant:{name}"
    return backend
