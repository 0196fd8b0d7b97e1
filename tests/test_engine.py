"""Engine semantics on small random models: stops, EOS, budgets, depth,
plan/report honesty, events, statistics, determinism."""

import pydantic
import pytest

from mtpcheck.contracts import (
    GenerationRequest,
    SamplingParams,
    SpeculationUnavailableError,
    StopEvent,
    TextEvent,
    TokenEvent,
)
from mtpcheck.engine.decode import Engine

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def twin(random_models, char_tokenizer):
    """Target drafting for itself with rejection sampling: every proposal is
    accepted (p/q = 1), so blocks are full and cuts land mid-block."""
    target, _ = random_models
    return Engine(target, target, tokenizer=char_tokenizer, acceptance="rejection",)


@pytest.fixture(scope="module")
def engine(random_models, char_tokenizer):
    target, assistant = random_models
    return Engine(target, assistant, tokenizer=char_tokenizer)


def gen(engine, spec, **kw):
    kw.setdefault("sampling", SamplingParams(temperature=1.0, seed=11))
    return engine.generate(GenerationRequest(prompt_tokens=PROMPT, speculation=spec, trace=True, **kw))


ASSIST3 = {"drafter": "assistant", "num_draft_tokens": 3}


def test_twin_accepts_full_blocks(twin):
    r = gen(twin, ASSIST3, max_tokens=21)
    assert r.speculation.accept_lens[:-1] == [3] * (r.speculation.rounds - 1)


def test_stop_string_inside_an_accepted_block(twin, char_tokenizer):
    plain = gen(twin, ASSIST3, max_tokens=24)
    text = char_tokenizer.decode(plain.tokens)
    # a two-letter stop string whose first occurrence ends mid-block
    for end in range(3, 20):
        if end % 4 not in (0, 1):  # first token + blocks of 4: ends at 1, 5, 9, ... are block ends
            stop = text[end - 2 : end]
            if text.find(stop) == end - 2:
                break
    r = gen(twin, ASSIST3, max_tokens=24, stop=[stop])
    assert r.tokens == plain.tokens[:end]
    assert r.text == text[: end - 2]
    assert r.finish_reason == "stop"
    last = r.trace[-1]
    assert len(last.committed) < last.accepted + 1, "the cut must fall inside an accepted block"
    assert [type(e).__name__ for e in r.events[-2:]] == ["StopEvent", "FinishEvent"]
    assert r.events[-2].matched == stop
    assert all(e.index < end for e in r.events if isinstance(e, TokenEvent))


def test_eos_inside_an_accepted_block(twin):
    plain = gen(twin, ASSIST3, max_tokens=24, stop_token_ids=[])
    j = next(i for i in range(2, 20) if i % 4 not in (0, 1) and plain.tokens[i] not in plain.tokens[:i])
    eos = plain.tokens[j]
    r = gen(twin, ASSIST3, max_tokens=24, stop_token_ids=[eos])
    assert r.tokens == plain.tokens[: j + 1]
    assert r.finish_reason == "stop"
    assert any(isinstance(e, StopEvent) and e.matched == f"eos:{eos}" for e in r.events)
    assert len(r.text) == j  # EOS contributes no text


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 6, 7, 10])
def test_max_tokens_never_exceeded_and_budget_cuts_blocks(twin, max_tokens):
    r = gen(twin, {"drafter": "assistant", "num_draft_tokens": 4}, max_tokens=max_tokens, stop_token_ids=[])
    assert len(r.tokens) == max_tokens and r.finish_reason == "length"
    # no proposal is drafted that the budget could not emit
    emitted = 1
    for drafted in r.speculation.draft_lens:
        assert drafted <= max_tokens - emitted - 1
        emitted += drafted + 1
    if max_tokens == 1:
        assert r.speculation.rounds == 0
    if max_tokens == 2:
        assert r.speculation.draft_lens == [0]  # an empty draft: a plain verification step


def test_depth_one_and_statistics_agree_with_stream(engine):
    for depth in (1, 2, 5):
        r = gen(engine, {"drafter": "mtp", "num_draft_tokens": depth}, max_tokens=30, stop_token_ids=[])
        s = r.speculation
        assert s.used and s.num_draft_tokens == depth
        assert s.drafted == sum(s.draft_lens) and s.accepted == sum(s.accept_lens)
        assert all(0 <= a <= d <= depth for a, d in zip(s.accept_lens, s.draft_lens, strict=True))
        assert len(s.accept_lens) == s.rounds
        assert 1 + s.accepted + s.rounds == len(r.tokens)  # nothing cut: length budget only trims drafts
        assert s.bonus_tokens + s.corrections == s.rounds
        assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)


def test_events_are_the_committed_stream(engine, char_tokenizer):
    r = gen(engine, ASSIST3, max_tokens=25)
    toks = [e for e in r.events if isinstance(e, TokenEvent)]
    assert [e.index for e in toks] == list(range(len(r.tokens)))
    assert [e.token for e in toks] == r.tokens
    assert "".join(e.text for e in r.events if isinstance(e, TextEvent)) == r.text
    assert r.text == char_tokenizer.decode(r.tokens)


@pytest.mark.parametrize("drafter", ["mtp", "assistant"])
def test_exact_match_equals_plain_decoding_under_the_same_seed(random_models, drafter):
    target, assistant = random_models
    e = Engine(target, assistant, acceptance="exact_match")
    for seed in (1, 2, 3):
        sp = SamplingParams(temperature=1.0, top_k=20, seed=seed)
        plain = gen(e, False, sampling=sp, max_tokens=20)
        spec = gen(e, {"drafter": drafter, "num_draft_tokens": 3}, sampling=sp, max_tokens=20)
        assert spec.tokens == plain.tokens
        assert spec.speculation.used and spec.speculation.drafted > 0


@pytest.mark.parametrize("drafter", ["mtp", "assistant"])
@pytest.mark.parametrize("rule", ["rejection", "exact_match"])
def test_greedy_equals_speculation_off(random_models, drafter, rule):
    target, assistant = random_models
    e = Engine(target, assistant, acceptance=rule)
    sp = SamplingParams(temperature=0.0)
    plain = gen(e, False, sampling=sp, max_tokens=20)
    for depth in range(1, 6):
        assert gen(e, {"drafter": drafter, "num_draft_tokens": depth}, sampling=sp, max_tokens=20).tokens == plain.tokens


def test_seeded_determinism(engine):
    a = gen(engine, ASSIST3, max_tokens=20)
    b = gen(engine, ASSIST3, max_tokens=20)
    c = gen(engine, ASSIST3, max_tokens=20, sampling=SamplingParams(temperature=1.0, seed=12))
    assert a.tokens == b.tokens and a.seed == 11
    assert a.tokens != c.tokens


def test_per_call_override_does_not_leak(engine):
    assert gen(engine, {"num_draft_tokens": 5}, max_tokens=12).speculation.num_draft_tokens == 5
    assert gen(engine, None, max_tokens=12).speculation.num_draft_tokens == 3
    assert not gen(engine, False, max_tokens=12).speculation.used
    after = gen(engine, None, max_tokens=12).speculation
    assert after.used and after.drafter == "mtp"


@pytest.mark.parametrize("control", [{"repetition_penalty": 1.3}, {"presence_penalty": 0.5},
                                     {"frequency_penalty": 0.5}, {"logit_bias": {3: 2.0}}])
def test_penalties_give_an_explicit_unaccelerated_outcome(engine, control):
    sp = SamplingParams(temperature=1.0, seed=5, **control)
    r = gen(engine, True, sampling=sp, max_tokens=15)
    s = r.speculation
    assert s.requested and not s.used and s.reason == "sampling_control_unsupported"
    assert next(iter(control)) in s.message
    assert r.tokens == gen(engine, False, sampling=sp, max_tokens=15).tokens
    # the control is honoured, not dropped
    assert r.tokens != gen(engine, False, sampling=SamplingParams(temperature=1.0, seed=5), max_tokens=15).tokens
    with pytest.raises(SpeculationUnavailableError, match="sampling_control_unsupported"):
        gen(engine, {"require_acceleration": True}, sampling=sp, max_tokens=15)


def test_missing_drafter_is_named(random_models):
    target, _ = random_models
    e = Engine(target)
    r = gen(e, {"drafter": "assistant"}, max_tokens=5)
    assert not r.speculation.used and r.speculation.reason == "drafter_unavailable"
    with pytest.raises(SpeculationUnavailableError, match="drafter_unavailable"):
        gen(e, {"drafter": "assistant", "require_acceleration": True}, max_tokens=5)
    with pytest.raises(SpeculationUnavailableError, match="depth_exceeds_capability"):
        gen(e, {"num_draft_tokens": 99, "require_acceleration": True}, max_tokens=5)


@pytest.mark.parametrize("bad, field", [
    ({"prompt_tokens": []}, "prompt_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"sampling": {"temperature": -1}}, "temperature"),
    ({"sampling": {"top_p": 0}}, "top_p"),
    ({"speculation": {"num_draft_tokens": 0}}, "num_draft_tokens"),
    ({"speculation": {"mode": "turbo"}}, "mode"),
    ({"speculation": {"depth": 3}}, "depth"),
    ({"temperature": 1}, "temperature"),
])
def test_bad_requests_name_the_field(bad, field):
    data = {"prompt_tokens": [1, 2], **bad}
    with pytest.raises(pydantic.ValidationError, match=field):
        GenerationRequest.model_validate(data)


def test_bad_requests_caught_by_the_engine(engine, random_models):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate(GenerationRequest(prompt_tokens=[1, 10_000]))
    with pytest.raises(ValueError, match="drafter"):
        gen(engine, {"drafter": "oracle"}, max_tokens=3)
    with pytest.raises(ValueError, match="tokenizer"):
        Engine(random_models[0]).generate(GenerationRequest(prompt_tokens=[1], stop=["x"]))
