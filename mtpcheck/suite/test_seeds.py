import numpy as np
import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.laws.precision import precision
from mtpcheck.machinery.checks import first_divergence, flip_excused, seeded_flip, traced_uniform
from mtpcheck.machinery.configs import request, spec_for


@pytest.mark.contract("SEED-DETERMINISM")
@pytest.mark.parametrize("speculate", [pytest.param(True, marks=pytest.mark.requires("speculation")), False],
                         ids=["spec", "plain"])
def test_same_seed_same_output(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed, speculate):
    spec = spec_for(mtp_capabilities) if speculate else False
    for i, prompt in enumerate(mtp_fixture.values()):
        sp = SamplingParams(temperature=1.0, top_p=0.95, seed=mtp_seed + i)
        a = mtp_backend.generate(request(prompt, 32, sp, spec))
        b = mtp_backend.generate(request(prompt, 32, sp, spec))
        j = first_divergence(a.tokens, b.tokens)
        assert j is None, (f"position {j}: two runs with seed {sp.seed} differ "
                           f"({a.tokens[j:j + 3]} vs {b.tokens[j:j + 3]}; prompt {i})")


@pytest.mark.contract("SEED-SPEC-EQUALS-PLAIN")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_seeded_speculative_equals_seeded_plain(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed, mtp_record, depth):
    caps = mtp_capabilities
    depth = min(depth, caps.max_depth)
    excused = []
    for i, (name, prompt) in enumerate(mtp_fixture.items()):
        sp = SamplingParams(temperature=1.0, seed=mtp_seed + 17 * i)
        plain = mtp_backend.generate(request(prompt, 32, sp, False))
        spec = mtp_backend.generate(request(prompt, 32, sp, spec_for(caps, depth)))
        j = first_divergence(spec.tokens, plain.tokens)
        if j is None:
            continue
        where = f"prompt {name}, depth {depth}, seed {sp.seed}"
        if j >= min(len(spec.tokens), len(plain.tokens)):
            pytest.fail(f"length: speculative output has {len(spec.tokens)} tokens, plain {len(plain.tokens)}, "
                        f"equal up to there ({where})")
        a, b = plain.tokens[j], spec.tokens[j]
        head = f"position {j}: speculative token {b} != plain token {a} ({where})"
        tolerance = precision(caps).cdf
        if not caps.target_distributions or tolerance <= 0:
            pytest.fail(f"{head}; no float flip is excused (CDF tolerance {tolerance:.3g}, "
                        f"target_distributions={caps.target_distributions})")
        # the law along the plain path, one token at a time (both paths agree before j)
        law = np.asarray(mtp_backend.target_distributions(prompt, plain.tokens[: j + 1], sp)[j])
        u = None
        if caps.traces:  # the seeded uniform itself, where a trace reports it
            traced = mtp_backend.generate(request(prompt, 32, sp, spec_for(caps, depth), trace=True))
            u = traced_uniform(traced, len(prompt), j) if traced.tokens == spec.tokens else None
        flip = seeded_flip(law, a, b, u)
        ok, why = flip_excused(flip, tolerance)
        evidence = dict(prompt=name, depth=depth, seed=sp.seed, position=j, **flip, excused=ok)
        mtp_record(seeded_divergence=evidence)
        if not ok:
            pytest.fail(f"{head}; {why} (p_plain={flip['p_plain']:.3g}, p_spec={flip['p_spec']:.3g}, "
                        f"boundary={flip['boundary']:.9g}, uniform={flip['uniform']})")
        excused.append(evidence)
    if excused:
        mtp_record(excused_float_flips=len(excused))
