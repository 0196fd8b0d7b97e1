"""Evidence that speculation was exercised.

A clause that judges speculation judges nothing when its own sample holds
no accepted proposal: lossless output from a runtime whose drafter is dead
is the plain path's output. The harness tallies, per suite test, what the
reports of the results it received say was drafted, accepted and rejected;
the plugin turns a pass on an unexercised sample into a named failure
(docs/report.md, "Exercise").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtpcheck.contracts import (
    SEED_LIMIT,
    Capabilities,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)


def unobserved(res: GenerationResult, caps: Capabilities) -> bool:
    """Speculation reported used with no round statistics at all: a runtime
    that counts per response, not per sample (vLLM's n samples). Such a
    result's statistics are not judged (the result rules judge only its
    finish); the tally counts it unobserved. A one-token result ended at the
    prefill's token has no round to observe; where round 0 emits the first
    token (first_token_from_prefill False, as mlx-lm) it has one."""
    s = res.speculation
    first_round_token = 2 if caps.first_token_from_prefill else 1
    return bool(s.used and not s.rounds and not s.drafted and len(res.tokens) >= first_round_token)


# the moved base seed of a redraw: it changes the low 32 bits, which a runtime that truncates seeds keeps
REDRAW_STEP = 0x9E3779B9


def redraw_seed(seed: int) -> int:
    """The base seed at which a seeded test that passed on a sample holding
    nothing of what it needs is drawn once more (the plugin's redraw)."""
    return (seed + REDRAW_STEP) % SEED_LIMIT


class NotExercised(Exception):
    """A passing test whose sample did not exercise what its clause judges: a
    verdict of its own: only an xfails line pinned `exercise=none` documents it."""


def controls_of(sp: SamplingParams) -> list[str]:
    """The non-neutral controls of a request, by the names Capabilities uses."""
    out = ["temperature"]
    out += ["top_k"] if sp.top_k is not None else []
    out += ["top_p"] if sp.top_p is not None and sp.top_p < 1.0 else []
    out += ["min_p"] if sp.min_p else []
    out += ["repetition_penalty"] if sp.repetition_penalty not in (None, 1.0) else []
    out += ["presence_penalty"] if sp.presence_penalty else []
    out += ["frequency_penalty"] if sp.frequency_penalty else []
    out += ["logit_bias"] if sp.logit_bias else []
    out += ["seed"] if sp.seed is not None and sp.temperature > 0 else []
    return out


def asks_speculation(req: GenerationRequest, res: GenerationResult) -> bool:
    """The request asked for speculation: a block with a mode other than off,
    or no block and a loaded default that speculates (the report says requested)."""
    if req.speculation is None:
        return res.speculation.requested
    return req.speculation.mode != "off"


@dataclass
class Tally:
    """Reports of the results of speculative requests, summed."""

    requests: int = 0  # results of requests that asked for speculation
    unaccelerated: int = 0  # of those, served unaccelerated as declared (a control outside speculative_sampling_controls)
    used: int = 0  # reports that say used
    unobserved: int = 0  # of those, with no round statistics at all (a runtime that counts per response, not per sample)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    bonus_tokens: int = 0
    corrections: int = 0
    declared_off: list[str] = field(default_factory=list)  # the controls that made requests unaccelerated
    _seen: dict = field(default_factory=dict, repr=False)  # id -> result, held so that an id is never reused

    @property
    def rejected(self) -> int:
        return max(self.drafted - self.accepted, 0)

    def add(self, req: GenerationRequest, res: GenerationResult, caps: Capabilities) -> None:
        if id(res) in self._seen or not asks_speculation(req, res):
            return
        self._seen[id(res)] = res
        self.requests += 1
        s = res.speculation
        off = [c for c in controls_of(req.sampling) if c not in caps.speculative_sampling_controls]
        if off and not s.used:  # served unaccelerated as declared: judges nothing of speculation, owes nothing
            self.unaccelerated += 1
            self.declared_off += [c for c in off if c not in self.declared_off]
            return
        self.used += int(s.used)
        self.unobserved += int(unobserved(res, caps))
        self.rounds += s.rounds
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.bonus_tokens += s.bonus_tokens
        self.corrections += s.corrections

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if not k.startswith("_")}
        out["declared_off"] = list(self.declared_off)
        return out | {"rejected": self.rejected}


def verdict(t: dict, needs: list[str]) -> tuple[str, str] | None:
    """('fail' | 'skip', message) when a passing test's sample (Tally.as_dict())
    did not exercise what its clause needs; None when it did, or when it made no
    speculative request."""
    if not needs or not t["requests"]:
        return None
    judged = t["requests"] - t["unaccelerated"]
    if not judged:
        return ("skip", f"speculation not exercised: the backend declares {', '.join(t['declared_off'])} unaccelerated "
                        f"(speculative_sampling_controls) for all {t['requests']} speculative requests")
    if t.get("unobserved") and t["unobserved"] == judged:
        return ("skip", f"speculation not observed: all {judged} speculative results report used with no round "
                        "statistics (the backend does not count per result here): nothing shows what was accepted")
    where = f"over {judged} speculative requests ({t['used']} reported used, {t['rounds']} rounds)"
    if "accepted" in needs and not t["accepted"]:
        return ("fail", f"speculation not exercised: 0 of {t['drafted']} proposals accepted {where}")
    if "rejected" in needs and not t["rejected"]:
        return ("fail", f"rejection not exercised: 0 of {t['drafted']} proposals rejected {where}")
    return None


def margin_of(t: dict, needs: list[str]) -> dict | None:
    """The smallest count among what an exercised sample needs (accepted,
    rejected): {"count", "what", "drafted"}; None where verdict() has nothing
    to pass (no need, no speculative request) or does not pass it."""
    if not needs or not t["requests"] or verdict(t, needs) is not None:
        return None
    count, what = min((t[w], w) for w in needs if w in ("accepted", "rejected"))
    return {"count": count, "what": what, "drafted": t["drafted"]}


def summary(t: dict | None) -> str:
    """A table cell: proposals accepted of drafted, rejected, speculative requests judged."""
    if not t or not t.get("requests"):
        return ""
    judged = t["requests"] - t["unaccelerated"]
    if not judged:
        return f"unaccelerated ({t['unaccelerated']} req)"
    return f"acc {t['accepted']}/{t['drafted']}, rej {t['rejected']}, {judged} req"


def merge(tallies: list[dict]) -> dict | None:
    """The clause's tally from its tests' tallies."""
    tallies = [t for t in tallies if t]
    if not tallies:
        return None
    out = {k: sum(t.get(k, 0) for t in tallies) for k in
           ("requests", "unaccelerated", "used", "unobserved", "rounds", "drafted", "accepted", "bonus_tokens",
            "corrections", "rejected")}
    out["declared_off"] = sorted({c for t in tallies for c in t.get("declared_off", [])})
    return out
