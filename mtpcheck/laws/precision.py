"""One precision rule for every exact check, from the declared logit dtype.

A correct runtime computes the target's logits twice - on the verify pass and
on plain decoding (or teacher-forced, for the ground truth) - along different
reduction orders, in the dtype it declares (`Capabilities.logit_dtype`). The
two results may differ by a few units in the last place (ulps) at the logits'
size, so an exact check cannot tell a decision that close to a boundary from a
float flip. This module says how close is "that close", once:

* `logit_gap` (nats): two logits this close may come out in either order -
  GREEDY-EQUIV, CTRL-CONTRACT, STOP-IN-BLOCK, CONSTRAINT greedy paths, the
  ground-truth check, concurrency and triage excuse a greedy flip inside it;
* `filter_margin` (relative): a token this close to surviving top-k, top-p or
  min-p (`stats.filter_margin`; 0 for a token tied with the boundary, the tie
  convention a runtime may choose) is a boundary token - DIST-ZERO and the
  G-tests list and count it rather than fail on it;
* `cdf` (absolute): a seeded inverse-CDF draw this close to an interval edge
  may land on the neighbour - SEED-SPEC-EQUALS-PLAIN, concurrency.

All three follow from `ULPS[dtype]` ulps of the dtype at `logit_scale`, the
declared bound of |logit| (the ground-truth check holds the runtime's own raw
logits to it). A float runtime never gets 0. Capabilities may still carry a
hand-picked tolerance for one of them; the report then says "declared".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# machine epsilon (spacing at 1.0) of each declarable logit dtype
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}

# How far apart two logits' paths may put them, in ulps at logit_scale. Half-precision
# runtimes round each logit once at the output (accumulating in float32): 2 ulps each,
# 4 for a gap between two. Float32 runtimes accumulate across layers in the dtype itself,
# and batched verification reorders those sums: measured verify-vs-plain rows 14 ulps apart.
ULPS = {"float64": 64, "float32": 64, "float16": 4, "bfloat16": 4}

DEFAULT_SCALE = 32.0  # |logit| below 32: most language models' logits, stated in the report


def spacing(dtype: str, bound: float) -> float:
    """The dtype's spacing in the largest binade below `bound`: the ulp of the
    largest |value| that stays under it (eps * 2^(ceil(log2 bound) - 1))."""
    return EPS[dtype] * 2.0 ** (math.ceil(math.log2(max(bound, 2.0**-30))) - 1)


@dataclass(frozen=True)
class Precision:
    dtype: str
    scale: float  # bound of |logit| where ulps are counted
    logit_gap: float  # nats
    filter_margin: float  # relative distance from surviving a filter
    cdf: float  # absolute distance from an inverse-CDF interval edge
    declared: tuple[str, ...] = field(default=())  # tolerances the capabilities set by hand

    @property
    def ulp(self) -> float:
        return spacing(self.dtype, self.scale)

    def ulps(self, gap: float) -> float:
        """A gap in nats, in ulps of the dtype at the logits' scale."""
        return gap / self.ulp

    def describe(self) -> str:
        rule = (f"{ULPS[self.dtype]} ulps of {self.dtype} at |logit| < {self.scale:g} "
                f"({self.ulp:.3g} nats each): logit gap {self.logit_gap:.3g} nats, filter margin "
                f"{self.filter_margin:.3g} relative, CDF {self.cdf:.3g}")
        return rule + (f"; declared by hand: {', '.join(self.declared)}" if self.declared else "")

    def evidence(self) -> dict:
        return {"logit_dtype": self.dtype, "logit_scale": self.scale, "ulps": ULPS[self.dtype], "ulp": self.ulp,
                "logit_gap": self.logit_gap, "filter_margin": self.filter_margin, "cdf": self.cdf,
                "declared": list(self.declared)}


def rule(dtype: str, scale: float = DEFAULT_SCALE) -> Precision:
    """The tolerances the dtype's rounding allows at |logit| < scale."""
    gap = ULPS[dtype] * spacing(dtype, scale)
    rel = math.expm1(gap)  # a probability ratio moves by at most e^gap
    return Precision(dtype=dtype, scale=scale, logit_gap=gap, filter_margin=rel, cdf=rel)


def precision(caps) -> Precision:
    """The rule for a backend's Capabilities, with any tolerance it declares by hand."""
    p = rule(caps.logit_dtype, caps.logit_scale)
    hand = {"logit_gap": caps.near_tie_logit_gap, "filter_margin": caps.filter_boundary_tolerance,
            "cdf": caps.seed_cdf_tolerance}
    hand = {k: v for k, v in hand.items() if v is not None}
    if not hand:
        return p
    names = {"logit_gap": "near_tie_logit_gap", "filter_margin": "filter_boundary_tolerance",
             "cdf": "seed_cdf_tolerance"}
    return Precision(dtype=p.dtype, scale=p.scale, **{k: hand.get(k, getattr(p, k)) for k in names},
                     declared=tuple(f"{names[k]}={v:g}" for k, v in hand.items()))
