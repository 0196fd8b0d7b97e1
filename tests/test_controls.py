"""CTRL-CONTRACT (issue 22, item 4): sampling controls judged against the
contract's definition. The clause passes the clean reference (which runs
penalties unaccelerated) and the reference speculating with penalties; it
fails each penalty-history mutant naming the side that deviates, including
the one both paths share, which the path-against-path clause
(REPORT-NO-SILENT-FALLBACK) passes; without raw logits it derives what it can
and skips repetition_penalty naming the capability."""

from __future__ import annotations

import numpy as np
import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.greedy_contract import (
    PathCheck,
    deviating_side,
    greedy_flips,
    logits_from_law,
    verdict,
)
from mtpcheck.machinery.contract_logits import DERIVED, RAW, missing_truth, penalised
from mtpcheck.machinery.harness import PROFILES, BackendGarbage, Guarded

# the suite's modules, not their test functions: pytest would collect those here
from mtpcheck.suite import test_controls as suite_controls
from mtpcheck.suite import test_report as suite_report

CONTROLS = suite_controls.CONTROLS

PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty", "combined")


def fixture_of(guarded):
    from mtpcheck.fixture import fixture_prompts

    return fixture_prompts(guarded)


def run_clause(backend, control: str):
    """The clause's suite test in process: (outcome, message, evidence)."""
    g = Guarded(backend, timeout=None)
    evidence: list[dict] = []
    try:
        suite_controls.test_greedy_tokens_are_the_contracts_processed_argmax(
            g, g.capabilities(), fixture_of(g), PROFILES["ci"], lambda **e: evidence.append(e), control)
    except pytest.fail.Exception as exc:
        return "failed", str(exc), evidence
    except pytest.skip.Exception as exc:
        return "skipped", str(exc), evidence
    return "passed", "", evidence


def run_old_clause(backend, control: dict):
    g = Guarded(backend, timeout=None)
    try:
        suite_report.test_unsupported_controls_are_never_silently_ignored(g, g.capabilities(), fixture_of(g),
                                                                          lambda **e: None, control)
    except AssertionError as exc:
        return "failed", str(exc)
    except pytest.fail.Exception as exc:
        return "failed", str(exc)
    return "passed", ""


class WithoutRawLogits:
    """A backend that exposes processed laws only (no target_logits)."""

    def __init__(self, inner, **update):
        self.inner, self.update = inner, {"raw_logits": False, **update}
        self.engine = inner.engine

    def capabilities(self):
        return self.inner.capabilities().model_copy(update=self.update)

    def generate(self, req):
        return self.inner.generate(req)

    def target_distributions(self, prompt, continuation, sampling):
        return self.inner.target_distributions(prompt, continuation, sampling)

    def encode(self, text):
        return self.inner.encode(text)


@pytest.fixture(scope="module")
def toy():
    from mtpcheck.backends.toy import load_toy

    return load_toy()


def mutant(name: str, **options):
    from mtpcheck.mutants import load_mutant

    return load_mutant(name, **options)


# -- the law ----------------------------------------------------------------------------------


def test_a_flip_is_excused_only_within_epsilon_of_the_top():
    rows = np.array([[0.0, 5.0, 4.9995, 1.0], [0.0, 5.0, 4.0, 4.9995], [3.0, 1.0, 0.0, 0.0]])
    flips = greedy_flips(rows, [2, 2, 0], epsilon=1e-3, prompt="p")
    assert [(f.position, f.expected, f.emitted, f.near_tie) for f in flips] == [(0, 1, 2, True), (1, 1, 2, False)]
    # position 1: the top-2 margin is a near tie (5 vs 4.9995), the emitted token is 1 nat below: not excused
    assert flips[1].margin == pytest.approx(5e-4) and flips[1].gap == pytest.approx(1.0)
    check = PathCheck("plain")
    check.add(rows, [2, 2, 0], 1e-3, "p")
    assert (check.checked, len(check.deviations), len(check.near_ties)) == (3, 1, 1)
    assert check.first.position == 1 and "p position 1: expected 1, emitted 2" in check.summary()


def test_the_verdict_names_the_deviating_side():
    rows, ok, bad = np.array([[0.0, 2.0]]), [1], [0]

    def path(name, emitted):
        c = PathCheck(name)
        c.add(rows, emitted, 1e-3, "q")
        return c

    cases = {("ok", "ok"): None, ("bad", "ok"): "speculative", ("ok", "bad"): "plain", ("bad", "bad"): "both"}
    for (s, p), side in cases.items():
        spec, plain = path("speculative", ok if s == "ok" else bad), path("plain", ok if p == "ok" else bad)
        assert deviating_side(spec, plain) == side
        message = verdict("presence_penalty", spec, plain, 1e-3, RAW)
        if side is None:
            assert message is None
        else:
            assert message.startswith(f"presence_penalty: deviating path: {side}; ")
            assert "q position 0: expected 1, emitted 0 (margin 2, emitted 2 below the top)" in message


def test_derived_logits_serve_the_additive_controls_only(toy):
    prompt, cont = [3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5]
    raw = toy.target_logits(prompt, cont)
    derived = logits_from_law(toy.target_distributions(prompt, cont, SamplingParams(temperature=1.0)))
    shift = raw - derived  # a constant per row
    assert np.allclose(shift - shift[:, :1], 0.0, atol=1e-9)
    additive = SamplingParams(temperature=0.0, presence_penalty=1.5, frequency_penalty=1.0, logit_bias={7: 2.0})
    assert (np.argmax(penalised(raw, additive, prompt, cont), axis=1)
            == np.argmax(penalised(derived, additive, prompt, cont), axis=1)).all()
    caps = toy.capabilities().model_copy(update={"raw_logits": False})
    assert missing_truth(caps, additive) is None
    why = missing_truth(caps, SamplingParams(temperature=0.0, repetition_penalty=1.5))
    assert why.startswith("backend lacks capability: raw_logits") and "repetition_penalty" in why
    assert "raw_logits" in missing_truth(caps.model_copy(update={"truncated_laws": 8}), additive)
    assert "raw_logits, target_distributions" in missing_truth(caps.model_copy(update={"target_distributions": False}),
                                                              additive)


def test_guarded_target_logits_are_validated(toy):
    class Wrong:
        def __init__(self, rows):
            self.rows = rows

        def capabilities(self):
            return toy.capabilities()

        def target_logits(self, prompt, continuation):
            return self.rows

    V = toy.capabilities().vocab_size
    assert Guarded(toy, timeout=None).target_logits([1, 2], [3, 4]).shape == (2, V)
    with pytest.raises(BackendGarbage, match=r"shape \(1, 48\), expected \(2, 48\)"):
        Guarded(Wrong(np.zeros((1, V))), timeout=None).target_logits([1, 2], [3, 4])
    bad = np.zeros((2, V))
    bad[1, 5] = np.nan
    with pytest.raises(BackendGarbage, match=r"non-finite logits \(row, token\) \[\[1, 5\]\]"):
        Guarded(Wrong(bad), timeout=None).target_logits([1, 2], [3, 4])
    with pytest.raises(BackendGarbage, match="has no target_logits"):
        Guarded(WithoutRawLogits(toy), timeout=None).target_logits([1, 2], [3, 4])


# -- the clause on the reference and on its mutants ----------------------------------------


@pytest.mark.parametrize("control", list(CONTROLS))
def test_the_clean_reference_conforms_and_every_item_has_power(toy, control):
    outcome, message, [ev] = run_clause(toy, control)
    assert outcome == "passed", message
    assert ev["ground_truth"] == RAW
    assert ev["speculative"]["positions_checked"] == ev["plain"]["positions_checked"] == 2 * PROFILES["ci"].greedy_tokens
    for row in ev["prompts"]:
        assert row["changed_target_only_output"] and row["positions_the_control_decides"] > 0, row
        if control in PENALTIES:  # a history without the prompt would give other tokens
            assert row["positions_the_prompt_history_decides"] > 0, row
        assert row["speculative_reason"] == "sampling_control_unsupported"  # the reference runs them unaccelerated


def test_speculating_with_penalties_conforms_when_the_history_is_right(toy):
    """The engine can speculate with penalties (each verified row at its own
    history): the speculative path then really speculates and still conforms."""
    from mtpcheck.backends.toy import load_toy
    from mtpcheck.mutants.zoo import penalty_history_without_prompt

    backend = load_toy(drafter="assistant", twin="1")  # the target drafts for itself: proposals are accepted
    penalty_history_without_prompt(backend, drops=())
    for control in ("repetition_penalty", "combined"):
        outcome, message, [ev] = run_clause(backend, control)
        assert outcome == "passed", message
        assert all(row["speculative_used"] and row["speculative_accepted"] > 0 for row in ev["prompts"]), ev["prompts"]


SIDES = {"penalty-history-without-prompt": "both", "plain-penalty-history-without-prompt": "plain",
         "speculative-penalty-history-without-prompt": "speculative"}


@pytest.mark.parametrize("name", list(SIDES))
def test_each_history_mutant_fails_naming_its_side(name):
    backend = mutant(name)
    for control in PENALTIES:
        outcome, message, [ev, named] = run_clause(backend, control)
        assert outcome == "failed" and message.startswith(f"{control}: deviating path: {SIDES[name]}; "), message
        assert named == {"deviating_side": SIDES[name]}  # what a pinned xfails line is held to
        wrong = [p for p in ("speculative", "plain") if SIDES[name] in ("both", p)]
        for p in ("speculative", "plain"):
            first = ev[p]["first_deviation"]
            assert (first is not None) == (p in wrong), (p, ev[p])
            if first:
                assert first["expected"] != first["emitted"] and first["gap"] >= 1e-3 and not first["near_tie"]
    # the logit bias needs no history: the mutants keep it right
    assert run_clause(backend, "logit_bias")[0] == "passed"


def test_the_shared_bug_passes_the_old_clause_and_fails_the_new_naming_both():
    """mlx-lm 0.31.2's case, on the trained fixture (the mutant's declared base)."""
    backend = mutant("penalty-history-without-prompt")
    assert backend.capabilities().text  # the trained fixture, not the toy
    for control in suite_report.CONTROLS:
        assert run_old_clause(backend, control) == ("passed", ""), control
    outcome, message, _ = run_clause(backend, "repetition_penalty")
    assert outcome == "failed" and "deviating path: both;" in message


def test_a_plain_path_bug_is_named_plain_by_both_clauses(toy):
    """mlx-lm 0.31.1's case: the path comparison sees the outputs differ; the
    contract's law, from the raw logits, says the plain path is wrong - in
    REPORT-NO-SILENT-FALLBACK's message too (it used to say speculation differs)."""
    backend = mutant("plain-penalty-history-without-prompt")
    outcome, message = run_old_clause(backend, {"repetition_penalty": 2.0})
    assert outcome == "failed" and "differs from target-only output: deviating side plain" in message
    outcome, message, _ = run_clause(backend, "repetition_penalty")
    assert outcome == "failed" and message.startswith("repetition_penalty: deviating path: plain; speculative: conforms")


def test_the_silent_drop_of_penalties_is_named_speculative():
    """The zoo's older B16 mutant (penalties dropped with speculation) fails here too, on its side."""
    outcome, message, _ = run_clause(mutant("drops-penalties"), "presence_penalty")
    assert outcome == "failed" and "deviating path: speculative;" in message


# -- without raw logits ------------------------------------------------------------------------


def test_without_raw_logits_the_additive_controls_are_derived_and_repetition_skips(toy):
    backend = WithoutRawLogits(toy)
    for control in ("repetition_penalty", "combined"):
        outcome, message, _ = run_clause(backend, control)
        assert outcome == "skipped" and message.startswith("backend lacks capability: raw_logits"), message
    for control in ("presence_penalty", "frequency_penalty", "logit_bias"):
        outcome, message, [ev] = run_clause(backend, control)
        assert outcome == "passed" and ev["ground_truth"] == DERIVED, message
    outcome, message, _ = run_clause(WithoutRawLogits(mutant("speculative-penalty-history-without-prompt")),
                                     "presence_penalty")
    assert outcome == "failed" and "deviating path: speculative;" in message
    outcome, message, _ = run_clause(WithoutRawLogits(toy, truncated_laws=8), "presence_penalty")
    assert outcome == "skipped" and "top 8 probabilities" in message


def test_a_control_declared_unsupported_skips_its_items(toy):
    backend = WithoutRawLogits(toy, raw_logits=True, unsupported_controls=["presence_penalty"])
    backend.target_logits = toy.target_logits
    for control in ("presence_penalty", "combined"):
        outcome, message, _ = run_clause(backend, control)
        assert outcome == "skipped" and message == ("backend declares presence_penalty unsupported on either path "
                                                    "(unsupported_controls)"), message
    assert run_clause(backend, "frequency_penalty")[0] == "passed"
