import pytest

from mtpcheck.contracts import SamplingParams

from ._util import request, spec_for


@pytest.mark.contract("SEED-DETERMINISM")
@pytest.mark.parametrize("speculate", [True, False], ids=["spec", "plain"])
def test_same_seed_same_output(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed, speculate):
    spec = spec_for(mtp_capabilities) if speculate else False
    for i, prompt in enumerate(mtp_fixture.values()):
        sp = SamplingParams(temperature=1.0, top_p=0.95, seed=mtp_seed + i)
        a = mtp_backend.generate(request(prompt, 32, sp, spec))
        b = mtp_backend.generate(request(prompt, 32, sp, spec))
        assert a.tokens == b.tokens, f"prompt {i}: two runs with seed {sp.seed} differ"


@pytest.mark.contract("SEED-SPEC-EQUALS-PLAIN")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_seeded_speculative_equals_seeded_plain(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed, depth):
    depth = min(depth, mtp_capabilities.max_depth)
    for i, prompt in enumerate(mtp_fixture.values()):
        sp = SamplingParams(temperature=1.0, seed=mtp_seed + 17 * i)
        plain = mtp_backend.generate(request(prompt, 32, sp, False))
        spec = mtp_backend.generate(request(prompt, 32, sp, spec_for(mtp_capabilities, depth)))
        assert spec.tokens == plain.tokens, f"prompt {i}, depth {depth}: speculative output differs from plain"
