import pytest

from mtpcheck.contracts import FinishEvent, SamplingParams, StopEvent, TokenEvent
from mtpcheck.machinery.checks import token_role
from mtpcheck.machinery.configs import request, spec_for

GREEDY = SamplingParams(temperature=0.0)


def _plain(backend, prompt, n):
    return backend.generate(request(prompt, n, GREEDY, False, stop_token_ids=[]))


def _published_after_stop(res):
    stop_at = next((i for i, e in enumerate(res.events) if isinstance(e, StopEvent | FinishEvent)), len(res.events))
    return [e for e in res.events[stop_at:] if isinstance(e, TokenEvent)]


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_eos_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, depth):
    depth = min(depth, mtp_capabilities.max_depth)
    for prompt in mtp_fixture.values():
        plain = _plain(mtp_backend, prompt, 32)
        for cut in (2, 5, 9, 17):
            eos = plain.tokens[cut]
            j = plain.tokens.index(eos)
            res = mtp_backend.generate(request(prompt, 32, GREEDY, spec_for(mtp_capabilities, depth), stop_token_ids=[eos]))
            assert res.tokens == plain.tokens[: j + 1], f"EOS {eos} at {j}: got {len(res.tokens)} tokens"
            assert res.finish_reason == "stop"
            assert not _published_after_stop(res), "token events published after the stop"


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_stop_token_at_the_budget_is_a_stop(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, depth):
    """The stop token is also the last token max_tokens allows: the request stopped
    (finish_reason "stop", a stop event), wherever the token fell - inside a block,
    as the bonus, as the correction."""
    depth = min(depth, mtp_capabilities.max_depth)
    roles = {}
    for name, prompt in mtp_fixture.items():
        plain = _plain(mtp_backend, prompt, 24)
        for cut in (1, 4, 9, 15):
            eos = plain.tokens[cut]
            j = plain.tokens.index(eos)
            res = mtp_backend.generate(request(prompt, j + 1, GREEDY, spec_for(mtp_capabilities, depth),
                                               stop_token_ids=[eos]))
            where = f"stop token {eos} at index {j} = max_tokens - 1 (prompt {name}, depth {depth})"
            assert res.tokens == plain.tokens[: j + 1], f"{where}: got {len(res.tokens)} tokens"
            role = token_role(res, j, mtp_capabilities.first_token_from_prefill)
            roles[role] = roles.get(role, 0) + 1
            assert res.finish_reason == "stop", (f"{where}, emitted as {role}: finish_reason={res.finish_reason!r}; "
                                                 "a stop token ends the request as a stop, even at the budget")
            stops = [e for e in res.events if isinstance(e, StopEvent)]
            assert stops or not res.events, f"{where}, emitted as {role}: finish 'stop' but no stop event"
    mtp_record(stop_token_roles=roles)


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.exercise(reason="one request of a few tokens has room for a proposal or two; the stop tests carry the clause's")
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 7, 11])
def test_max_tokens_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, max_tokens):
    prompt = next(iter(mtp_fixture.values()))
    plain = _plain(mtp_backend, prompt, max_tokens)
    res = mtp_backend.generate(request(prompt, max_tokens, GREEDY, spec_for(mtp_capabilities, 4), stop_token_ids=[]))
    assert res.tokens == plain.tokens and len(res.tokens) == max_tokens
    assert res.finish_reason == "length"


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.requires("text")
def test_stop_string_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture):
    inner = getattr(mtp_backend, "backend", mtp_backend)
    checked = 0
    for prompt in mtp_fixture.values():
        plain = _plain(mtp_backend, prompt, 32)
        text = inner.decode(plain.tokens)
        for end in (6, 13, 21):
            stop = text[end - 3 : end]
            if not stop.strip():
                continue
            first = text.find(stop)
            # the shortest token prefix whose text contains the stop string
            n = next(i for i in range(1, len(plain.tokens) + 1) if stop in inner.decode(plain.tokens[:i]))
            res = mtp_backend.generate(request(prompt, 32, GREEDY, spec_for(mtp_capabilities, 4), stop=[stop], stop_token_ids=[]))
            assert res.tokens == plain.tokens[:n], f"stop {stop!r}: {len(res.tokens)} tokens, expected {n}"
            assert res.text == text[:first], f"stop {stop!r}: text must end before the stop string"
            assert res.finish_reason == "stop", f"finish_reason={res.finish_reason!r} after stop {stop!r}, expected 'stop'"
            assert not _published_after_stop(res), f"stop {stop!r}: token events published after the stop"
            checked += 1
    assert checked, "no usable stop string in the fixture outputs"
