"""Fast checks of the real-backend adapters on the committed fixtures
(mtpcheck/fixture/real): they load, generate with speculation on and off on
one loaded model, report statistics that agree with the libraries' own
counters, and give target laws that sum to 1. The conformance suite proper
runs them with `pytest --pyargs mtpcheck.suite --mtp-backend=mlx-vlm|mlx-lm`."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
import time

import numpy as np
import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams, SpeculationUnavailableError

HAVE_VLM = importlib.util.find_spec("mlx_vlm") is not None
HAVE_LM = importlib.util.find_spec("mlx_lm") is not None
needs_vlm = pytest.mark.skipif(not HAVE_VLM, reason="mlx-vlm is not installed (pip install 'mtpcheck[mlx-vlm]')")
needs_lm = pytest.mark.skipif(not HAVE_LM, reason="mlx-lm is not installed (pip install 'mtpcheck[mlx-lm]')")

BOTH = [pytest.param("vlm", marks=needs_vlm), pytest.param("lm", marks=needs_lm)]
PROMPT_TEXT = "id,name,city,score\n1,grace,oslo,17\n2,victor,lima,88\n3,"


def req(prompt, n=16, temperature=0.0, seed=7, spec=None, **kw):
    return GenerationRequest(prompt_tokens=prompt, max_tokens=n, stop_token_ids=kw.pop("stop_token_ids", []),
                             sampling=SamplingParams(temperature=temperature, seed=seed, **kw), speculation=spec)


@pytest.fixture(scope="module")
def vlm():
    from mtpcheck.backends.mlx_vlm import load_mlx_vlm

    return load_mlx_vlm()


@pytest.fixture(scope="module")
def lm():
    from mtpcheck.backends.mlx_lm import load_mlx_lm

    return load_mlx_lm()


def test_importing_the_adapters_does_not_import_the_libraries():
    code = ("import sys, mtpcheck.backends.mlx_vlm, mtpcheck.backends.mlx_lm; "
            "print([m for m in ('mlx_vlm', 'mlx_lm', 'mlx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_missing_library_names_the_extra():
    from mtpcheck.backends.mlx_vlm import require_library

    with pytest.raises(ImportError, match=r"pip install 'mtpcheck\[mlx-vlm\]'"):
        require_library("mtpcheck_no_such_module", "mlx-vlm")


@needs_vlm
def test_mlx_vlm_speculation_on_and_off(vlm):
    caps = vlm.capabilities()
    prompt = vlm.encode(PROMPT_TEXT)
    assert vlm.decode(prompt) == PROMPT_TEXT and caps.vocab_size == 512 and caps.eos_token_ids == [0]
    off = vlm.generate(req(prompt, spec=False))
    on = vlm.generate(req(prompt, spec={"num_draft_tokens": 3}))
    assert (off.speculation.used, off.speculation.reason) == (False, "not_requested")
    assert on.speculation.used and on.speculation.rounds >= 1 and on.speculation.accepted >= 1
    assert len(on.tokens) == len(off.tokens) == 16
    # seeded temperature 1: mlx-vlm's position-addressed sampler makes them equal
    t_off, t_on = (vlm.generate(req(prompt, temperature=1.0, seed=11, spec=s)) for s in (False, True))
    assert t_on.tokens == t_off.tokens


@needs_vlm
def test_mlx_vlm_statistics_are_the_drafters_counters(vlm):
    prompt = vlm.encode(PROMPT_TEXT)
    d = vlm.drafter
    before = (getattr(d, "speculative_total_rounds", 0), getattr(d, "speculative_total_accepted", 0.0),
              getattr(d, "speculative_total_drafted", 0))
    res = vlm.generate(req(prompt, n=24, temperature=1.0, spec={"num_draft_tokens": 2}))
    s = res.speculation
    assert s.accept_lens == [int(a) for a in d.accept_lens] and s.draft_lens == list(d.draft_lens)
    assert s.rounds == d.speculative_total_rounds - before[0]
    assert s.accepted == round(d.speculative_total_accepted - before[1])
    assert s.drafted == d.speculative_total_drafted - before[2]
    cut = 1 + s.accepted + s.rounds - len(res.tokens)  # the first token comes from the prefill
    assert 0 <= cut <= s.accept_lens[-1] and len(res.tokens) == 24  # only the budget cuts the last round


@pytest.fixture
def guarded(request):
    """A loaded adapter with guard on (the loader's own option parsing is
    checked in test_the_guard_is_a_loader_option); restored after the test."""
    b = request.getfixturevalue(request.param)
    b.guard = True
    yield b
    b.guard = False


PENALTY = {"repetition_penalty": 1.5}


@pytest.mark.parametrize("guarded", BOTH, indirect=True)
def test_with_guard_on_penalties_run_unaccelerated_or_raise(guarded):
    prompt = guarded.encode(PROMPT_TEXT)
    assert "repetition_penalty" not in guarded.capabilities().speculative_sampling_controls
    res = guarded.generate(req(prompt, **PENALTY, spec=True))
    assert not res.speculation.used and res.speculation.reason == "sampling_control_unsupported"
    assert "repetition_penalty" in res.speculation.message and "guard=on" in res.speculation.message
    with pytest.raises(SpeculationUnavailableError):
        guarded.generate(req(prompt, **PENALTY, spec={"require_acceleration": True}))


@pytest.mark.parametrize("name", BOTH)
def test_by_default_penalties_go_to_the_library_with_speculation(name, request):
    """Thin by default: the library's API takes penalties with a drafter, so
    the adapter speculates and declares them; whether the library honours
    them is the suite's verdict (REPORT-NO-SILENT-FALLBACK, xfails V1 / L1)."""
    b = request.getfixturevalue(name)
    prompt = b.encode(PROMPT_TEXT)
    assert "repetition_penalty" in b.capabilities().speculative_sampling_controls
    res = b.generate(req(prompt, **PENALTY, spec={"require_acceleration": True}))
    assert res.speculation.used and res.speculation.reason is None


@pytest.mark.parametrize("name", [pytest.param("mlx-vlm", marks=needs_vlm), pytest.param("mlx-lm", marks=needs_lm)])
def test_the_guard_is_a_loader_option(name):
    """--mtp-backend-option guard=on|off reaches the adapter (off by default)."""
    from mtpcheck.backends import load_backend, resolve_factory

    assert inspect.signature(resolve_factory(name)).parameters["guard"].default is False
    b = load_backend(name, {"guard": "on", "context_length": "64"})
    assert b.guard and b.context == 64 and "guard=on" in b.capabilities().notes
    assert not load_backend(name, {"guard": "off"}).guard


@pytest.mark.parametrize("name", BOTH)
def test_a_prompt_longer_than_the_context_is_refused_before_any_forward(name, request):
    from mtpcheck.backends._library import PromptTooLongError

    b = request.getfixturevalue(name)
    prompt = b.encode(("id,name,city,score\n" * 6000)[:100_000])  # a 100 KB prompt
    assert len(prompt) > b.context == 2048  # the fixtures' max_position_embeddings
    t0 = time.perf_counter()
    with pytest.raises(PromptTooLongError, match=f"{len(prompt)} tokens exceed the context length 2048"):
        b.generate(req(prompt, spec=True))
    with pytest.raises(ValueError):  # a ValueError too: a bad request
        b.target_distributions(prompt, [1], SamplingParams(temperature=1.0))
    assert time.perf_counter() - t0 < 2.0


@needs_lm
def test_mlx_lm_speculation_on_and_off(lm):
    caps = lm.capabilities()
    prompt = lm.encode(PROMPT_TEXT)
    assert lm.decode(prompt) == PROMPT_TEXT and caps.vocab_size == 512 and caps.eos_token_ids == [0]
    off = lm.generate(req(prompt, spec=False))
    on = lm.generate(req(prompt, spec={"num_draft_tokens": 3}))
    assert not off.speculation.used and on.speculation.used and on.speculation.accepted >= 1
    assert len(on.tokens) == len(off.tokens) == 16
    s = on.speculation
    # mlx-lm has no target-only first token: every round emits its accepted
    # proposals and one target token, except a last round the budget ends
    assert len(on.tokens) in (s.accepted + s.rounds, s.accepted + s.rounds - 1)


@needs_lm
def test_mlx_lm_declares_its_schedule_and_stats_consistent_checks_it(lm):
    """mlx-lm emits its first token from round 0 and declares so; the same
    adapter declaring a prefill token it does not have fails STATS-CONSISTENT."""
    from mtpcheck.machinery.checks import stats_problems

    caps = lm.capabilities()
    assert caps.first_token_from_prefill is False
    prompt = lm.encode(PROMPT_TEXT)
    minimal = req(prompt, n=1, spec={"num_draft_tokens": 1})  # L2's example: greedy, depth 1, one token
    longer = req(prompt, n=16, spec={"num_draft_tokens": 3})
    results = [(lm.generate(r), r) for r in (minimal, longer)]
    assert all(res.speculation.used for res, _ in results)
    for res, r in results:
        assert stats_problems(res, r, caps) == [], (r.max_tokens, res.speculation)
    claims_prefill = caps.model_copy(update={"first_token_from_prefill": True})
    problems = stats_problems(*results[0], claims_prefill)
    assert problems and "(1 + accepted" in problems[0], problems


@needs_lm
def test_mlx_lm_statistics_are_the_from_draft_flags(lm):
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.sample_utils import make_sampler

    prompt = lm.encode(PROMPT_TEXT)
    res = lm.generate(req(prompt, n=24, temperature=1.0, seed=3, spec={"num_draft_tokens": 2}))
    mx.random.seed(3)
    direct = list(speculative_generate_step(mx.array(prompt, dtype=mx.uint32), lm.model, lm.draft_model,
                                            num_draft_tokens=2, max_tokens=24, sampler=make_sampler(1.0)))
    assert res.tokens == [t for t, _, _ in direct]
    assert res.speculation.accepted == sum(f for _, _, f in direct)
    assert res.speculation.rounds == sum(not f for _, _, f in direct) + (1 if direct[-1][2] else 0)



@pytest.mark.parametrize("name", BOTH)
def test_target_distributions_are_laws(name, request):
    b = request.getfixturevalue(name)
    prompt = b.encode(PROMPT_TEXT)
    res = b.generate(req(prompt, n=8, spec=False))
    for sp in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=8, top_p=0.9)):
        laws = b.target_distributions(prompt, res.tokens, sp)
        assert laws.shape == (8, b.capabilities().vocab_size) and laws.dtype == np.float64
        assert np.allclose(laws.sum(axis=1), 1.0, atol=1e-12)
    greedy = b.target_distributions(prompt, res.tokens, SamplingParams(temperature=0.0))
    assert [int(r.argmax()) for r in greedy] == res.tokens  # the plain greedy path, to the last bit


@pytest.mark.parametrize("name", BOTH)
def test_tokens_outside_the_vocabulary_are_refused(name, request):
    b = request.getfixturevalue(name)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        b.generate(req([1, 2, b.capabilities().vocab_size]))


@pytest.mark.parametrize("name", BOTH)
def test_generate_stream_chunks_concatenate_to_generate(name, request):
    """generate_stream (the `streaming` capability's method, undeclared for
    now) yields chunks in arrival order through the same path as generate()."""
    b = request.getfixturevalue(name)
    prompt = b.encode(PROMPT_TEXT)
    for spec, kw, stop in ((True, {}, []), (False, {"temperature": 1.0}, []), (True, {}, ["\n"])):
        r = req(prompt, n=24, spec=spec, **kw).model_copy(update={"stop": stop})
        chunks = list(b.generate_stream(r))
        res = b.generate(r)
        assert len(chunks) > 1 and all(c["finish_reason"] is None for c in chunks[:-1])
        assert [t for c in chunks for t in c["tokens"]] == res.tokens
        assert "".join(c["text"] for c in chunks) == res.text and chunks[-1]["finish_reason"] == res.finish_reason


@pytest.mark.parametrize("name", BOTH)
def test_target_logits_are_the_decode_paths_raw_logits(name, request):
    """Capability raw_logits: the rows target_distributions starts from,
    before any processing (log-softmax of them is the temperature-1 law)."""
    b = request.getfixturevalue(name)
    prompt = b.encode(PROMPT_TEXT)
    res = b.generate(req(prompt, n=8, spec=False))
    assert b.capabilities().raw_logits
    raw = b.target_logits(prompt, res.tokens)
    assert raw.shape == (8, b.capabilities().vocab_size) and np.isfinite(raw).all()
    assert np.array_equal(raw.astype(np.float16), raw)  # float16 logits, exactly
    law = b.target_distributions(prompt, res.tokens, SamplingParams(temperature=1.0))
    ratio = np.log(law) - raw  # a constant per row, up to float16 rounding of the log-probabilities
    assert np.max(np.abs(ratio - ratio[:, :1])) < 0.02


@needs_lm
@pytest.mark.parametrize("penalty", [1.5, 2.0])
def test_repetition_penalty_acts_on_logits_as_mlx_lms_processor_does(lm, penalty):
    """The ground truth with penalties (issue 22, item 4): the contract's
    penalties on the raw logits, then log-probabilities, is mlx-lm's own
    processor (make_logits_processors, run before logsumexp) to float rounding,
    and mlx-lm's plain greedy path emits its argmax at every position; the old
    rule (the penalty applied to log-probabilities, all negative, so always
    multiplied) misses positions."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_logits_processors

    from mtpcheck.engine.sampling import process

    prompt = lm.encode(PROMPT_TEXT)
    out = lm.generate(req(prompt, n=32, spec=False, repetition_penalty=penalty))  # plain: the whole history, L1 aside
    cont, seq, P = out.tokens, prompt + out.tokens, len(prompt)
    law = SamplingParams(temperature=1.0, repetition_penalty=penalty)
    ours = lm.target_distributions(prompt, cont, law)
    raw = lm.target_logits(prompt, cont)
    processors = make_logits_processors(repetition_penalty=penalty, repetition_context_size=len(seq))
    theirs = []
    for i in range(len(cont)):
        x = mx.array(raw[i : i + 1].astype(np.float16))
        for processor in processors:
            x = processor(mx.array(seq[: P + i]), x)
        lp = x - mx.logsumexp(x, axis=-1, keepdims=True)
        theirs.append(np.array(mx.softmax(lp.astype(mx.float32), axis=-1)[0], dtype=np.float64))
    assert np.max(np.abs(ours - np.stack(theirs))) < 1e-5
    assert np.argmax(ours, axis=1).tolist() == cont
    rows = lm.truth.rows(prompt, cont)
    old = np.stack([process(rows[i], law, seq[: P + i]) for i in range(len(cont))])
    assert np.argmax(old, axis=1).tolist() != cont
