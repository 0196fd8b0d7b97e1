import pytest

from mtpcheck.contracts import FinishEvent, SamplingParams, StopEvent, TokenEvent
from mtpcheck.machinery.checks import near_tie_divergence, token_role
from mtpcheck.machinery.configs import request, spec_for, without_speculation

GREEDY = SamplingParams(temperature=0.0)


LONG = 32  # tokens of the greedy outputs every stop and budget is cut from
BUDGET_MAX = 12  # budgets aimed inside accepted blocks stay this short


class _Greedy:
    """Each prompt's greedy output without stops, computed once for the module:
    the plain one every stop and budget is cut from, and a speculative probe per
    depth, whose report shows where the backend's own drafter had proposals
    accepted."""

    def __init__(self, backend, prompts):
        self.backend, self.prompts, self.memo = backend, prompts, {}

    def plain(self, name):
        return self._get(name, False)

    def probe(self, name, spec):
        return self._get(name, spec)

    def _get(self, name, spec):
        key = (name, spec and spec["num_draft_tokens"])
        if key not in self.memo:
            self.memo[key] = self.backend.generate(request(self.prompts[name], LONG, GREEDY, spec, stop_token_ids=[]))
        return self.memo[key]


@pytest.fixture(scope="module")
def ending_prompts(mtp_backend):
    from mtpcheck.fixture import ending_prompts

    return ending_prompts(mtp_backend)


@pytest.fixture(scope="module")
def greedy_outputs(mtp_backend, mtp_fixture, ending_prompts):
    return _Greedy(mtp_backend, {**mtp_fixture, **ending_prompts})


def _published_after_stop(res):
    """Token events past the stop: after the stop event, or for tokens the result
    does not hold (a block published before the stop rule cut it)."""
    stop_at = next((i for i, e in enumerate(res.events) if isinstance(e, StopEvent | FinishEvent)), len(res.events))
    late = [e for e in res.events[stop_at:] if isinstance(e, TokenEvent)]
    return late or [e for e in res.events if isinstance(e, TokenEvent) and e.index >= len(res.tokens)]


def _judge(backend, req, res, problem, record, want: list[int]) -> None:
    """Fail on problem(res), naming the side: the same request with speculation
    off, held to the same rule, tells a speculative fault from the runtime's
    own stop handling (both paths). An output that leaves `want` (the greedy
    output the stop or budget was cut from) at a near-tie is not judged: its
    history is another from there (the flip is counted, as GREEDY-EQUIV's)."""
    why = problem(res)
    if why is None:
        return
    tie = near_tie_divergence(backend, backend.capabilities(), req.prompt_tokens, want, res.tokens)
    if tie is not None:
        record(near_tie_not_judged={**tie, "problem": why})
        return
    plain = backend.generate(without_speculation(req))
    plain_why = problem(plain)
    side = "both" if plain_why else "speculative"
    record(deviating_side=side, speculative=why, plain=plain_why or "conforms")
    pytest.fail(f"{SIDE_WORDS[side]}: {why}" + (f"; with speculation off: {plain_why}" if plain_why else ""))


def _aimed(probe, plain, first_token_from_prefill: bool, most: int, unique: bool = True, below: int = LONG) -> list[int]:
    """Up to `most` output indices (spread over the probe) of tokens that were
    accepted proposals in the speculative probe, where the probe agrees with the
    plain output up to them and (unique) the token occurs there first: a stop
    or budget there cuts an accepted block, for any runtime whose greedy
    speculation repeats itself. Found from the report alone (accept_lens)."""
    s, lead = probe.speculation, int(first_token_from_prefill)
    if not s.used:
        return []
    found, start = [], lead
    for a in s.accept_lens:
        found += range(start, start + a)
        start += a + 1
    found = [i for i in found if i + 1 < min(len(probe.tokens), len(plain.tokens), below)
             and probe.tokens[: i + 2] == plain.tokens[: i + 2]
             and (not unique or plain.tokens.index(plain.tokens[i]) == i)]
    return found if len(found) <= most else [found[round(k * (len(found) - 1) / max(most - 1, 1))] for k in range(most)]


def _inside_a_block(res, i: int, first_token_from_prefill: bool) -> bool:
    """Output token i was an accepted proposal (not a round's bonus or correction),
    as the report places it: the round had more to emit after it."""
    return len(res.tokens) > i and token_role(res, i, first_token_from_prefill) == "accepted"


def _ends_at_stop(where: str, want: list[int]):
    """The problem of a result that must be exactly `want`, ending on its stop
    token: finish 'stop' and nothing published after the stop."""
    def problem(res):
        if res.tokens != want:
            after = res.tokens[len(want):] if res.tokens[: len(want)] == want else None
            return (f"{where}: got {len(res.tokens)} tokens, expected {len(want)}"
                    + (f"; {len(after)} emitted after the stop: {after[:8]}" if after else ""))
        if res.finish_reason != "stop":
            return f"{where}: finish_reason={res.finish_reason!r}, expected 'stop'"
        return f"{where}: token events published after the stop" if _published_after_stop(res) else None
    return problem


def _judged_stop(backend, req, j: int, first: bool, problem, roles: dict, record, want: list[int]) -> int:
    """Serve req, count the role of output token j, judge it; 1 when the stop
    fell inside an accepted block."""
    res = backend.generate(req)
    role = token_role(res, j, first) if len(res.tokens) > j else "absent"
    roles[role] = roles.get(role, 0) + 1
    _judge(backend, req, res, problem, record, want)
    return int(_inside_a_block(res, j, first))


SIDE_WORDS = {"speculative": "speculative path deviates (the same request with speculation off conforms)",
              "both": "both paths deviate (not speculative: the same request with speculation off fails the same rule)"}


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_eos_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, greedy_outputs, depth):
    """A stop token ends the output at its first occurrence. Besides fixed cuts,
    the stop is aimed inside accepted blocks: at tokens that the backend's own
    drafter proposed and the target accepted in a probe without stops, so a
    runtime that emits the rest of such a block is seen whatever its drafter."""
    depth = min(depth, mtp_capabilities.max_depth)
    spec = spec_for(mtp_capabilities, depth)
    first = mtp_capabilities.first_token_from_prefill
    inside, roles = 0, {}
    for name, prompt in mtp_fixture.items():
        plain = greedy_outputs.plain(name)
        cuts = sorted({2, 9} | set(_aimed(greedy_outputs.probe(name, spec), plain, first, 2)))
        for cut in cuts:
            eos = plain.tokens[cut]
            j = plain.tokens.index(eos)
            want = plain.tokens[: j + 1]
            problem = _ends_at_stop(f"EOS {eos} at {j} (prompt {name}, depth {depth})", want)
            req = request(prompt, LONG, GREEDY, spec, stop_token_ids=[eos])
            inside += _judged_stop(mtp_backend, req, j, first, problem, roles, mtp_record, want)
    # exercise evidence: how many stops fell inside an accepted block (an accepted
    # proposal with the rest of its round after it: what a B10 runtime emits)
    mtp_record(stop_token_roles=roles, stops_inside_accepted_block=inside)


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_model_eos_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, ending_prompts,
                                      greedy_outputs, depth):
    """The model's own end-of-sequence token (a request without stop_token_ids)
    ends the output at its first occurrence. Wherever the greedy output without
    stops holds the model's EOS - the fixture's document endings (the target
    emits its EOS a few tokens on and the drafter proposes it with the next
    document's start after it) and any suite prompt - the EOS lands inside
    accepted blocks, where a runtime that checks the model's EOS apart from
    the request's stop tokens (on a round's last token) emits the rest."""
    eos = set(mtp_capabilities.eos_token_ids)
    if not eos:
        pytest.skip("backend declares no EOS token (Capabilities.eos_token_ids)")
    depth = min(depth, mtp_capabilities.max_depth)
    spec = spec_for(mtp_capabilities, depth)
    first = mtp_capabilities.first_token_from_prefill
    roles, inside = {}, 0
    for name, prompt in {**mtp_fixture, **ending_prompts}.items():
        plain = greedy_outputs.plain(name)
        j = next((i for i, t in enumerate(plain.tokens) if t in eos), None)
        if j is None or j < first:  # no EOS within LONG greedy tokens, or the prefill's token: no round to judge
            unjudged = "not reached" if j is None else "prefill"
            roles[unjudged] = roles.get(unjudged, 0) + 1
            continue
        where, want = f"model EOS {plain.tokens[j]} at {j} (prompt {name}, depth {depth}, no stop_token_ids)", plain.tokens[: j + 1]
        inside += _judged_stop(mtp_backend, request(prompt, LONG, GREEDY, spec), j, first, _ends_at_stop(where, want),
                               roles, mtp_record, want)
    # exercise evidence: the model's EOS as an accepted proposal, more of its round after it
    mtp_record(eos_roles=roles, eos_inside_accepted_block=inside)
    if sum(n for r, n in roles.items() if r not in ("not reached", "prefill")) == 0:
        pytest.skip(f"no prompt's greedy output holds the model's EOS past the prefill's token within {LONG} tokens "
                    f"({roles}): nothing of a round to judge")


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_stop_token_at_the_budget_is_a_stop(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, greedy_outputs, depth):
    """The stop token is also the last token max_tokens allows: the request stopped
    (finish_reason "stop", a stop event), wherever the token fell - inside a block,
    as the bonus, as the correction."""
    depth = min(depth, mtp_capabilities.max_depth)
    roles = {}
    for name, prompt in mtp_fixture.items():
        plain = greedy_outputs.plain(name)
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

            _judge(mtp_backend, req, res, problem, mtp_record, plain.tokens[: j + 1])
    mtp_record(stop_token_roles=roles)


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.exercise(reason="budgets of a few tokens have room for a proposal or two; the probe that aims them and "
                             "the stop tests carry the clause's exercise")
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_max_tokens_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, greedy_outputs, depth):
    """max_tokens ends the output exactly, on every prompt: at a few small
    budgets, and at budgets aimed inside accepted blocks (the last allowed token
    one the drafter proposed and the target accepted in a probe), where a
    runtime that commits whole blocks overshoots."""
    depth = min(depth, mtp_capabilities.max_depth)
    spec = spec_for(mtp_capabilities, depth)
    first = mtp_capabilities.first_token_from_prefill
    inside = 0
    for name, prompt in mtp_fixture.items():
        plain = greedy_outputs.plain(name)
        probe = greedy_outputs.probe(name, spec)
        aimed = _aimed(probe, plain, first, 2, unique=False, below=BUDGET_MAX)
        inside += len(aimed)
        for max_tokens in sorted({1, 2, 4} | {j + 1 for j in aimed}):
            want = plain.tokens[:max_tokens]

            def problem(res, n=max_tokens, want=want, name=name):
                where = f"max_tokens {n} (prompt {name}, depth {depth})"
                if res.tokens != want:
                    return f"{where}: got {len(res.tokens)} tokens, {res.tokens[:6]} vs plain {want[:6]}"
                return None if res.finish_reason == "length" else \
                    f"{where}: finish_reason={res.finish_reason!r}, expected 'length'"

            req = request(prompt, max_tokens, GREEDY, spec, stop_token_ids=[])
            _judge(mtp_backend, req, mtp_backend.generate(req), problem, mtp_record, want)
    # exercise evidence: budgets that cut a block the probe had accepted whole
    # (a runtime that does not cut its blocks to the budget overshoots there)
    mtp_record(budgets_inside_accepted_block=inside)


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.requires("text")
def test_stop_string_ends_output_exactly(mtp_backend, mtp_capabilities, mtp_fixture, mtp_record, greedy_outputs):
    inner = getattr(mtp_backend, "backend", mtp_backend)
    eos, checked = set(mtp_capabilities.eos_token_ids), 0
    for name, prompt in mtp_fixture.items():
        plain = greedy_outputs.plain(name)
        text = inner.decode(plain.tokens)
        # stop strings from the text before any special token: runtimes match stops on text without
        # them, and a decode that keeps them would offer 'ext' out of '<|endoftext|>'
        ordinary = len(inner.decode(plain.tokens[: next((i for i, t in enumerate(plain.tokens) if t in eos),
                                                         len(plain.tokens))]))
        for end in (6, 13, 21):
            stop = text[end - 3 : end]
            if not stop.strip() or end > ordinary:
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
            _judge(mtp_backend, req, mtp_backend.generate(req), problem, mtp_record, plain.tokens)
            checked += 1
    assert checked, "no usable stop string in the fixture outputs"


@pytest.mark.contract("STOP-IN-BLOCK")
@pytest.mark.requires("text")
def test_stop_string_is_matched_on_the_declared_text(mtp_backend, mtp_capabilities, mtp_fixture, ending_prompts,
                                                     mtp_record, greedy_outputs):
    """A stop string aimed inside the model's EOS text ('|endoftext|' of
    '<|endoftext|>'), with no stop_token_ids, so the EOS alone ends nothing:
    a runtime that matches stop strings on text with special tokens
    (declared stop_text="special_tokens_kept") stops at the EOS; one that
    matches on text without them ("special_tokens_skipped") runs on to its
    budget. Output that matches the other convention, or neither, fails."""
    caps, inner = mtp_capabilities, getattr(mtp_backend, "backend", mtp_backend)
    if caps.stop_text is None:
        pytest.skip("backend does not declare stop_text (Capabilities.stop_text): text with or without special "
                    "tokens is accepted, and no stop string is aimed at one")
    eos, checked = set(caps.eos_token_ids), 0
    for name, prompt in {**mtp_fixture, **ending_prompts}.items():
        plain = greedy_outputs.plain(name)
        j = next((i for i, t in enumerate(plain.tokens) if t in eos), None)
        if j is None:
            continue
        special = inner.decode([plain.tokens[j]])
        stop, budget = special[1:-1] if len(special) > 2 else special, min(len(plain.tokens), j + 6)
        skipped = [t for t in plain.tokens[:budget] if t not in eos]
        if not stop.strip() or stop in inner.decode(plain.tokens[:j]) or stop in inner.decode(skipped):
            continue  # the stop string is not aimed at the special token alone
        want = {"special_tokens_kept": (plain.tokens[: j + 1], "stop"),
                "special_tokens_skipped": (plain.tokens[:budget], "length")}

        def problem(res, name=name, j=j, stop=stop, want=want):
            got = [k for k, (toks, finish) in want.items() if res.tokens == toks and res.finish_reason == finish]
            if got == [caps.stop_text]:
                return None
            seen = f"behaves as {got[0]}" if got else (f"{len(res.tokens)} tokens, finish_reason "
                                                       f"{res.finish_reason!r}: neither convention")
            return (f"stop {stop!r} inside the EOS text at {j} (prompt {name}, no stop_token_ids): {seen}; "
                    f"declared stop_text={caps.stop_text!r} wants {len(want[caps.stop_text][0])} tokens")

        req = request(prompt, budget, GREEDY, spec_for(caps, 4), stop=[stop], stop_token_ids=[])
        _judge(mtp_backend, req, mtp_backend.generate(req), problem, mtp_record, plain.tokens[:budget])
        checked += 1
    mtp_record(stop_text=caps.stop_text, aimed_at_special_token=checked)
    if not checked:
        pytest.skip("no greedy output holds the model's EOS within its 32 tokens: no stop string to aim at it")
