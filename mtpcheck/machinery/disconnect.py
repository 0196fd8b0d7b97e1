"""STREAM-DISCONNECT: a client that goes away mid-stream (the stream's
generator closed; over HTTP the connection dropped) leaves the runtime
serving, and the requests after it as they would have been.

Black-box. The probe request R is served three times, each right after the
same other request A (same prompt, another seed, a longer budget), so every
run of R follows the same history except for how A ended:

    stream A to the end; R -> c1
    stream A, abandon it after `after` chunks; R -> d
    stream A to the end; R -> c2

c1 != c2 means R has no one output after A here (not the disconnect's doing:
SEED-HISTORY / SEED-DETERMINISM name that), and the probe is unsteady. Else d
must equal c1 - tokens (a divergence triaged as CONCURRENT-EQUALS-SOLO's: the
abandoned request may still be in flight beside R, which changes kernel
shapes), finish reason and, where the tokens agree, the rounds - and d's
statistics must be consistent on their own (STATS-CONSISTENT's checks). The
chunks A sent before it was abandoned must be a prefix of A's complete stream.
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
    unsteady: bool = False  # c1 != c2
    problems: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)


def run_probe(backend, caps: Capabilities, probe: GenerationRequest, other: GenerationRequest,
              after: int = ABANDON_AFTER) -> Probe:
    """One probe (module docstring) on a Guarded backend."""
    full1 = backend.generate_stream(other)
    c1 = backend.generate(probe)
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
    if c1.tokens != c2.tokens or c1.finish_reason != c2.finish_reason:
        out.unsteady = True
        return out
    found = divergence(backend, caps, probe, c1, d)
    if found is not None:
        out.evidence = found
        if not found["excused"]:
            out.problems.append(f"{tag}: after a client went away, position {found['position']}: {found['together']} "
                                f"vs {found['alone']} after a complete stream: {found['why']}")
    elif d.finish_reason != c1.finish_reason:
        out.problems.append(f"{tag}: finish reason {d.finish_reason!r} after a client went away, "
                            f"{c1.finish_reason!r} after a complete stream")
    else:
        s, base = d.speculation, c1.speculation
        if (base.accept_lens, base.draft_lens) == (c2.speculation.accept_lens, c2.speculation.draft_lens) and \
                (s.accept_lens, s.draft_lens) != (base.accept_lens, base.draft_lens):
            out.problems.append(f"{tag}: the same tokens, other rounds after a client went away: accept_lens "
                                f"{s.accept_lens[:8]} vs {base.accept_lens[:8]}, draft_lens {s.draft_lens[:8]} vs "
                                f"{base.draft_lens[:8]}")
    out.problems += [f"{tag}: statistics after a client went away: {p}" for p in stats_problems(d, probe, caps)]
    return out


__all__ = ["ABANDON_AFTER", "Probe", "disconnect_probes", "run_probe"]
