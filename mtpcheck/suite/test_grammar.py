"""CONSTRAINT-LANGUAGE: a constraint given through the request (structured
output, as servers take it) under speculation, judged black-box: every output
belongs to the language, greedy output is the masked argmax path, and sampled
outputs follow the exact law of the plain path under the same constraint
(enumerated: mtpcheck/machinery/grammar.py)."""

import re

import numpy as np
import pytest

from mtpcheck.contracts import OutputConstraint, SamplingParams
from mtpcheck.laws.precision import precision
from mtpcheck.laws.stats import rank_gtest
from mtpcheck.machinery.checks import top2_logit_gap
from mtpcheck.machinery.configs import CONSTRAINT_PATHS, request, seeded, spec_for, subtest_alpha
from mtpcheck.machinery.grammar import choice_dfa, output_path, path_law

MAX_TOKENS = 12  # a choice of up to 6 characters and its end token fit with room to spare
SAMPLES_PER_RUN = 4  # outputs of a few tokens each: four times a DIST-EQUIV configuration's runs, for bins to test
SAMPLED = SamplingParams(temperature=1.0)


def choice_for(backend, fixture) -> tuple[list[int], OutputConstraint]:
    """A prompt and four prefix-free words of its own text: every tokenizer of the
    fixture can spell them, and the model has seen them in this context."""
    prompt = next((p for k, p in fixture.items() if k.startswith("structured")), next(iter(fixture.values())))
    words: list[str] = []
    for w in re.findall(r"[a-z]{3,6}", backend.decode(prompt)):
        if w not in words and not any(w.startswith(o) or o.startswith(w) for o in words):
            words.append(w)
    if len(words) < 2:
        pytest.skip("the fixture prompt holds fewer than two usable words for a choice")
    return prompt, OutputConstraint(choice=words[:4])


def _constrained(prompt, constraint, sp, spec):
    return request(prompt, MAX_TOKENS, sp, spec).model_copy(update={"constraint": constraint})


def _language_problems(backend, caps, res, constraint) -> list[str]:
    text = backend.decode(list(output_path(res.tokens, caps.eos_token_ids)))
    out = []
    if text not in constraint.choice:
        out.append(f"output {text!r} (tokens {res.tokens}) is not one of {constraint.choice}")
    elif res.finish_reason != "stop":
        out.append(f"output {text!r} is complete but finish_reason is {res.finish_reason!r}, not 'stop'")
    return out


@pytest.mark.contract("CONSTRAINT-LANGUAGE")
@pytest.mark.exercise(reason="nine outputs of a word each have room for a dozen proposals; the clause's sampled-law "
                             "test, 160 such requests, carries its exercise")
def test_outputs_belong_to_the_language(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed, mtp_record):
    prompt, constraint = choice_for(mtp_backend, mtp_fixture)
    dfa = choice_dfa(mtp_backend, _constrained(prompt, constraint, SAMPLED, None))
    greedy = SamplingParams(temperature=0.0)
    runs = {"greedy, speculative": _constrained(prompt, constraint, greedy, spec_for(mtp_capabilities)),
            "greedy, plain": _constrained(prompt, constraint, greedy, False)}
    for r in range(8):
        runs[f"seed {mtp_seed + r}, speculative"] = _constrained(prompt, constraint, seeded(SAMPLED, mtp_seed + r),
                                                                spec_for(mtp_capabilities))
    problems, outputs = [], {}
    for name, req in runs.items():
        res = mtp_backend.generate(req)
        outputs[name] = res.tokens
        problems += [f"{name}: {p}" for p in _language_problems(mtp_backend, mtp_capabilities, res, constraint)]
    want, gap, tol = None, None, precision(mtp_capabilities).logit_gap
    if not mtp_capabilities.truncated_laws:  # top-N rows cannot say where the mask leaves the argmax
        want, gap = _masked_argmax_path(mtp_backend, prompt, dfa)
        for name in ("greedy, speculative", "greedy, plain"):
            got = list(output_path(outputs[name], mtp_capabilities.eos_token_ids))
            if got != want and gap >= tol:  # a near tie under the mask may flip either way
                problems.append(f"{name}: output {got} is not the target's masked argmax path {want} (smallest "
                                f"top-2 logit gap on it {gap:.3g} nats, beyond the precision rule's {tol:.3g})")
    mtp_record(choice=constraint.choice, outputs=outputs, greedy_path=want, greedy_top2_logit_gap=gap,
               logit_gap_tolerance=tol)
    assert not problems, "outputs under a request constraint leave its language: " + "; ".join(problems[:4])


def _masked_argmax_path(backend, prompt, dfa) -> tuple[list[int], float]:
    """Greedy under the constraint: the target's masked argmax path, step by
    step, and the smallest top-2 logit gap log(p1/p2) along it."""
    want, state, margins = [], dfa.start, []
    for _ in range(MAX_TOKENS):  # the argmax of the temperature-1 law is greedy's token
        law = backend.target_distributions(prompt, [*want, 0], SAMPLED)[-1] * dfa.allowed(state)
        margins.append(top2_logit_gap(law))
        t = int(np.argmax(law))
        if t in dfa.end_ids and dfa.complete(state):
            break
        want.append(t)
        state = dfa.advance(state, t)
    return want, min(margins)


@pytest.mark.contract("CONSTRAINT-LANGUAGE")
@pytest.mark.parametrize("path", CONSTRAINT_PATHS)
def test_constrained_outputs_follow_the_exact_law(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed,
                                                  mtp_record, path):
    """Both paths against the plain path's exact law under the constraint: a
    failure of the plain path too puts the fault in the runtime's constraint
    engine (its mask), not in speculation."""
    if mtp_capabilities.truncated_laws:
        pytest.skip(f"the backend's laws are its top {mtp_capabilities.truncated_laws} tokens (truncated_laws): the "
                    f"law under a mask needs whole rows, since the tokens a constraint allows may lie past the top N")
    prompt, constraint = choice_for(mtp_backend, mtp_fixture)
    spec = spec_for(mtp_capabilities) if path == "speculative" else False
    reqs = [_constrained(prompt, constraint, seeded(SAMPLED, mtp_seed * 1000 + 7 + r), spec)
            for r in range(SAMPLES_PER_RUN * mtp_profile.dist_runs)]
    results = (mtp_backend.generate_batch(reqs) if mtp_capabilities.generate_batch
               else [mtp_backend.generate(r) for r in reqs])
    law = path_law(mtp_backend, prompt, choice_dfa(mtp_backend, reqs[0]), SAMPLED)
    paths = list(law)
    index = {p: i for i, p in enumerate(paths)}
    probs = np.array([*law.values(), 0.0])  # last cell: any output outside the enumerated paths
    seen = [output_path(r.tokens, mtp_capabilities.eos_token_ids) for r in results]
    obs = [(index.get(s, len(paths)), probs) for s in seen]
    alpha = subtest_alpha("test_constrained_outputs_follow_the_exact_law")
    res = rank_gtest(obs, alpha=alpha)
    outside = [list(s) for s in seen if s not in index]
    counts = {mtp_backend.decode(list(p)) + f" {list(p)}": (seen.count(p), round(law[p] * len(seen), 2))
              for p in paths if seen.count(p) or law[p] * len(seen) >= 0.5}
    mtp_record(path=path, choice=constraint.choice, paths=len(paths), test=res.model_dump(),
               counts=counts, outside=outside[:5])
    assert not outside, (f"{path} outputs under the constraint {constraint.choice} took token paths the plain "
                         f"path's masked law gives probability 0: {outside[:3]}")
    assert res.passed, (f"{path} outputs under the constraint do not follow the plain path's masked law "
                        f"(observed, expected by path: {counts}): p={res.p_value:.3g} < alpha={alpha:.2g}")
