"""STOP-IN-BLOCK aims its stops and budgets at tokens the backend's own drafter
had accepted inside a block (mtpcheck/suite/test_stops.py): the aim lands
inside a block, a correct backend passes there, and the B10 mutant that
publishes the rest of the block is caught there and only there."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core")

from mtpcheck.backends.toy import load_toy  # noqa: E402
from mtpcheck.machinery.checks import token_role  # noqa: E402
from mtpcheck.mutants import load_mutant  # noqa: E402
from mtpcheck.suite.test_stops import GREEDY, LONG, _aimed, _published_after_stop, request  # noqa: E402

PROMPT = [24, 29, 46, 35, 30, 26, 26, 44, 13, 39, 32, 0]  # fixture prompt ids1: five first tokens inside blocks
SPEC = {"mode": "native_mtp", "num_draft_tokens": 3}


def _outputs(backend):
    plain = backend.generate(request(PROMPT, LONG, GREEDY, False, stop_token_ids=[]))
    probe = backend.generate(request(PROMPT, LONG, GREEDY, SPEC, stop_token_ids=[]))
    return plain, probe


def test_aimed_stops_land_inside_accepted_blocks():
    backend = load_toy(twin="1", drafter="assistant")  # the target drafts for itself: every block accepted
    plain, probe = _outputs(backend)
    aimed = _aimed(probe, plain, True, 2)
    assert len(aimed) == 2
    for j in aimed:
        res = backend.generate(request(PROMPT, LONG, GREEDY, SPEC, stop_token_ids=[plain.tokens[j]]))
        assert token_role(res, j) == "accepted" and res.tokens == plain.tokens[: j + 1]
        assert not _published_after_stop(res)


def test_the_mutant_is_caught_at_an_aimed_stop_only():
    backend = load_mutant("publishes-after-stop-in-block", twin="1", drafter="assistant")
    plain, probe = _outputs(backend)
    j = _aimed(probe, plain, True, 2)[0]
    res = backend.generate(request(PROMPT, LONG, GREEDY, SPEC, stop_token_ids=[plain.tokens[j]]))
    assert res.tokens == plain.tokens[: j + 1]  # the result is cut right; the events are not
    assert _published_after_stop(res)
    # a stop the round ends with (speculation off: every token is its round's last) publishes nothing past it
    off = backend.generate(request(PROMPT, LONG, GREEDY, False, stop_token_ids=[plain.tokens[j]]))
    assert not _published_after_stop(off)


def test_aimed_budgets_leave_no_overshoot():
    backend = load_toy(twin="1", drafter="assistant")
    plain, probe = _outputs(backend)
    for j in _aimed(probe, plain, True, 2, unique=False, below=12):
        res = backend.generate(request(PROMPT, j + 1, GREEDY, SPEC, stop_token_ids=[]))
        assert res.tokens == plain.tokens[: j + 1] and res.finish_reason == "length"
