"""Checks of the OpenVINO GenAI adapter (mtpcheck/backends/openvino_backend.py).
Without openvino: the registry entry, the options, the error naming the extra,
the runtime's processing order. With it: the IR export computes the source
model, the ground truth follows the plain path, a runtime error is re-raised
named and the pipeline rebuilt. The conformance suite proper runs it with
`pytest --pyargs mtpcheck.suite --mtp-backend=openvino` (docs/backends/openvino.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams

HAVE_OV = all(importlib.util.find_spec(m) is not None for m in ("openvino", "openvino_genai"))
HAVE_EXPORT = HAVE_OV and all(importlib.util.find_spec(m) is not None
                              for m in ("torch", "transformers", "optimum", "openvino_tokenizers"))
needs_ov = pytest.mark.skipif(not HAVE_EXPORT, reason="openvino-genai / optimum-intel not installed "
                                                      "(pip install 'mtpcheck[openvino]')")


def test_registered_and_importable_without_openvino():
    from mtpcheck.backends import BUILTINS

    assert BUILTINS["openvino"] == "mtpcheck.backends.openvino_backend:load_openvino"
    code = "import sys, mtpcheck.backends.openvino_backend; print([m for m in ('openvino', 'openvino_genai', 'torch') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_options_are_checked():
    from mtpcheck.backends import check_backend_options, load_backend, resolve_factory
    from mtpcheck.contracts import SettingsError

    with pytest.raises(SettingsError, match="has no option 'nope'"):
        check_backend_options("openvino", resolve_factory("openvino"), {"nope": "1"})
    with pytest.raises(Exception, match="config='bogus'"):
        load_backend("openvino", {"config": "bogus"})
    with pytest.raises(Exception, match="precision='fp8'"):
        load_backend("openvino", {"precision": "fp8"})


def test_a_missing_extra_names_it(monkeypatch):
    from mtpcheck.backends.openvino_backend import load_openvino

    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'mtpcheck\[openvino\]'"):
        load_openvino()


def test_the_runtime_order_of_penalties_and_filters():
    """Presence / frequency penalties push a negative logit up (the runtime's
    sign rule) and count the output only; top-p keeps the token where the sum
    first exceeds top_p."""
    from mtpcheck.backends.openvino_backend import ov_law, penalised

    raw = np.array([2.0, -1.0, 0.5, -3.0])
    x = penalised(raw, SamplingParams(presence_penalty=0.5), prompt=[0], output=[1, 2])
    assert x.tolist() == [2.0, -0.5, 0.0, -3.0]
    x = penalised(raw, SamplingParams(frequency_penalty=1.0), prompt=[], output=[3, 3])
    assert x.tolist() == [2.0, -1.0, 0.5, -1.0]
    x = penalised(raw, SamplingParams(repetition_penalty=2.0), prompt=[0], output=[1])
    assert x.tolist() == [1.0, -2.0, 0.5, -3.0]
    p = ov_law(np.log(np.array([0.5, 0.3, 0.15, 0.05])), SamplingParams(temperature=1.0, top_p=0.8), [], [])
    assert np.count_nonzero(p) == 3 and abs(p.sum() - 1) < 1e-12  # 0.5 + 0.3 = 0.8 is not > 0.8
    p = ov_law(raw, SamplingParams(temperature=1.0, top_k=2), [], [])
    assert np.nonzero(p)[0].tolist() == [0, 2]
    assert ov_law(raw, SamplingParams(temperature=0.0), [], []).tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def ov():
    from mtpcheck.backends.openvino_backend import load_openvino

    return load_openvino()


@needs_ov
def test_the_ir_computes_the_source_model(ov):
    """The float32 IR through openvino.Core gives torch's float32 logits of the
    source checkpoint, teacher-forced on every fixture prompt."""
    import torch
    from transformers import LlamaForCausalLM

    from mtpcheck.fixture import fixture_prompts

    for role, folder in ov.sources.items():
        hf = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True).eval()
        ir = ov.target_ir if role == "target" else ov.draft_ir
        import openvino

        compiled = openvino.Core().compile_model(str(ir / "openvino_model.xml"), "CPU", ov.props)
        from mtpcheck.backends.openvino_backend import CorePath

        path = CorePath(compiled)
        worst = 0.0
        for prompt in fixture_prompts(ov).values():
            cont = list(prompt[-4:]) * 3
            got = path.logits(prompt, cont)
            with torch.no_grad():
                ref = hf(input_ids=torch.tensor([list(prompt) + cont[:-1]])).logits[0, len(prompt) - 1:].double().numpy()
            worst = max(worst, float(np.max(np.abs(got - ref))))
        assert worst < 1e-3, (role, worst)  # float32 logits of magnitude ~10: a few hundred ulps of summation order


@needs_ov
def test_greedy_plain_decoding_is_the_ground_truth_argmax(ov):
    from mtpcheck.fixture import fixture_prompts

    for prompt in list(fixture_prompts(ov).values())[:3]:
        for spec in (False, True):
            res = ov.generate(GenerationRequest(prompt_tokens=prompt, max_tokens=24, stop_token_ids=[],
                                                sampling=SamplingParams(temperature=0.0), speculation=spec))
            law = ov.target_distributions(prompt, res.tokens, SamplingParams(temperature=0.0))
            assert [int(r.argmax()) for r in law] == res.tokens
            if spec:
                s = res.speculation
                assert s.used and len(res.tokens) == 1 + s.rounds + s.accepted


@needs_ov
def test_a_runtime_error_is_raised_named_and_the_pipeline_rebuilt(ov):
    from mtpcheck.backends.openvino_backend import OpenVINORuntimeError

    class Broken:
        def get_generation_config(self):
            return ov.plain.get_generation_config()

        def generate(self, *args):
            raise RuntimeError("Check 'content_length <= prompt_ids.size()' failed at sequence_group.cpp:32")

    before = len(ov.errors)
    ov.spec = Broken()
    req = GenerationRequest(prompt_tokens=[5, 6, 7, 8], max_tokens=8, sampling=SamplingParams(temperature=0.0))
    with pytest.raises(OpenVINORuntimeError, match="content_length.*pipeline rebuilt"):
        ov.generate(req)
    assert not isinstance(ov.spec, Broken) and len(ov.errors) == before + 1
    assert ov.generate(req).speculation.used
    assert f"runtime errors so far: {before + 1}" in ov.capabilities().notes
