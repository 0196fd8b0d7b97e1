"""STREAM-DISCONNECT: a client that goes away mid-stream (the stream's
generator closed; over HTTP the connection dropped) leaves the runtime
serving, and the requests after it as they would have been.

Black-box. The probe request R is served after another request A (same
prompt, another seed, a longer budget), so every run of R follows the same
history except for how A ended:

    stream A to the end; R -> c1
    stream A to the end; R -> c1'     (before any disconnect of this probe)
    stream A, abandon it after `after` chunks; R -> d
    stream A to the end; R -> c2

c1 != c1' means R has no one output after A (SEED-HISTORY / SEED-DETERMINISM
name that): the probe is unsteady, and a runtime with any unsteady probe does
not repeat itself, so no difference is laid at the disconnect's door (the
clause skips, naming both). Else d must equal c1 - tokens (a divergence
triaged as CONCURRENT-EQUALS-SOLO's: the abandoned request may still be in
flight beside R, which changes kernel shapes), finish reason and, where the
tokens agree, the rounds - and c2 must equal c1 (a change that outlasts the
request after the disconnect). d's statistics must be consistent on their own
(STATS-CONSISTENT's checks), and the chunks A sent before it was abandoned a
prefix of A's complete stream: both judged whatever the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtpcheck.contracts import Capabilities, GenerationRequest, SamplingParams

from .checks import first_divergence, stats_problems
from .concurrency import divergence
from .configs import request, spec_for

ABANDON_AFTER = 2  # chunks read before the client goes away (the first may hold the prefill token alone)
OTHER_SEED = 104729  # A's seed offset from R's


def disconnect_probes(caps: Capabilities, prompts: list[list[int]], base_seed: int, kind: str,
                      tokens: int = 24) -> list[tuple[GenerationRequest, GenerationRequest]]:
    """(R, A) pairs: R greedy or seeded at T = 1 (kind), depths 1..3; A the
    request abandoned before R: R's prompt (a prefix cache may hold it), a
    seeded sample at T = 1, twice R's budget, no stop (it runs until abandoned)."""
    depths = caps.depths or list(range(1, caps.max_depth + 1)) or [1]
    out = []
    for i, prompt in enumerate(prompts):
        seed = base_seed + 31 * i
        spec = spec_for(caps, depths[i % len(depths)])
        sp = SamplingParams(temperature=0.0) if kind == "greedy" else SamplingParams(temperature=1.0, seed=seed)
        probe = request(prompt, tokens, sp, spec, stop_token_ids=[])
        other = request(prompt, 2 * tokens, SamplingParams(temperature=1.0, seed=seed + OTHER_SEED), spec,
                        stop_token_ids=[])
        out.append((probe, other))
    return out


@dataclass
class Probe:
    seed: int | None
    abandoned: bool = False  # A's stream was still open when the client went away
    unsteady: bool = False  # c1 != c1': no one output to hold R to
    problems: list[str] = field(default_factory=list)  # failures on their own (statistics, the abandoned prefix)
    changed: list[str] = field(default_factory=list)  # d differs from c1: the disconnect's, if the runtime repeats
    evidence: dict = field(default_factory=dict)


def run_probe(backend, caps: Capabilities, probe: GenerationRequest, other: GenerationRequest,
              after: int = ABANDON_AFTER) -> Probe:
    """One probe (module docstring) on a Guarded backend."""
    full1 = backend.generate_stream(other)
    c1 = backend.generate(probe)
    backend.generate_stream(other)
    again = backend.generate(probe)
    partial, ended = backend.abandon_stream(other, after)
    d = backend.generate(probe)
    full2 = backend.generate_stream(other)
    c2 = backend.generate(probe)
    out = Probe(seed=probe.sampling.seed, abandoned=not ended)
    if not out.abandoned:
        return out
    tag = f"seed {probe.sampling.seed}, T={probe.sampling.temperature}"
    whole = [t for c in full2 for t in c.tokens]
    sent = [t for c in partial for t in c.tokens]
    if [t for c in full1 for t in c.tokens] == whole and sent != whole[: len(sent)]:
        j = first_divergence(sent, whole)
        out.problems.append(f"{tag}: the abandoned stream's {len(sent)} tokens are not a prefix of the same "
                            f"request's complete stream (position {j}: {sent[j:j + 3]} vs {whole[j:j + 3]})")
    if c1.tokens != again.tokens or c1.finish_reason != again.finish_reason:
        out.unsteady = True
        return out
    if (c2.tokens, c2.finish_reason) != (c1.tokens, c1.finish_reason):
        j = first_divergence(c2.tokens, c1.tokens)
        out.changed.append(f"{tag}: the change outlasted the request after the disconnect: after the next complete "
                           f"stream, position {j}: {c2.tokens[j:j + 3]} vs {c1.tokens[j:j + 3]} before the disconnect"
                           if j is not None else f"{tag}: finish reason {c2.finish_reason!r} after the next complete "
                                                 f"stream, {c1.finish_reason!r} before the disconnect")
    found = divergence(backend, caps, probe, c1, d)
    if found is not None:
        out.evidence = found
        if not found["excused"]:
            out.changed.append(f"{tag}: after a client went away, position {found['position']}: {found['together']} "
                                f"vs {found['alone']} after a complete stream: {found['why']}")
    elif d.finish_reason != c1.finish_reason:
        out.changed.append(f"{tag}: finish reason {d.finish_reason!r} after a client went away, "
                            f"{c1.finish_reason!r} after a complete stream")
    else:
        s, base = d.speculation, c1.speculation
        if (base.accept_lens, base.draft_lens) == (again.speculation.accept_lens, again.speculation.draft_lens) and \
                (s.accept_lens, s.draft_lens) != (base.accept_lens, base.draft_lens):
            out.changed.append(f"{tag}: the same tokens, other rounds after a client went away: accept_lens "
                                f"{s.accept_lens[:8]} vs {base.accept_lens[:8]}, draft_lens {s.draft_lens[:8]} vs "
                                f"{base.draft_lens[:8]}")
    out.problems += [f"{tag}: statistics after a client went away: {p}" for p in stats_problems(d, probe, caps)]
    return out


def judge(probes: list[Probe]) -> tuple[str | None, str | None, dict]:
    """(failure, skip reason, evidence) of a test's probes. Problems fail on
    their own; a changed probe fails only where no probe was unsteady."""
    judged = [p for p in probes if p.abandoned and not p.unsteady]
    unsteady = [p.seed for p in probes if p.unsteady]
    problems = [x for p in probes for x in p.problems]
    changed = [x for p in judged for x in p.changed]
    evidence = dict(probes=len(probes), abandoned=sum(p.abandoned for p in probes), unsteady=unsteady,
                    triaged=[p.evidence for p in judged if p.evidence], changed=changed[:5])
    if problems:
        return f"{len(problems)} problems, first: {problems[:3]}", None, evidence
    if not any(p.abandoned for p in probes):
        return None, f"every stream ended within {ABANDON_AFTER} chunks: no client went away mid-stream", evidence
    if unsteady:  # the runtime does not repeat itself: no difference here can be laid at the disconnect's door
        return None, (f"the probe request gave two outputs after the same complete stream (seeds {unsteady}); "
                      f"{len(changed)} of the other {len(judged)} probes differed after a disconnect, which a runtime "
                      f"that does not repeat itself cannot pin on the disconnect (SEED-HISTORY's / "
                      f"SEED-DETERMINISM's to name)" + (f"; first: {changed[0]}" if changed else "")), evidence
    if changed:
        return (f"{len(changed)} of {len(judged)} probes changed after a client went away, first: {changed[:3]}",
                None, evidence)
    return None, None, evidence


__all__ = ["ABANDON_AFTER", "Probe", "disconnect_probes", "judge", "run_probe"]
