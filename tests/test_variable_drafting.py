"""DIST-EQUIV on a backend that drafts up to k (drafting="up_to_k"): the tokens
emitted where a proposal stood are tested on their own as well
(mtpcheck/suite/test_distribution.py). A confidence-threshold drafter that
decides after the draw (mutant drafter-keeps-confident-draws) biases that
stratum; one that decides from the drafter's law before the draw does not,
and its proposals are the same kind of stratum."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core")

from mtpcheck.backends import load_backend  # noqa: E402
from mtpcheck.contracts import SamplingParams  # noqa: E402
from mtpcheck.engine.draft import MtpDrafter  # noqa: E402
from mtpcheck.fixture import fixture_prompts  # noqa: E402
from mtpcheck.machinery.checks import observations, token_role  # noqa: E402
from mtpcheck.machinery.configs import request  # noqa: E402
from mtpcheck.mutants import load_mutant  # noqa: E402
from mtpcheck.mutants.zoo import with_drafters  # noqa: E402
from mtpcheck.suite.test_distribution import _proposed_at  # noqa: E402

SPEC = {"mode": "native_mtp", "num_draft_tokens": 3}
HOT = SamplingParams(temperature=1.0, seed=11)


class StopsWhereUnconfident:
    """A correct variable drafter: the block ends before a draw whose law is
    unconfident (max q < 0.3), whatever that draw would have been."""

    def draft(self, history, target_len, k, sp, seed, cursor):
        block = super().draft(history, target_len, k, sp, seed, cursor)
        return block.head(next((i for i, q in enumerate(block.probs) if q.max() < 0.3), len(block.tokens)))


def _control():
    b = load_backend("mlx")
    with_drafters(b.engine, StopsWhereUnconfident, only=(MtpDrafter,))
    return b


def _kept_law_mass(backend, prompts):
    """Over sampled runs: how often the round's first proposal was kept, and the
    draft probability of kept proposals (>= 0.3 for the mutant by construction)."""
    kept = []
    for p in prompts:
        res = backend.generate(request(p, 24, HOT, SPEC, stop_token_ids=[], trace=True))
        kept += [float(t.draft_probs[0][t.proposals[0]]) for t in res.trace or [] if t.proposals]
    return kept


def test_the_mutant_keeps_only_confident_draws_and_declares_variable_drafting():
    mutant = load_mutant("drafter-keeps-confident-draws")
    assert mutant.capabilities().drafting == "up_to_k"
    prompts = list(fixture_prompts(mutant).values())[:3]
    kept = _kept_law_mass(mutant, prompts)
    assert kept and min(kept) >= 0.3
    assert min(_kept_law_mass(_control(), prompts)) < 0.3  # the control keeps unconfident draws of confident laws


def test_proposed_stratum_marks_accepted_and_corrected_positions():
    backend = load_mutant("drafter-keeps-confident-draws")
    prompt = list(fixture_prompts(backend).values())[0]
    res = backend.generate(request(prompt, 24, HOT, SPEC, stop_token_ids=[]))
    memo = {("temperature", id(res)): (res, None, [])}
    mask = _proposed_at(backend.capabilities(), "temperature", [(prompt, res)], memo)
    assert len(mask) == len(res.tokens) == len(observations(backend, prompt, [res], HOT))
    roles = [token_role(res, i) for i in range(len(res.tokens))]
    assert list(mask) == [r in ("accepted", "correction") for r in roles]
    assert 0 < mask.sum() < len(mask)  # bonus tokens after dropped proposals stand outside the stratum
