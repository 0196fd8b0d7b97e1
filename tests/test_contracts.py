from pathlib import Path

import pydantic
import pytest

from mtpcheck.contracts import GenerationRequest, SpeculationRequest
from mtpcheck.contracts.schemas import render_schemas, schema_drift

SCHEMAS = Path(__file__).resolve().parents[1] / "contracts" / "schemas"


def test_committed_schemas_match_the_models():
    drift = schema_drift(SCHEMAS)
    assert not drift, f"regenerate with `mtpcheck contracts schemas`: drifted {drift}"


def test_schema_drift_is_detected(tmp_path):
    for name, text in render_schemas().items():
        (tmp_path / name).write_text(text)
    assert schema_drift(tmp_path) == []
    (tmp_path / "SamplingParams.schema.json").write_text("{}")
    (tmp_path / "Old.schema.json").write_text("{}")
    assert schema_drift(tmp_path) == ["Old.schema.json", "SamplingParams.schema.json"]


def test_shorthands():
    assert SpeculationRequest.model_validate(True).mode == "native_mtp"
    assert SpeculationRequest.model_validate(False).mode == "off"
    assert GenerationRequest(prompt_tokens=[1], speculation=True).speculation.mode == "native_mtp"
    assert GenerationRequest(prompt_tokens=[1], speculation=False).speculation.mode == "off"
    assert GenerationRequest(prompt_tokens=[1]).speculation is None


@pytest.mark.parametrize("block, field", [
    ({"mode": "fast"}, "mode"),
    ({"num_draft_tokens": 0}, "num_draft_tokens"),
    ({"num_draft_tokens": -2}, "num_draft_tokens"),
    ({"draft_tokens": 3}, "draft_tokens"),
    ({"require_acceleration": "maybe"}, "require_acceleration"),
    ("on", "SpeculationRequest"),
])
def test_malformed_block_raises_naming_the_field(block, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        SpeculationRequest.model_validate(block)


def test_speculation_blockers_list_non_neutral_controls():
    from mtpcheck.contracts import SamplingParams

    assert SamplingParams(repetition_penalty=1.0, presence_penalty=0.0).speculation_blockers() == []
    assert SamplingParams(repetition_penalty=1.1, logit_bias={1: 1.0}).speculation_blockers() == [
        "repetition_penalty", "logit_bias"]
