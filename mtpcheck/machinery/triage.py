"""Divergence triage: is a greedy speculative/plain difference a near-tie of
the logits or a bug? (`mtpcheck explain-divergence`; the CLI is a thin shell.)

One loaded backend decodes the prompt greedily twice, speculation off and on.
At the first divergent position the target law along the *plain* path (the
prefix both runs share, teacher-forced through `target_distributions` at
temperature 1) gives the logit gaps: log(p_i / p_j) is z_i - z_j whatever the
rest of the vocabulary holds. The verdict compares the gap between the two
tokens that were actually emitted with the precision rule's logit gap
(laws.precision, GREEDY-EQUIV's tolerance): inside it a float flip,
`near-tie`; beyond it `structural`, a bug to look for.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from mtpcheck.contracts import Capabilities, GenerationRequest, SamplingParams
from mtpcheck.laws.precision import precision, spacing
from mtpcheck.machinery.checks import first_divergence, top2_logit_gap


def ulps(gap: float, dtype: str, magnitude: float) -> float:
    """`gap` in units of the dtype's spacing below |logit| = magnitude
    (laws.precision.spacing); the law fixes logit differences only, so the
    magnitude (the backend's logit_scale unless given) is stated in the report."""
    return gap / spacing(dtype, magnitude)


class Candidate(BaseModel):
    token: int
    probability: float = Field(..., description="temperature-1 target law on the plain path")
    logit_gap_from_top: float = Field(..., description="z_top - z_token in nats, log(p_top / p_token)")


class DivergenceReport(BaseModel):
    backend: str
    prompt_tokens: int = Field(..., description="prompt length in tokens")
    max_tokens: int
    num_draft_tokens: int | None
    speculation_used: bool
    speculation_reason: str | None = None
    plain_tokens: list[int]
    spec_tokens: list[int]
    position: int | None = Field(None, description="first divergent output index; None: identical")
    plain_token: int | None = None
    spec_token: int | None = None
    law_source: Literal["target_distributions", "logprobs"] | None = None
    top5: list[Candidate] = Field(default_factory=list)
    top2_logit_gap: float | None = Field(None, description="nats between the two largest logits")
    pair_logit_gap: float | None = Field(None, description="nats between the plain and the speculative token")
    logit_dtype: str
    logit_magnitude: float = Field(..., description="|logit| at which ulps are counted")
    top2_gap_ulps: float | None = None
    pair_gap_ulps: float | None = None
    near_tie_logit_gap: float = Field(..., description="the precision rule's logit gap (laws.precision), nats")
    precision: str = ""
    verdict: Literal["no-divergence", "near-tie", "structural", "undetermined"]
    evidence: str

    def lines(self) -> list[str]:
        """For people: the verdict first, then what decides it."""
        out = [f"verdict: {self.verdict}: {self.evidence}"]
        if self.position is None:
            return out + [f"plain and speculative ({'used' if self.speculation_used else 'not used'}) "
                          f"greedy outputs agree on {len(self.plain_tokens)} tokens"]
        out.append(f"first divergence at output position {self.position}: plain token {self.plain_token}, "
                   f"speculative token {self.spec_token}")
        out.append(f"plain       {self.plain_tokens[self.position:self.position + 6]}")
        out.append(f"speculative {self.spec_tokens[self.position:self.position + 6]}")
        if self.top5:
            out.append(f"target top-5 on the plain path ({self.law_source}):")
            for c in self.top5:
                mark = " <- plain" if c.token == self.plain_token else " <- speculative" if c.token == self.spec_token else ""
                out.append(f"  token {c.token:>7}  p={c.probability:.6g}  gap {c.logit_gap_from_top:.6g} nats{mark}")
        if self.pair_logit_gap is not None:
            out.append(f"gap plain-vs-speculative: {self.pair_logit_gap:.6g} nats = {_fmt(self.pair_gap_ulps)} ulps of "
                       f"{self.logit_dtype} at |logit| {self.logit_magnitude:g}; top-2 gap {_fmt(self.top2_logit_gap)} nats "
                       f"= {_fmt(self.top2_gap_ulps)} ulps; precision rule: {self.precision}")
        return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def explain_divergence(backend, prompt: list[int], num_draft_tokens: int | None = None, max_tokens: int = 64,
                       logit_magnitude: float | None = None, name: str = "backend") -> DivergenceReport:
    """Greedy plain vs speculative on one loaded backend, and the verdict."""
    caps: Capabilities = backend.capabilities()
    rule = precision(caps)
    logit_magnitude = caps.logit_scale if logit_magnitude is None else logit_magnitude
    greedy = SamplingParams(temperature=0.0)
    spec = {"mode": "native_mtp", **({"num_draft_tokens": num_draft_tokens} if num_draft_tokens else {})}

    def run(block):
        req = GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, sampling=greedy, speculation=block,
                                stop_token_ids=[])  # the whole budget: a stop must not hide a later divergence
        return backend.generate(req)

    plain, sped = run(False), run(spec)
    s = sped.speculation
    base = dict(backend=name, prompt_tokens=len(prompt), max_tokens=max_tokens, num_draft_tokens=s.num_draft_tokens or None,
                speculation_used=s.used, speculation_reason=s.reason, plain_tokens=plain.tokens,
                spec_tokens=sped.tokens, logit_dtype=caps.logit_dtype, logit_magnitude=logit_magnitude,
                near_tie_logit_gap=rule.logit_gap, precision=rule.describe())
    j = first_divergence(sped.tokens, plain.tokens)
    if j is None:
        note = "" if s.used else f" (speculation was not used: {s.reason}; nothing was compared)"
        return DivergenceReport(**base, verdict="no-divergence", evidence=f"outputs are identical{note}")
    if j >= min(len(plain.tokens), len(sped.tokens)):
        return DivergenceReport(**base, position=j, verdict="structural",
                                evidence=f"one output stops at {j} tokens, the other goes on: a length is no near-tie")
    a, b = plain.tokens[j], sped.tokens[j]
    base.update(position=j, plain_token=a, spec_token=b)
    tol = rule.logit_gap
    if caps.target_distributions:
        law = np.asarray(backend.target_distributions(prompt, plain.tokens[: j + 1], SamplingParams(temperature=1.0))[j],
                         dtype=np.float64)
        order = np.argsort(-law, kind="stable")[:5]
        top = float(law[order[0]])
        top5 = [Candidate(token=int(t), probability=float(law[t]),
                          logit_gap_from_top=math.inf if law[t] <= 0 else float(math.log(top / law[t])))
                for t in order]
        pair = math.inf if law[b] <= 0 or law[a] <= 0 else float(math.log(law[a] / law[b]))
        base.update(law_source="target_distributions", top5=top5, top2_logit_gap=top2_logit_gap(law))
    elif caps.logprobs and plain.logprobs and sped.logprobs:
        # both runs share the prefix, so each reports log p of its own token under the same law
        la, lb = plain.logprobs[j], sped.logprobs[j]
        if not (math.isfinite(la) and math.isfinite(lb)) or la == 0.0:
            return DivergenceReport(**base, law_source="logprobs", verdict="undetermined",
                                    evidence="the reported logprobs are those of the greedy (one-hot) law: they hold no gap; "
                                             "declare target_distributions to triage")
        pair = la - lb
        base.update(law_source="logprobs")
    else:
        return DivergenceReport(**base, verdict="undetermined",
                                evidence="the backend declares neither target_distributions nor logprobs: "
                                         "the target law at the divergence is unknown")
    gaps = dict(pair_logit_gap=pair, pair_gap_ulps=ulps(pair, caps.logit_dtype, logit_magnitude) if math.isfinite(pair) else None,
                top2_gap_ulps=None if base.get("top2_logit_gap") in (None, math.inf)
                else ulps(base["top2_logit_gap"], caps.logit_dtype, logit_magnitude))
    if pair < 0:
        verdict, why = "structural", (f"the speculative token {b} has the higher logit ({-pair:.3g} nats): "
                                      f"the plain run did not take the argmax")
    elif pair < tol:
        verdict, why = "near-tie", (f"the logits of tokens {a} and {b} are {pair:.3g} nats apart, inside the precision "
                                    f"rule's logit gap {tol:.3g} ({rule.describe()}): a float flip")
    else:
        verdict, why = "structural", (f"the logits of tokens {a} and {b} are {pair:.3g} nats apart, beyond the precision "
                                      f"rule's logit gap {tol:.3g} ({rule.describe()}): no rounding explains it")
    return DivergenceReport(**base, **gaps, verdict=verdict, evidence=why)
