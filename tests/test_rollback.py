"""Rollback: after every round, caches equal a fresh prefill of the committed
tokens (incl. the recurrent GLA state, restored from checkpoints), and the
last emitted token (bonus or correction) is left uncached."""

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.engine import cache as cache_mod
from mtpcheck.engine.decode import Engine
from mtpcheck.engine.invariants import cache_problems


def run_checked(engine, strict=False, **kw):
    problems, rounds = [], []

    def observer(snap):
        rounds.append(snap.round)
        found = [f"round {snap.round}: {p}" for p in cache_problems(engine, snap)]
        if strict and found:
            raise AssertionError(found[0])
        problems.extend(found)

    req = GenerationRequest(prompt_tokens=[3, 1, 4, 1, 5], max_tokens=kw.pop("max_tokens", 24), **kw)
    result = engine.generate(req, observer=observer)
    return result, problems, rounds


@pytest.mark.parametrize("drafter", ["mtp", "assistant"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("rule", ["rejection", "exact_match"])
def test_caches_equal_fresh_prefill_after_every_round(random_models, drafter, temperature, rule):
    target, assistant = random_models
    # assistant = target's twin gives long accepted blocks, so rollback is exercised at every depth
    engine = Engine(target, assistant if drafter == "assistant" else None, acceptance=rule)
    for depth in (1, 3):
        result, problems, rounds = run_checked(
            engine,
            sampling=SamplingParams(temperature=temperature, seed=7),
            speculation={"drafter": drafter, "num_draft_tokens": depth},
        )
        assert result.speculation.used and result.speculation.rounds >= 3
        assert not problems, problems[:5]


def test_full_acceptance_leaves_bonus_uncached(random_models):
    target, _ = random_models
    engine = Engine(target, target)  # the target drafting for itself accepts everything at T=0
    result, problems, _ = run_checked(
        engine,
        sampling=SamplingParams(temperature=0.0),
        speculation={"drafter": "assistant", "num_draft_tokens": 3},
    )
    assert result.speculation.accept_lens[:-1] == [3] * (len(result.speculation.accept_lens) - 1)
    assert result.speculation.bonus_tokens >= 4
    assert not problems, problems[:5]


def test_checker_catches_a_cache_not_rolled_back(random_models, monkeypatch):
    """The check can fail: an engine whose target trim is a no-op (B08)."""
    import mtpcheck.engine.round as round_

    target, assistant = random_models
    engine = Engine(target, assistant, acceptance="rejection")
    monkeypatch.setattr(round_, "trim_cache", lambda cache, n: None)
    with pytest.raises(AssertionError, match="target cache length"):
        run_checked(
            engine,
            strict=True,
            sampling=SamplingParams(temperature=1.0, seed=3),
            speculation={"drafter": "assistant", "num_draft_tokens": 3},
        )


def test_checker_catches_a_recurrent_state_not_restored(random_models, monkeypatch):
    """Trimming KV caches but leaving the GLA state advanced is caught."""
    target, assistant = random_models
    engine = Engine(target, assistant)
    real = cache_mod.RecurrentCache.trim_to

    def keep_state(self, length):
        state = self.state
        real(self, length)
        self.state = state  # the rejected suffix stays folded into the state

    monkeypatch.setattr(cache_mod.RecurrentCache, "trim_to", keep_state)
    _, problems, _ = run_checked(
        engine,
        sampling=SamplingParams(temperature=1.0, seed=3),
        speculation={"drafter": "assistant", "num_draft_tokens": 3},
    )
    assert any("target" in p for p in problems)


def test_checker_catches_a_draft_cache_with_speculative_entries(random_models, monkeypatch):
    from mtpcheck.engine.draft import MtpDrafter

    target, _ = random_models
    engine = Engine(target)
    monkeypatch.setattr(MtpDrafter, "after_verify", lambda self, before, after, hidden: self.observe(before, hidden[: after - before]))
    with pytest.raises(AssertionError, match="speculative entries remain|mtp draft"):
        run_checked(
            engine,
            strict=True,
            sampling=SamplingParams(temperature=1.0, seed=3),
            speculation={"drafter": "mtp", "num_draft_tokens": 3},
        )
