import pytest

from mtpcheck.contracts import SamplingParams, SpeculationUnavailableError
from mtpcheck.laws.greedy_contract import PathCheck, deviating_side
from mtpcheck.laws.precision import precision
from mtpcheck.machinery.checks import honesty_problems
from mtpcheck.machinery.configs import request, spec_for
from mtpcheck.machinery.contract_logits import base_logits, missing_truth, penalised, truth_source

REASONS = {"not_requested", "sampling_control_unsupported", "drafter_unavailable",
           "depth_exceeds_capability", "adaptive_disabled"}


HONEST_PROMPTS = 3  # fixture prompts x (T=0, T=1) whose rounds REPORT-HONEST reads
INFERRED = ("not judged: inferred from the declared policy (round_statistics='inferred'): the adapter fills in "
            "draft_lens as min(depth, room), so a check of them restates the declaration")


@pytest.mark.contract("REPORT-HONEST")
def test_report_says_what_ran(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed, mtp_record):
    prompt = next(iter(mtp_fixture.values()))
    sp = SamplingParams(temperature=0.0)
    first = mtp_backend.generate(request(prompt, 16, sp, spec_for(mtp_capabilities), stop_token_ids=[]))
    on = first.speculation
    assert on.requested and on.mode == "native_mtp"
    # used=True means speculation ran in every round that had room (a fallback to plain decoding says so);
    # rounds whose proposal counts the adapter inferred from the declared policy cannot show it
    problems = []
    for i, p in enumerate(list(mtp_fixture.values())[:HONEST_PROMPTS]):
        for t in (0.0, 1.0):
            req = request(p, 32, SamplingParams(temperature=t, seed=mtp_seed + i), spec_for(mtp_capabilities),
                          stop_token_ids=[])
            res = mtp_backend.generate(req)
            if mtp_capabilities.round_statistics != "inferred":
                problems += [f"prompt {i}, T={t}: {x}" for x in honesty_problems(res, req, mtp_capabilities)]
    mtp_record(round_rule=INFERRED if mtp_capabilities.round_statistics == "inferred"
               else f"judged ({mtp_capabilities.round_statistics})")
    assert not problems, f"{len(problems)} rounds reported as speculation that drafted nothing, first: {problems[:3]}"
    if on.used:
        assert on.rounds >= 1 and on.drafted >= 1, f"drafted={on.drafted}, rounds={on.rounds} with used=True"
        assert on.reason is None, f"reason={on.reason!r} with used=True"
    else:
        assert on.reason in REASONS and on.message, (
            f"reason={on.reason!r}, message={on.message!r}: used=False needs a named reason and a message")
    off = mtp_backend.generate(request(prompt, 16, sp, False)).speculation
    assert not off.requested and not off.used and off.rounds == 0 and off.drafted == 0, (
        f"requested={off.requested}, used={off.used}, rounds={off.rounds}, drafted={off.drafted} with speculation off")
    assert off.reason == "not_requested" and off.message, (
        f"reason={off.reason!r}, message={off.message!r} with speculation off, expected 'not_requested' and words")


# strong enough that honouring them visibly changes greedy output, and inside the
# ranges APIs accept (OpenAI's penalties: [-2, 2]; vLLM refuses 3.0 with HTTP 400)
CONTROLS = [{"repetition_penalty": 2.0}, {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"logit_bias": {5: 100.0}}]
CONTROL_PROMPTS = 4  # fixture prompts tried for one on which the control changes the target-only output
CONTROL_TOKENS = 24


def control_prompt(backend, fixture: dict, sp: SamplingParams, name: str):
    """The first fixture prompt on which the control changes greedy target-only
    output, with (off, plain); skips when none does: a control that changes
    nothing cannot show whether speculation honours it (CTRL-CONTRACT judges
    the target path against the contract's law)."""
    for prompt in list(fixture.values())[:CONTROL_PROMPTS]:
        off = backend.generate(request(prompt, CONTROL_TOKENS, sp, False))
        plain = backend.generate(request(prompt, CONTROL_TOKENS, SamplingParams(temperature=0.0), False))
        if off.tokens != plain.tokens:
            return prompt, off, plain
    pytest.skip(f"{name} changed the target-only greedy output on none of {CONTROL_PROMPTS} fixture prompts "
                f"({CONTROL_TOKENS} tokens): nothing to compare speculation with (CTRL-CONTRACT checks the law)")


def _side_of(backend, caps, prompt, sp, on, off) -> tuple[str | None, str, bool]:
    """Which path left the contract's law where the two outputs differ: each
    greedy output against the argmax of the contract's processed logits
    (as CTRL-CONTRACT judges it), or no side where the backend gives no ground
    truth; and whether both paths conform, their difference a near tie."""
    why = missing_truth(caps, sp.model_copy(update={"logit_bias": None}))
    if why:
        return None, f"side not named: {why}", False
    checks = {"speculative": PathCheck("speculative"), "plain": PathCheck("plain")}
    for path, res in (("speculative", on), ("plain", off)):
        checks[path].add(penalised(base_logits(backend, caps, prompt, res.tokens), sp, prompt, res.tokens,
                                   penalty_history=caps.penalty_history),
                         res.tokens, precision(caps).logit_gap)
    words = f"{checks['speculative'].summary()}; {checks['plain'].summary()}, against {truth_source(caps)}"
    tie = not checks["speculative"].deviations and not checks["plain"].deviations
    return deviating_side(checks["speculative"], checks["plain"]), words, tie


@pytest.mark.contract("REPORT-NO-SILENT-FALLBACK")
@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: next(iter(c)))
def test_unsupported_controls_are_never_silently_ignored(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record,
                                                         control):
    name = next(iter(control))
    if name in mtp_capabilities.unsupported_controls:
        pytest.skip(f"backend declares {name} unsupported on either path (unsupported_controls)")
    sp = SamplingParams(temperature=0.0, **control)
    prompt, off, plain = control_prompt(mtp_backend, mtp_fixture, sp, name)
    on = mtp_backend.generate(request(prompt, CONTROL_TOKENS, sp, spec_for(mtp_capabilities)))
    if not on.speculation.used:
        s = on.speculation
        assert s.reason == "sampling_control_unsupported", (
            f"reason={s.reason!r} with {name} and speculation off, expected 'sampling_control_unsupported' "
            f"(message: {s.message!r})")
        assert name in (s.message or ""), f"message={s.message!r} does not name the control {name}"
    elif name not in mtp_capabilities.speculative_sampling_controls:
        pytest.fail(f"speculated with {name} that the backend does not declare it honours")
    if on.tokens != off.tokens:
        side, words, tie = _side_of(mtp_backend, mtp_capabilities, prompt, sp, on, off)
        if tie:  # each output is the contract's argmax within the precision rule: a float flip, not a dropped control
            mtp_record(control=name, outputs_differ_at_a_near_tie=words)
        else:
            mtp_record(control=name, deviating_side=side, paths=words)
            pytest.fail(f"with {name}, speculative output differs from target-only output: deviating side "
                        f"{side or 'not named'} ({words})")
    if not on.speculation.used:
        with pytest.raises(SpeculationUnavailableError):
            mtp_backend.generate(request(prompt, CONTROL_TOKENS, sp, spec_for(mtp_capabilities, require_acceleration=True)),
                                 expect=(SpeculationUnavailableError,))
