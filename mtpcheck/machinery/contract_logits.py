"""CTRL-CONTRACT's ground truth: the contract's processed logits at
temperature 0, computed by the suite from the backend's raw logits.

Source, strongest first:

* ``raw_logits`` (``Guarded.target_logits``): the target's unprocessed
  logits along each path's own output; every control is judged;
* ``target_distributions`` only: log p of the unfiltered temperature-1 law is
  the logits less a constant per row, enough for logit bias and the presence
  and frequency penalties (they add to logits); repetition_penalty is
  sign-dependent and skips, naming the missing capability. Truncated (top-N)
  laws give no logit for the tail and skip too.

The processing is the contract's own (`mtpcheck.engine.sampling.apply_penalties`:
logit bias, then repetition, presence and frequency penalties over prompt +
output so far, or presence and frequency over the output alone where the
backend declares `penalty_history="output_only"`, OpenAI's convention); the
verdict is `mtpcheck.laws.greedy_contract`.
"""

from __future__ import annotations

import numpy as np

from mtpcheck.contracts import Capabilities, SamplingParams
from mtpcheck.laws.greedy_contract import logits_from_law, sign_dependent

RAW = "raw logits (target_logits)"
DERIVED = "log p of the temperature-1 target_distributions, the logits up to a constant per row"


def truth_source(caps: Capabilities) -> str:
    return RAW if caps.raw_logits else DERIVED


def missing_truth(caps: Capabilities, sp: SamplingParams) -> str | None:
    """Why the processed logits of `sp` cannot be had from this backend (a
    skip reason naming the capability), or None."""
    if caps.raw_logits:
        return None
    if not caps.target_distributions:
        return "backend lacks capability: raw_logits, target_distributions (no ground truth for the processed law)"
    if caps.truncated_laws:
        return (f"backend lacks capability: raw_logits (target_distributions gives the top {caps.truncated_laws} "
                "probabilities only: no logit for the tail, which a penalty or bias can lift to the top)")
    needs = sign_dependent(sp)
    if needs:
        return (f"backend lacks capability: raw_logits ({', '.join(needs)} divides positive logits and multiplies "
                "negative ones: target_distributions fixes the logits only up to a constant per row)")
    return None


def base_logits(backend, caps: Capabilities, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """[len(continuation), V]: the raw logits, or (derived) log p of the
    temperature-1 law, at every teacher-forced position of `continuation`."""
    if caps.raw_logits:
        return backend.target_logits(list(prompt), list(continuation))
    laws = backend.target_distributions(list(prompt), list(continuation), SamplingParams(temperature=1.0))
    return logits_from_law(laws)


def penalised(rows: np.ndarray, sp: SamplingParams, prompt: list[int], continuation: list[int],
              prompt_in_history: bool = True, penalty_history: str = "prompt_and_output") -> np.ndarray:
    """The contract's processed logits (before temperature) at every position:
    row i with the history prompt + continuation[:i] (without the prompt when
    `prompt_in_history` is False: the evidence of how much the prompt's part
    of the history decides); presence and frequency penalties count the output
    alone under the declared convention `penalty_history="output_only"`."""
    from mtpcheck.engine.sampling import apply_penalties

    seq = (list(prompt) if prompt_in_history else []) + list(continuation)
    lead = len(seq) - len(continuation)
    out_only = penalty_history == "output_only"
    return np.stack([apply_penalties(np.asarray(rows[i], dtype=np.float64), sp, seq[: lead + i],
                                     list(continuation[:i]) if out_only else None)
                     for i in range(len(continuation))]) if len(continuation) else np.zeros((0, rows.shape[-1]))


def argmax_changes(a: np.ndarray, b: np.ndarray) -> int:
    """Positions whose argmax differs between two sets of rows."""
    return int(np.sum(np.argmax(a, axis=-1) != np.argmax(b, axis=-1))) if len(a) else 0
