import pytest

from mtpcheck.contracts import FinishEvent, SamplingParams, StopEvent, TokenEvent
from mtpcheck.machinery.checks import token_role
from mtpcheck.machinery.configs import request, spec_for, without_speculation

GREEDY = SamplingParams(temperature=0.0)


def _plain(backend, prompt, n):
    return backend.generate(request(prompt, n, GREEDY, False, stop_token_ids=[]))


def _published_after_stop(res):
    stop_at = next((i for i, e in enumerate(res.events) if isinstance(e, StopEvent | FinishEvent)), len(res.events))
    return [e for e in res.events[stop_at:] if isinstance(e, TokenEvent)]


def _judge(backend, req, res, problem, record) -> None:
    """Fail on problem(res), naming the side: the same request with speculation
    off, held to the same rule, tells a speculative fault from the runtime's
    own stop handling (both paths)."""
    why = problem(res)
    if why is None:
        return
    plain = backend.generate(without_speculation(req))
    plain_why = problem(plain)
    side = "both" if plain_why else "speculative"
    record(deviating_side=side, speculative=why, plain=plain_why or "conforms")
    pytest.fail(f"{SIDE_WORDS[side]}: {why}" + (f"; with speculation off: {plain_why}" if plain_why else ""))


SIDE_WORDS = {"speculative": "speculative path deviates (the same request with speculation off conforms)",
              "both": "both paths deviate (not speculative: the same request with speculation off fails the same rule)"}


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_eos_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, depth):
    depth = min(depth, mtp_capabilities.max_depth)
    for prompt in mtp_fixture.values():
        plain = _plain(mtp_backend, prompt, 32)
        for cut in (2, 5, 9, 17):
            eos = plain.tokens[cut]
            j = plain.tokens.index(eos)

            def problem(res, eos=eos, j=j, want=plain.tokens[: j + 1]):
                if res.tokens != want:
                    return f"EOS {eos} at {j}: got {len(res.tokens)} tokens"
                if res.finish_reason != "stop":
                    return f"EOS {eos} at {j}: finish_reason={res.finish_reason!r}, expected 'stop'"
                return "token events published after the stop" if _published_after_stop(res) else None

            req = request(prompt, 32, GREEDY, spec_for(mtp_capabilities, depth), stop_token_ids=[eos])
            _judge(mtp_backend, req, mtp_backend.generate(req), problem, mtp_record)


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
            req = request(prompt, j + 1, GREEDY, spec_for(mtp_capabilities, depth), stop_token_ids=[eos])
            res = mtp_backend.generate(req)
            role = token_role(res, j, mtp_capabilities.first_token_from_prefill) if len(res.tokens) > j else "absent"
            roles[role] = roles.get(role, 0) + 1

            def problem(res, eos=eos, j=j, role=role, name=name, want=plain.tokens[: j + 1]):
                where = f"stop token {eos} at index {j} = max_tokens - 1 (prompt {name}, depth {depth})"
                if res.tokens != want:
                    return f"{where}: got {len(res.tokens)} tokens"
                if res.finish_reason != "stop":
                    return (f"{where}, emitted as {role}: finish_reason={res.finish_reason!r}; a stop token ends the "
                            "request as a stop, even at the budget")
                stops = [e for e in res.events if isinstance(e, StopEvent)]
                return None if stops or not res.events else f"{where}, emitted as {role}: finish 'stop' but no stop event"

            _judge(mtp_backend, req, res, problem, mtp_record)
    mtp_record(stop_token_roles=roles)


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.exercise(reason="one request of a few tokens has room for a proposal or two; the stop tests carry the clause's")
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 7, 11])
def test_max_tokens_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, max_tokens):
    prompt = next(iter(mtp_fixture.values()))
    plain = _plain(mtp_backend, prompt, max_tokens)

    def problem(res):
        if len(res.tokens) != max_tokens or res.tokens != plain.tokens[:max_tokens]:
            return f"max_tokens {max_tokens}: got {len(res.tokens)} tokens, {res.tokens[:6]} vs plain {plain.tokens[:6]}"
        return None if res.finish_reason == "length" else f"finish_reason={res.finish_reason!r}, expected 'length'"

    req = request(prompt, max_tokens, GREEDY, spec_for(mtp_capabilities, 4), stop_token_ids=[])
    _judge(mtp_backend, req, mtp_backend.generate(req), problem, mtp_record)


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.requires("text")
def test_stop_string_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record):
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

            def problem(res, stop=stop, n=n, want=plain.tokens[:n], cut=text[:first]):
                if res.tokens != want:
                    return f"stop {stop!r}: {len(res.tokens)} tokens, expected {n}"
                if res.text != cut:
                    return f"stop {stop!r}: text must end before the stop string"
                if res.finish_reason != "stop":
                    return f"finish_reason={res.finish_reason!r} after stop {stop!r}, expected 'stop'"
                return f"stop {stop!r}: token events published after the stop" if _published_after_stop(res) else None

            req = request(prompt, 32, GREEDY, spec_for(mtp_capabilities, 4), stop=[stop], stop_token_ids=[])
            _judge(mtp_backend, req, mtp_backend.generate(req), problem, mtp_record)
            checked += 1
    assert checked, "no usable stop string in the fixture outputs"
