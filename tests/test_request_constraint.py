"""GenerationRequest.constraint (CONSTRAINT-LANGUAGE): the contract, the
reference honouring it on every path, the harness refusing it where it is not
declared, and the enumerated law of the plain path."""

import numpy as np
import pydantic
import pytest

from mtpcheck.contracts import GenerationRequest, OutputConstraint, SamplingParams
from mtpcheck.contracts.errors import SettingsError
from mtpcheck.machinery.grammar import choice_dfa, output_path, path_law
from mtpcheck.machinery.harness import Guarded

CHOICE = OutputConstraint(choice=["name", "city", "grace"])


@pytest.fixture(scope="module")
def mlx():
    from mtpcheck.backends import load_backend

    return load_backend("mlx")


def _req(prompt, **kw):
    return GenerationRequest(prompt_tokens=prompt, max_tokens=12, constraint=CHOICE, **kw)


def test_choices_must_be_prefix_free():
    with pytest.raises(pydantic.ValidationError, match="prefix-free"):
        OutputConstraint(choice=["grace", "graceful"])
    with pytest.raises(pydantic.ValidationError):
        OutputConstraint(choice=[])


def test_a_backend_that_does_not_declare_it_never_gets_the_request():
    from mtpcheck.backends import load_backend

    toy = Guarded(load_backend("toy"))  # no tokenizer: request_constraints False
    assert not toy.capabilities().request_constraints
    with pytest.raises(SettingsError, match="request_constraints"):
        toy.generate(_req([1, 2, 3]))


def test_the_reference_honours_the_constraint_on_every_path(mlx):
    from mtpcheck.fixture import fixture_prompts

    prompt = next(iter(fixture_prompts(mlx).values()))
    eos = mlx.capabilities().eos_token_ids
    reqs = [_req(prompt, sampling=SamplingParams(temperature=1.0, seed=s), speculation=s % 2 == 0) for s in range(6)]
    outs = [mlx.generate(r) for r in reqs] + mlx.generate_batch(reqs)
    outs.append(mlx.generate(reqs[0]).model_copy(update={"tokens": [t for c in mlx.generate_stream(reqs[0])
                                                                     for t in c.tokens]}))
    for res in outs:
        assert mlx.decode(list(output_path(res.tokens, eos))) in CHOICE.choice
        assert res.finish_reason == "stop"


def test_the_plain_path_law_is_a_law_over_complete_outputs(mlx):
    from mtpcheck.fixture import fixture_prompts

    prompt = next(iter(fixture_prompts(mlx).values()))
    req = _req(prompt)
    law = path_law(mlx, prompt, choice_dfa(mlx, req), SamplingParams(temperature=1.0))
    assert abs(sum(law.values()) - 1.0) < 1e-9
    assert {mlx.decode(list(p)) for p in law} == set(CHOICE.choice)
    assert len(law) > len(CHOICE.choice)  # several token paths spell some choices
    with pytest.raises(ValueError, match="temperature alone"):
        path_law(mlx, prompt, choice_dfa(mlx, req), SamplingParams(temperature=1.0, top_k=5))


def test_output_path_drops_only_a_final_end_token():
    assert output_path([5, 6, 0], [0]) == (5, 6)
    assert output_path([5, 6], [0]) == (5, 6)
    assert output_path([0, 6], [0]) == (0, 6)
    assert np.array(output_path([], [0])).size == 0


# -- parallel samples (generate_n, SEED-SAMPLES-INDEPENDENT) ---------------------------


def test_the_references_samples_reproduce_and_differ():
    from mtpcheck.backends import load_backend
    from mtpcheck.backends.reference import child_seed

    toy = Guarded(load_backend("toy"))
    assert toy.capabilities().parallel_samples
    req = GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=16, sampling=SamplingParams(temperature=1.0, seed=5))
    a, b = [r.tokens for r in toy.generate_n(req, 3)], [r.tokens for r in toy.generate_n(req, 3)]
    assert a == b and len({tuple(t) for t in a}) == 3
    # sample i is the solo request under its child seed; no two requests' children share a seed
    solo = toy.generate(req.model_copy(update={"sampling": req.sampling.model_copy(update={"seed": child_seed(5, 1)})}))
    assert solo.tokens == a[1]
    assert {child_seed(5, i) for i in range(4)}.isdisjoint({child_seed(6, i) for i in range(4)})


def test_a_generate_n_that_returns_the_wrong_count_is_garbage():
    from mtpcheck.backends import load_backend
    from mtpcheck.contracts.errors import BackendError

    inner = load_backend("toy")
    inner.generate_n = lambda request, n: [inner.generate(request)]
    req = GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=4, sampling=SamplingParams(temperature=1.0, seed=5))
    with pytest.raises(BackendError, match="n=3"):
        Guarded(inner).generate_n(req, 3)
