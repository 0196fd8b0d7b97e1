"""Token constraints: the automaton compilers, the engine under a constraint
(masks at exact histories, drafting stops at complete boundaries, state moved
by committed tokens only), and the clause checks catching broken variants
(B09: a rejected proposal advances the state; an unmasked drafter)."""

import numpy as np
import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams
from mtpcheck.engine import draft
from mtpcheck.engine.constraints import DEAD, DONE, ConstraintError, Cursor, TokenDFA, masked
from mtpcheck.engine.decode import Engine
from mtpcheck.engine.scheduler import Scheduler
from mtpcheck.machinery import scheduling as S

END = 0
V = 48


def trie(seed=0, depth=9, vocab=V):
    rng = np.random.default_rng(seed)
    seqs = [[]]
    for d in range(depth):
        seqs = [s + [int(t)] for s in seqs for t in rng.choice(np.arange(1, vocab), size=3 if d < 3 else 1, replace=False)]
    return seqs


SPEC = S.ConstraintSpec(sequences=trie(), end_token_ids=[END])


def test_sequences_compile_to_a_trie():
    dfa = TokenDFA.from_sequences([[1, 2, 3], [1, 4]], V, [END])
    s = dfa.walk([1])
    assert np.flatnonzero(dfa.allowed(s)).tolist() == [2, 4] and not dfa.complete(s)
    done = dfa.walk([1, 4])
    assert dfa.complete(done) and np.flatnonzero(dfa.allowed(done)).tolist() == [END]
    assert dfa.advance(done, END) == DONE and dfa.walk([1, 5]) == DEAD
    assert dfa.violations([1, 4, END]) == [] and dfa.violations([1, 5, 4]) == [1, 2]


def test_strings_compile_over_token_texts():
    texts = ["<e>", "a", "b", "ab", "ba", "c"]
    dfa = TokenDFA.from_strings(["abc", "ba"], texts, [0])
    assert np.flatnonzero(dfa.allowed(dfa.start)).tolist() == [1, 2, 3, 4]  # "a", "b", "ab", "ba"
    assert dfa.signature(dfa.walk([1, 2])) == dfa.signature(dfa.walk([3]))  # "a"+"b" and "ab" are one state
    assert dfa.complete(dfa.walk([4])) and dfa.complete(dfa.walk([2, 1]))
    assert not dfa.violations([3, 5, 0])


def test_grammar_edges_and_dead_ends_pruned():
    # 0 -a-> 1 -b-> 2 (accepting); 0 -c-> 3 leads nowhere and is pruned
    dfa = TokenDFA.from_edges(V, 0, [(0, [1], 1), (1, [2], 2), (2, [1], 1), (0, [3], 3)], [2], [END])
    assert np.flatnonzero(dfa.allowed(0)).tolist() == [1]
    assert dfa.violations([1, 2, 1, 2, END]) == []
    with pytest.raises(ConstraintError, match="end token"):
        TokenDFA.from_sequences([[1]], V, [])
    with pytest.raises(ConstraintError, match="outside the vocabulary"):
        TokenDFA.from_sequences([[99]], V, [END])
    with pytest.raises(ConstraintError, match="accepts no sequence"):
        TokenDFA.from_edges(V, 0, [(0, [1], 1)], [], [END])
    with pytest.raises(ConstraintError, match="allows no token"):
        masked(np.zeros(V), np.zeros(V, dtype=bool))
    with pytest.raises(ValueError, match="exactly one"):
        S.ConstraintSpec(sequences=[[1]], strings=["a"])


def test_cursor_is_a_value():
    dfa = TokenDFA.from_sequences([[1, 2]], V, [END])
    c = Cursor.of(dfa)
    d = c.advance_all([1, 2])
    assert c.state == dfa.start and d.complete and Cursor.of(None).advance(5).mask is None


def run(engine, spec=SPEC, temperatures=(0.0, 1.0, 1.5), drafters=("assistant", "mtp"), observer=None):
    sch = Scheduler(engine)
    ids = []
    for i, (d, t) in enumerate((d, t) for d in drafters for t in temperatures):
        ids.append(sch.submit(GenerationRequest(
            prompt_tokens=[3, 1, 4, i], max_tokens=14, stop_token_ids=[END], trace=True,
            sampling=SamplingParams(temperature=t, seed=i), speculation={"drafter": d, "num_draft_tokens": 3}),
            constraint=spec))
        if observer:
            sch.jobs[ids[-1]].state.observer = observer
    outs = sch.run()
    return [outs[i] for i in ids]


def problems(outs, dfa):
    out = {}
    for name, fn in (("emit", S.constraint_emit_problems), ("mask", S.constraint_mask_problems),
                     ("rollback", S.constraint_rollback_problems)):
        out[name] = [p for o in outs for p in fn(o, dfa)]
    return out


@pytest.fixture(scope="module")
def engine(random_models):
    target, assistant = random_models
    return Engine(target, assistant, eos_ids=(END,))


def test_constrained_generation_holds_every_clause(engine):
    dfa = S.compile_spec(SPEC, V, [END])
    states = []
    outs = run(engine, observer=lambda snap: states.append((len(snap.out.tokens), snap.cursor.state, snap.out.tokens[:])))
    assert problems(outs, dfa) == {"emit": [], "mask": [], "rollback": []}
    assert all(o.finish_reason == "stop" and o.tokens[-1] == END and len(o.tokens) == 10 for o in outs)
    # the observer's cursor after every round equals a fresh walk of the committed tokens
    assert all(dfa.walk(toks) == s for _, s, toks in states)
    # drafting stopped before the grammar-complete boundary: the last block is short
    assert any(len(o.trace[-1].proposals) < 3 for o in outs)


def test_strings_constraint_with_a_tokenizer(random_models, char_tokenizer):
    target, assistant = random_models
    e = Engine(target, assistant, tokenizer=char_tokenizer, eos_ids=(END,))
    spec = S.ConstraintSpec(strings=["bcd", "bdb", "cab"], end_token_ids=[END])
    outs = run(e, spec, temperatures=(1.0,), drafters=("assistant",))
    texts = [char_tokenizer.decode([i]) for i in range(V)]
    dfa = S.compile_spec(spec, V, [END], texts)
    assert problems(outs, dfa) == {"emit": [], "mask": [], "rollback": []}
    assert char_tokenizer.decode(outs[0].tokens[:-1]) in ("bcd", "bdb", "cab")


class AdvancesByTheRejectedProposal(Engine):
    """B09: after a rejection the constraint state takes the rejected
    proposal instead of the correction."""

    def cursor_after(self, cursor, rnd):
        toks, proposals, accepted = list(rnd.committed), rnd.block.tokens, rnd.verdict.accepted
        if accepted < len(proposals) and len(toks) == accepted + 1:
            toks[-1] = proposals[accepted]
        return cursor.advance_all(toks)


def test_state_advanced_by_a_rejected_proposal_is_caught(random_models):
    target, assistant = random_models
    outs = run(AdvancesByTheRejectedProposal(target, assistant, eos_ids=(END,)), temperatures=(1.0, 1.5))
    found = problems(outs, S.compile_spec(SPEC, V, [END]))
    assert found["rollback"] and found["emit"], found


def test_unmasked_drafter_is_caught_by_the_mask_clause_only(engine, monkeypatch):
    """The target mask keeps the output valid; only the traced draft laws show it."""
    monkeypatch.setattr(draft, "masked", lambda logits, mask: logits)
    found = problems(run(engine, temperatures=(1.0,)), S.compile_spec(SPEC, V, [END]))
    assert found["mask"] and not found["emit"] and not found["rollback"], found
