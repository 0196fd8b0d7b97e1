"""`mtpcheck explain-divergence` (issue 14, item 10): an engineered near-tie
is called a near-tie, with its gap in nats and ulps; a zoo mutant's greedy
divergence is structural; identical outputs say so; bad input is one line,
exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mtpcheck.cli import main
from mtpcheck.machinery.triage import explain_divergence, ulps

HERE = Path(__file__).parent


@pytest.fixture
def tie(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    import faketie

    return faketie


def test_an_engineered_near_tie_is_a_near_tie(tie):
    r = explain_divergence(tie.load(gap="1e-4"), [1, 2, 3], max_tokens=10)
    assert (r.verdict, r.position) == ("near-tie", tie.FLIP_AT)
    assert r.pair_logit_gap == pytest.approx(1e-4, rel=1e-6) and r.top2_logit_gap == pytest.approx(1e-4, rel=1e-6)
    assert [c.token for c in r.top5[:2]] == [r.plain_token, r.spec_token] and len(r.top5) == 5
    # float16 spacing below |logit| 32 (the default logit_scale) is 2^-6: 1e-4 nats is 0.0064 ulps
    assert r.pair_gap_ulps == pytest.approx(1e-4 / 2**-6, rel=1e-6) and r.logit_dtype == "float16"
    assert "inside the precision rule's logit gap 0.0625" in r.evidence and "4 ulps of float16" in r.evidence


def test_the_same_flip_beyond_the_tolerance_is_structural(tie):
    r = explain_divergence(tie.load(gap="2.0"), [1, 2, 3], max_tokens=10)
    assert (r.verdict, r.position) == ("structural", tie.FLIP_AT)
    assert r.pair_logit_gap == pytest.approx(2.0, rel=1e-6)


def test_cli_json_and_exit_codes(tie, capsys):
    args = ["explain-divergence", "--backend", "faketie:load", "--prompt-ids", "1,2,3", "--max-tokens", "10"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "near-tie" and data["position"] == tie.FLIP_AT and len(data["top5"]) == 5
    assert main(args + ["--backend-option", "gap=2"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("verdict: structural:") and f"first divergence at output position {tie.FLIP_AT}" in out


def test_no_divergence_says_so_and_exits_0(tie, capsys):
    # max_tokens stops before the flip
    assert main(["explain-divergence", "--backend", "faketie:load", "--prompt-ids", "1 2 3", "--max-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("verdict: no-divergence: outputs are identical")


@pytest.mark.parametrize("extra, message", [
    (["--prompt-ids", "1,x"], "is not a list of token ids"),
    (["--prompt-ids", "1,2,500"], "outside the vocabulary of size 50"),
    (["--prompt", "hello"], "has no tokenizer; pass --prompt-ids"),
    (["--prompt-ids", "1", "--max-tokens", "0"], "must be >= 1"),
    (["--prompt-ids", "1", "--prompt", "x"], "not allowed with argument"),
    (["--prompt-ids", ",".join(["1"] * 65)], "65 tokens exceed the context length 64"),
])
def test_bad_input_is_one_line_exit_2(tie, capsys, extra, message):
    try:  # argparse errors exit, the command's own return 2
        code = main(["explain-divergence", "--backend", "faketie:load", *extra])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtpcheck: error:") and message in err and "\n" not in err


@pytest.mark.slow
def test_a_zoo_mutant_diverges_structurally(capsys):
    code = main(["explain-divergence", "--backend", "mtpcheck.mutants:load_mutant", "--backend-option",
                 "name=target-rows-shifted", "--prompt-ids", "5,9,12,30,7", "--max-tokens", "24", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["verdict"] == "structural" and data["speculation_used"]
    assert data["pair_logit_gap"] > data["near_tie_logit_gap"] and data["position"] is not None


def test_ulps():
    # counted in the largest binade below the magnitude: [0.5, 1) for 1.0, [4, 8) for 8.0
    assert ulps(2.0**-24, "float32", 1.0) == 1.0
    assert ulps(2.0**-10 * 4, "float16", 8.0) == 1.0
    assert math.isclose(ulps(0.03, "float16", 8.0), 0.03 / 2**-8)
