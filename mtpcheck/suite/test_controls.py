"""CTRL-CONTRACT: sampling controls judged against the contract's definition,
not only speculation against plain decoding.

REPORT-NO-SILENT-FALLBACK compares the two paths with each other. A bug both
share (mlx-lm 0.31.2 left the prompt out of the penalty history on both) then
gives the same wrong output on both sides and passes, and a bug of the plain
path alone (0.31.1) is blamed on speculation. Here every greedy token of each
path is checked against the argmax of the contract's processed logits, from
the backend's raw logits over the whole history (prompt + output so far), so
the failure names the path that deviates.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.greedy_contract import PathCheck, deviating_side, verdict
from mtpcheck.laws.precision import precision
from mtpcheck.machinery.configs import request, spec_for
from mtpcheck.machinery.contract_logits import (
    argmax_changes,
    base_logits,
    missing_truth,
    penalised,
    truth_source,
)

GREEDY = SamplingParams(temperature=0.0)
BIAS = "bias"  # placeholder: the logit bias is built per prompt (bias_for)
# moderate strengths: each decides some positions and leaves others to the model,
# so a control applied at the wrong history or strength shows (the evidence
# counts the positions each decides)
CONTROLS = {
    "repetition_penalty": {"repetition_penalty": 1.5},
    "presence_penalty": {"presence_penalty": 1.5},
    "frequency_penalty": {"frequency_penalty": 1.0},
    "logit_bias": {"logit_bias": BIAS},
    "combined": {"logit_bias": BIAS, "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5},
}


def repetitive_prompts(fixture: dict[str, list[int]], n: int) -> dict[str, list[int]]:
    """The n fixture prompts that repeat their own tokens most (penalties act
    on repeated tokens; a prompt that repeats makes its part of the history
    decide tokens): share of tokens seen before, then name."""
    def repeats(ids):
        return 1.0 - len(set(ids)) / len(ids)

    names = sorted(fixture, key=lambda k: (-repeats(fixture[k]), k))[:n]
    return {k: fixture[k] for k in names}


def bias_for(plain_tokens: list[int]) -> dict[int, float]:
    """A logit bias that must change greedy output: the two most frequent
    tokens of the uncontrolled plain output banned (-100), the third lifted
    by 2 nats (a push that decides some positions, not all)."""
    common = [t for t, _ in Counter(plain_tokens).most_common(3)]
    bias = {t: -100.0 for t in common[:2]}
    if len(common) > 2:
        bias[common[2]] = 2.0
    return bias


def sampling_for(control: str, plain_tokens: list[int]) -> SamplingParams:
    fields = dict(CONTROLS[control])
    if fields.get("logit_bias") == BIAS:
        fields["logit_bias"] = bias_for(plain_tokens)
    return SamplingParams(temperature=0.0, **fields)


@pytest.mark.contract("CTRL-CONTRACT")
@pytest.mark.parametrize("control", list(CONTROLS))
def test_greedy_tokens_are_the_contracts_processed_argmax(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile,
                                                          mtp_record, control):
    caps = mtp_capabilities
    unsupported = [c for c in CONTROLS[control] if c in caps.unsupported_controls]
    if unsupported:
        pytest.skip(f"backend declares {', '.join(unsupported)} unsupported on either path (unsupported_controls)")
    # the bias is additive whatever its tokens: the penalties decide what the ground truth needs
    why = missing_truth(caps, SamplingParams(temperature=0.0, **{k: v for k, v in CONTROLS[control].items()
                                                                 if k != "logit_bias"}))
    if why:
        pytest.skip(why)
    spec_block = spec_for(caps)
    rule = precision(caps)
    eps, n, source = rule.logit_gap, mtp_profile.greedy_tokens, truth_source(caps)
    checks = {"speculative": PathCheck("speculative"), "plain": PathCheck("plain")}
    prompts, t0 = [], time.perf_counter()
    for name, prompt in repetitive_prompts(mtp_fixture, mtp_profile.control_prompts).items():
        free = mtp_backend.generate(request(prompt, n, GREEDY, False, stop_token_ids=[]))
        sp = sampling_for(control, free.tokens)
        runs = {"speculative": mtp_backend.generate(request(prompt, n, sp, spec_block, stop_token_ids=[])),
                "plain": mtp_backend.generate(request(prompt, n, sp, False, stop_token_ids=[]))}
        row = {"prompt": name, "prompt_tokens": len(prompt), "logit_bias": sp.logit_bias,
               "changed_target_only_output": runs["plain"].tokens != free.tokens}
        for path, res in runs.items():
            raw = base_logits(mtp_backend, caps, prompt, res.tokens)
            rows = penalised(raw, sp, prompt, res.tokens, penalty_history=caps.penalty_history)
            checks[path].add(rows, res.tokens, eps, name)
            if path == "plain":  # how much power the item has, read from the law itself
                row["positions_the_control_decides"] = argmax_changes(rows, raw)
                row["positions_the_prompt_history_decides"] = argmax_changes(
                    rows, penalised(raw, sp, prompt, res.tokens, prompt_in_history=False))
            else:
                s = res.speculation
                row["speculative_used"], row["speculative_reason"] = s.used, s.reason
                row["speculative_accepted"] = s.accepted
        prompts.append(row)
    mtp_record(control=control, ground_truth=source, precision=rule.evidence(), penalty_history=caps.penalty_history, tokens_per_path=n, prompts=prompts,
               speculative=checks["speculative"].evidence(), plain=checks["plain"].evidence(),
               seconds=round(time.perf_counter() - t0, 2))
    message = verdict(control, checks["speculative"], checks["plain"], eps, source)
    if message:
        mtp_record(deviating_side=deviating_side(checks["speculative"], checks["plain"]))
        pytest.fail(message)
