"""Capabilities edges (issue 14, items 5 and 8), through real suite runs on a
numpy backend (tests/fakeseeded.py):

- a backend that cannot speculate (max_depth=0, the Capabilities default, or
  no drafter) gets the speculative clauses skipped with the reason; the suite
  never builds a request its capabilities forbid (it built num_draft_tokens=0
  and reported SEED-DETERMINISM FAILED);
- SEED-SPEC-EQUALS-PLAIN excuses a float flip onto the CDF neighbour within
  the precision rule's CDF tolerance (float32 by default), fails it where the
  backend declares the CDF exact, and fails a flip far in the CDF naming the
  position and the tokens;
- a skip names an acceptance-rule value as a value, not as a capability."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtpcheck.contracts import Capabilities
from mtpcheck.machinery.checks import flip_excused, seeded_flip, skip_reason

pytest_plugins = ["pytester"]

FAKE = (Path(__file__).parent / "fakeseeded.py").read_text()


def run_suite(pytester, clauses, *options):
    pytester.makepyfile(fakeseeded=FAKE)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "--pyargs", "mtpcheck.suite", "-p", "no:cacheprovider", "--mtp-backend=fakeseeded:load",
        *[f"--mtp-backend-option={o}" for o in options], f"--mtp-clauses={clauses}", f"--mtp-json={report}", "-rs")
    return json.loads(report.read_text()), result.stdout.str()


@pytest.mark.parametrize("options, why", [
    (["max_depth=0"], "backend cannot speculate: max_depth=0"),
    (["drafters="], "backend cannot speculate: no drafter (mtp_kinds=[])"),
])
def test_a_backend_that_cannot_speculate_is_skipped_with_the_reason(pytester, options, why):
    data, out = run_suite(pytester, "SEED-DETERMINISM,SEED-SPEC-EQUALS-PLAIN,CAP-HONESTY,GREEDY-EQUIV,REPORT-HONEST",
                          *options)
    rows = data["clauses"]
    assert not [c for c, r in rows.items() if r["outcome"] == "failed"], out[-3000:]
    seeds = data["tests"]
    spec = next(t for n, t in seeds.items() if n.endswith("test_same_seed_same_output[spec]"))
    plain = next(t for n, t in seeds.items() if n.endswith("test_same_seed_same_output[plain]"))
    assert (spec["outcome"], spec["message"]) == ("skipped", why)
    assert plain["outcome"] == "passed" and rows["SEED-DETERMINISM"]["outcome"] == "passed"
    for cid in ("SEED-SPEC-EQUALS-PLAIN", "GREEDY-EQUIV"):
        assert rows[cid]["outcome"] == "skipped" and rows[cid]["notes"] == [why], rows[cid]


def test_seeded_float_flip_onto_the_neighbour_is_excused_by_the_precision_rule(pytester):
    data, out = run_suite(pytester, "SEED-SPEC-EQUALS-PLAIN", "flip=near", "tol=0")
    row = data["clauses"]["SEED-SPEC-EQUALS-PLAIN"]
    assert row["outcome"] == "failed", out[-2000:]
    note = row["notes"][0].removeprefix("Failed: ")
    assert note.startswith("position 3: speculative token ") and "!= plain token" in note, note
    assert "CDF tolerance 0," in note

    data, out = run_suite(pytester, "SEED-SPEC-EQUALS-PLAIN", "flip=near")
    row = data["clauses"]["SEED-SPEC-EQUALS-PLAIN"]
    assert row["outcome"] == "passed", out[-2000:]
    flips = [e["seeded_divergence"] for e in row["evidence"] if "seeded_divergence" in e]
    assert flips and all(f["position"] == 3 and f["excused"] and f["interval_gap"] == 0.0 for f in flips)
    assert {"plain_token", "spec_token", "boundary", "uniform"} <= set(flips[0])


def test_a_seeded_divergence_far_in_the_cdf_fails_at_any_tolerance(pytester):
    data, out = run_suite(pytester, "SEED-SPEC-EQUALS-PLAIN", "flip=far")
    row = data["clauses"]["SEED-SPEC-EQUALS-PLAIN"]
    assert row["outcome"] == "failed", out[-2000:]
    note = row["notes"][0].removeprefix("Failed: ")
    assert note.startswith("position 3: speculative token ") and "beyond the CDF tolerance" in note


def test_seeded_flip_with_a_known_uniform():
    law = np.array([0.25, 0.25, 0.5])
    # plain drew token 0 at u = 0.2499; the speculative path took token 1
    near = seeded_flip(law, 0, 1, uniform=0.2499)
    assert near["boundary"] == 0.25 and near["interval_gap"] == 0.0
    assert flip_excused(near, 1e-3)[0]
    assert not flip_excused(near, 0.0)[0]  # the default is exact
    far = seeded_flip(law, 0, 1, uniform=0.1)  # 0.15 from the boundary: no rounding does that
    ok, why = flip_excused(far, 1e-3)
    assert not ok and "uniform 0.1 is 0.15" in why
    jump = seeded_flip(law, 0, 2)  # token 1's mass lies between
    assert jump["interval_gap"] == 0.25 and not flip_excused(jump, 1e-3)[0]
    assert not flip_excused(seeded_flip(np.array([0.5, 0.0, 0.5]), 0, 1), 1e-3)[0]  # zero-mass token


def test_skip_reasons_name_a_rule_value_as_a_value():
    caps = Capabilities(name="x", version="0", vocab_size=4, mtp_kinds=["embedded"], max_depth=2,
                        acceptance_rule="rejection")
    assert skip_reason(caps, ["exact_match", "traces"]) == (
        "clause needs acceptance_rule=exact_match, backend declares 'rejection'; backend lacks capability: traces")
    assert skip_reason(Capabilities(name="x", version="0", vocab_size=4), ["speculation"]) == (
        "backend cannot speculate: no drafter (mtp_kinds=[]), max_depth=0")


def test_traced_uniform_is_the_position_addressed_target_uniform():
    from mtpcheck.backends.toy import load_toy
    from mtpcheck.contracts import GenerationRequest, SamplingParams
    from mtpcheck.engine.sampling import STREAM_TARGET, uniform
    from mtpcheck.machinery.checks import traced_uniform

    backend = load_toy(acceptance="exact_match")
    prompt = [3, 4, 5, 6]
    res = backend.generate(GenerationRequest(prompt_tokens=prompt, max_tokens=12, stop_token_ids=[], trace=True,
                                             sampling=SamplingParams(temperature=1.0, seed=7),
                                             speculation={"num_draft_tokens": 2}))
    assert traced_uniform(res, len(prompt), 0) is None  # the prefill token: no round covers it
    for i in range(1, len(res.tokens)):
        assert traced_uniform(res, len(prompt), i) == uniform(7, STREAM_TARGET, len(prompt) + i)


def test_report_notes_are_cut_at_a_word_boundary():
    from mtpcheck.machinery.report import _clip

    line = "reason='sampling_control_unsupported' with presence_penalty, message=" + "word " * 100
    short = _clip(line, 110)
    assert len(short) <= 110 and short.endswith(" ...") and short.startswith("reason='sampling_control_unsupported'")
    assert short[:-4] == line[: len(short) - 4] and line[len(short) - 4] == " "  # cut before a space: no half word
    assert _clip("short", 110) == "short"


def test_a_depth_fixed_at_launch_is_honoured_not_failed():
    """Capabilities.depths (vLLM, SGLang, one speculative server): requests use
    a depth the backend serves; a clause that needs another depth skips, naming it."""
    from mtpcheck.contracts import Capabilities
    from mtpcheck.machinery.configs import skip_unless_depth, spec_for

    caps = Capabilities(name="fixed", version="0", vocab_size=8, mtp_kinds=["assistant"], max_depth=5, depths=[3, 5])
    assert [spec_for(caps, d)["num_draft_tokens"] for d in (None, 1, 3, 4, 5, 8)] == [3, 3, 3, 3, 5, 5]
    skip_unless_depth(caps, 3)  # served: no skip
    with pytest.raises(pytest.skip.Exception, match=r"needs depth 1; backend serves depths \[3, 5\] only"):
        skip_unless_depth(caps, 1)
    free = caps.model_copy(update={"depths": None})
    assert [spec_for(free, d)["num_draft_tokens"] for d in (None, 1, 4)] == [3, 1, 4]
    skip_unless_depth(free, 1)
