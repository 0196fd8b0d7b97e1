"""The adapter author's reference is generated from the models and cannot
drift (issue 14, item 9); every field has a meaning; the docs state the seed
rules in the project's own words, not as seed documents users do not have."""

from __future__ import annotations

import re
from pathlib import Path

from mtpcheck.contracts import docgen

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_field_of_every_model_has_a_meaning():
    assert docgen.undocumented() == []


def test_the_committed_reference_matches_the_models():
    assert docgen.PAGE.read_text() == docgen.render(), "run `python -m mtpcheck.contracts.docgen`"
    assert docgen.main(["--check"]) == 0


def test_a_new_field_without_a_meaning_fails(monkeypatch):
    from pydantic import create_model

    from mtpcheck.contracts import models

    extended = create_model("Capabilities", __base__=models.Capabilities, brand_new=(int, 0))
    monkeypatch.setattr(docgen, "MODELS", [*docgen.MODELS, (extended, "")])
    assert docgen.undocumented() == ["Capabilities.brand_new"]


def test_adapters_doc_covers_what_an_author_had_to_read_source_for():
    text = (DOCS / "adapters.md").read_text()
    for topic in ("fixture_prompts", "checkpoints()", "stop_token_ids", "FinishEvent", "drafted nothing",
                  "missing", "--mtp-timeout", "worker thread", "repetition_penalty", "top_p", "min_p",
                  "plain decoding path", "context_length", "seed_cdf_tolerance", "logprob_tolerance",
                  "reference/contracts.md", "explain-divergence"):
        assert topic in text, topic
    # the seed documents are the project's sources, not the users': state the rule itself
    for page in [DOCS / "adapters.md", docgen.PAGE, DOCS / "architecture.md", DOCS / "scheduler.md"]:
        assert not re.search(r"seed 00\d", page.read_text(), re.I), f"{page.name} cites a seed document by number"
