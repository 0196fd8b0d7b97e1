"""One checkpoint through two engines: the reference engine decoding mlx-vlm's
Qwen3.5 fixture through mtpcheck.engine.qwen3_5.

* the hybrid model's rollback is exact: after a rejected block the caches
  equal a fresh prefill of the committed tokens; a cache that restores the
  recurrent state but not the conv window (a plausible bug) is caught;
* greedy tokens are identical between the reference and mlx-vlm, with
  speculation off and on;
* the reference's own invariants hold on this model (stochastic rounds).
The figures (acceptance, tokens/s) come from `python -m research.two_engines`."""

from __future__ import annotations

import importlib.util

import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams, SpeculationRequest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlx_vlm") is None,
                                reason="mlx-vlm is not installed (pip install 'mtpcheck[mlx-vlm]')")

PROMPT_TEXT = "id,name,city,score\n1,grace,oslo,17\n2,victor,lima,88\n3,"


@pytest.fixture(scope="module")
def ref():
    from mtpcheck.backends.reference import load_reference

    return load_reference(fixture="mlx-vlm")


@pytest.fixture(scope="module")
def vlm():
    from mtpcheck.backends.mlx_vlm import load_mlx_vlm

    return load_mlx_vlm()


def _req(prompt, n=32, temperature=0.0, seed=3, depth=3, trace=False):
    spec = SpeculationRequest(mode="native_mtp", num_draft_tokens=depth) if depth else SpeculationRequest(mode="off")
    return GenerationRequest(prompt_tokens=prompt, max_tokens=n, stop_token_ids=[], trace=trace,
                             sampling=SamplingParams(temperature=temperature, seed=seed), speculation=spec)


def _rollback_error(form, prompt, cache_factory=None) -> float:
    """Max |logit| difference between (prefill, forward 4, roll back 2, forward 2)
    and a fresh forward of the committed tokens."""
    import mlx.core as mx

    make = cache_factory or form.make_cache
    cache = make()
    form(mx.array(prompt)[None], cache)
    form(mx.array([5, 9, 13, 17])[None], cache)  # a block, half of it rejected
    for c in cache:
        c.trim_to(len(prompt) + 2)
    _, rolled = form(mx.array([21, 22])[None], cache)
    _, fresh = form(mx.array(prompt + [5, 9, 21, 22])[None], make())
    return float(mx.abs(rolled[0] - fresh[0, -2:]).max())


def test_hybrid_rollback_is_exact_and_a_half_restore_is_caught(ref):
    from mtpcheck.engine.qwen3_5 import DeltaCache

    form = ref.engine.target
    prompt = ref.encode(PROMPT_TEXT)
    assert _rollback_error(form, prompt) < 1e-4

    class WindowNotRestored(DeltaCache):
        def trim_to(self, length):
            window = self.cache[0]
            super().trim_to(length)
            self.cache[0] = window  # recurrent state restored, conv window left at the rejected tokens

    def broken():
        return [WindowNotRestored() if isinstance(c, DeltaCache) else c for c in form.make_cache()]

    assert _rollback_error(form, prompt, broken) > 1e-3


def test_greedy_tokens_identical_between_engines(ref, vlm):
    prompt = vlm.encode(PROMPT_TEXT)
    assert ref.encode(PROMPT_TEXT) == prompt
    base = vlm.generate(_req(prompt, depth=0)).tokens
    for depth in (0, 1, 3):
        assert ref.generate(_req(prompt, depth=depth)).tokens == base, f"reference, depth {depth}"
    assert vlm.generate(_req(prompt, depth=3)).tokens == base


def test_reference_invariants_hold_on_the_hybrid_model(ref):
    """Stochastic rounds with rejections: traces verify against the trace laws
    and the report agrees with the stream (the suite's checks)."""
    from mtpcheck.machinery import checks as C

    prompt = ref.encode(PROMPT_TEXT)
    caps = ref.capabilities()
    rejected = 0
    for seed in range(3):
        req = _req(prompt, n=24, temperature=1.0, seed=seed, trace=True)
        res = ref.generate(req)
        assert not C.stats_problems(res, req, caps)
        gt = ref.target_distributions(prompt, res.tokens, req.sampling)  # teacher-forced, no cache
        rule = caps.acceptance_rule
        problems = (C.accept_problems(res, req, rule, gt) + C.residual_bonus_problems(res, rule)
                    + C.rollback_problems(res, req, rule) + C.bonus_uncached_problems(res, rule))
        assert not problems, problems
        rejected += sum(a < d for a, d in zip(res.speculation.accept_lens, res.speculation.draft_lens, strict=True))
    assert rejected > 0  # the rollback path ran



def test_native_checkpoint_decodes_like_the_separate_pair(ref):
    """The same weights as one checkpoint with embedded mtp.* tensors: same
    tokens and rounds; only the native layout offers embedded-head evidence."""
    from mtpcheck.backends.reference import load_reference

    native = load_reference(fixture="mlx-vlm-native")
    assert native.capabilities().checkpoint_evidence and not ref.capabilities().checkpoint_evidence
    prompt = ref.encode(PROMPT_TEXT)
    for temperature in (0.0, 1.0):
        a, b = ref.generate(_req(prompt, temperature=temperature)), native.generate(_req(prompt, temperature=temperature))
        assert a.tokens == b.tokens
        assert a.speculation.accept_lens == b.speculation.accept_lens


def test_caches_equal_a_fresh_prefill_after_every_round(ref):
    """The white-box rollback check (engine/invariants.py) on the hybrid model:
    KV caches, conv windows, recurrent states and the head's cache."""
    from mtpcheck.engine.invariants import cache_problems

    engine, problems, rounds = ref.engine, [], []

    def observer(snap):
        rounds.append(snap.round)
        problems.extend(cache_problems(engine, snap))

    prompt = ref.encode(PROMPT_TEXT)
    res = engine.generate(_req(prompt, n=20, temperature=1.0, seed=11), observer=observer)
    assert len(rounds) > 3 and min(res.speculation.accept_lens) < 3  # rounds with rejections ran
    assert not problems, problems[:5]


def test_the_measuring_drafters_do_what_they_claim():
    """two_engines' ablation drafters: the head's first entry is the last
    prompt position, drafts are one-hot, and exact match keeps the output
    token for token equal to plain decoding under the same seed."""
    from mtpcheck.backends.reference import load_reference
    from research.two_engines import ArgmaxFromLastPrompt

    b = load_reference(fixture="mlx-vlm", acceptance="exact_match")
    made = []
    b.engine.make_drafter = lambda plan: made.append(ArgmaxFromLastPrompt(b.engine.target)) or made[-1] if plan.used else None
    prompt = b.encode(PROMPT_TEXT)
    res = b.generate(_req(prompt, temperature=1.0, seed=5, trace=True))
    assert made[-1].offset == len(prompt) - 1
    assert all(max(q) == 1.0 for t in res.trace for q in t.draft_probs)
    assert res.tokens == b.generate(_req(prompt, temperature=1.0, seed=5, depth=0)).tokens


def test_v10_mlx_vlm_hands_its_head_one_prompt_position(vlm):
    """Evidence for V10 (docs/backends/mlx-vlm.md): mlx-vlm 0.7.10's MTP drafter
    is prefilled with the last prompt position only. If a release feeds the
    whole prompt, this fails: update the finding."""
    seen, orig = {}, vlm.drafter.prefill_from_target_hidden

    def spy(input_ids, hidden, *a, **k):
        seen.update(ids=tuple(input_ids.shape), hidden=tuple(hidden.shape))
        return orig(input_ids, hidden, *a, **k)

    vlm.drafter.prefill_from_target_hidden = spy
    try:
        prompt = vlm.encode(PROMPT_TEXT)
        vlm.generate(_req(prompt, n=6))
    finally:
        del vlm.drafter.prefill_from_target_hidden  # back to the class's method
    assert len(prompt) > 1
    assert seen == {"ids": (1, 1), "hidden": (1, 1, 64)}


def test_a_target_labelled_mtp_is_refused_at_load(tmp_path):
    """V8: mlx-vlm's load_drafter returns the target itself, labelled "mtp", for a
    qwen3_5_text folder with mtp.* tensors; the reference refuses it by name."""
    import json
    import shutil

    from mtpcheck.engine.qwen3_5 import load_qwen35
    from mtpcheck.fixture.realbackends import REAL_DIR

    folder = tmp_path / "native-as-text"
    shutil.copytree(REAL_DIR / "mlx_vlm" / "native", folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config.pop("text_config"), model_type="qwen3_5_text")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="did not load as a qwen3_5_mtp head"):
        load_qwen35(folder, folder)
