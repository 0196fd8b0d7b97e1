"""mlx-lm speculative decoding with a draft model as a backend (name "mlx-lm").

Drives mlx-lm through its public entry points only:

* loading: ``mlx_lm.load`` for the target and for the draft model;
* generation: ``mlx_lm.generate.speculative_generate_step(prompt, model,
  draft_model, num_draft_tokens=depth, ...)`` with speculation on and
  ``mlx_lm.generate.generate_step`` with it off, on the same loaded target;
* statistics: mlx-lm exposes one flag per token, ``from_draft``: a round is a
  run of accepted draft tokens (from_draft=True) closed by the target's own
  token (from_draft=False), or cut by the budget. Proposals per round are not
  exposed; they follow mlx-lm's rule ``min(max_tokens - emitted, num_draft_tokens)``.
  After a stop the rest of the current round (already computed) is drained,
  never committed, so that the round's statistics are complete.

mlx-lm's first token comes out of the first verification round (the draft
proposes it); there is no target-only prefill token as in mlx-vlm or the
reference engine, so emitted tokens = accepted + rounds, not 1 + accepted +
rounds: declared as ``first_token_from_prefill=False`` (docs/backends/mlx-lm.md, L2).

Sampling: one sampler callable serves draft and target and draws from
mlx-lm's one global random stream (``mx.random.seed(seed)`` before each call
makes a seeded call repeatable; seeded output differs between speculation on
and off at temperature > 0, the law does not). Controls are mapped as in
:mod:`mtpcheck.backends._library`: mlx-lm's ``make_sampler`` where its order
gives the contract's law exactly, else a sampler composed of mlx-lm's public
filters in the contract's order. Penalties and logit bias go to mlx-lm as
``logits_processors``, with speculation as without (mlx-lm's speculative step
takes them), with the whole history as context. Its speculative step feeds
them a history without the prompt (L1, in ``xfails/mlx_lm.txt``); with
``guard=on`` such requests run unaccelerated and say so (used=False).

A prompt longer than the target's ``max_position_embeddings`` (or the loader
option ``context_length``) raises PromptTooLongError before any forward.

mlx-lm's log-probabilities are those of the raw logits (after processors,
before temperature and filters), not of the processed law: ``logprobs`` is
not declared.

Import this module freely: mlx-lm is imported when a backend is loaded.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from mtpcheck.backends._library import (
    MLX_DTYPES,
    DecodePathLogprobs,
    LibraryBackend,
    cast,
    composed_sampler,
    context_limit,
    drive_chunks,
    dtype_name,
    library_sampling,
    library_version,
    penalty_processors,
    plan_speculation,
    real_fixture_dir,
    require_library,
    switch,
    with_scale,
)
from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    SamplingParams,
    SpeculationRequest,
)

MAX_DEPTH = 8
EXTRA = "mlx-lm"


def fixture_dir() -> Path:
    return real_fixture_dir("mlx_lm")


class RoundCounter:
    """Per-round statistics from mlx-lm's ``from_draft`` flags."""

    def __init__(self, depth: int, max_tokens: int):
        self.depth, self.max_tokens = depth, max_tokens
        self.accept_lens: list[int] = []
        self.draft_lens: list[int] = []
        self.seen = 0  # tokens the library has yielded
        self.open = False

    def see(self, from_draft: bool) -> bool:
        """Count one yielded token; True when it closes a round."""
        if not self.open:
            self.accept_lens.append(0)
            self.draft_lens.append(min(self.max_tokens - self.seen, self.depth))
            self.open = True
        self.seen += 1
        if from_draft:
            self.accept_lens[-1] += 1
            if self.seen >= self.max_tokens:
                self.open = False
                return True
            return False
        self.open = False
        return True


class MlxLmBackend(LibraryBackend):
    """One loaded mlx-lm target and its draft model. Options of
    :func:`load_mlx_lm`: path, target, draft, depth, speculation, guard, context_length."""

    runtime = "mlx_lm"

    def __init__(self, model, tokenizer, draft_model, *, target_path: Path, draft_path: Path, depth: int,
                 speculation: bool, vocab_size: int, eos_ids: list[int], guard: bool = False,
                 context: int | None = None):
        self.model, self.tokenizer, self.draft_model = model, tokenizer, draft_model
        self.guard, self.context = guard, context
        self.target_path, self.draft_path = target_path, draft_path
        self.vocab_size, self.eos_ids = vocab_size, eos_ids
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter="assistant",
                                          num_draft_tokens=depth)
        self.version = library_version("mlx-lm")
        self.logit_dtype = dtype_name(model)
        from mlx_lm.models.cache import make_prompt_cache

        self.truth = DecodePathLogprobs(lambda x, cache: model(x, cache=cache), lambda: make_prompt_cache(model))

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name="mlx-lm",
            version=f"mlx-lm {self.version}",
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            mtp_kinds=["assistant"],
            max_depth=MAX_DEPTH,
            acceptance_rule="exact_match",
            first_token_from_prefill=False,  # round 0 emits the first token (see the module docstring)
            seeded_determinism=True,
            position_addressed_target_sampling=False,
            speculative_sampling_controls=self.speculative_controls(penalties_reach_library=True),
            round_statistics="inferred",  # accept_lens from from_draft flags; draft_lens = min(depth, room), not seen
            target_distributions=True,
            raw_logits=True,  # target_logits: the decode path's float16 logits
            checkpoint_evidence=True,
            logit_dtype=self.logit_dtype,  # the weights': verification and one-token steps round differently
            logprobs=False,
            traces=False,
            text=True,
            stop_text="special_tokens_kept",  # the project's stop matcher over decode(), special tokens kept
            streaming=True,  # generate_stream: the same token generator as generate(), chunked by the stop matcher
            **self.declared_context(),
            notes=(f"draft model {self.draft_path.name}/, default depth {self.default.num_draft_tokens}; one shared "
                   "random stream for draft and target (seeded output differs between speculation on and off at "
                   "temperature > 0); the first token comes from the first verification round; mlx-lm's logprobs "
                   "are of the raw logits, not declared; penalties and logit bias "
                   + ("run unaccelerated (guard=on)" if self.guard else "go to the speculative step (guard=off; L1)")
                   + "; not concurrent: mlx-lm's batch_generate / BatchGenerator take no draft model, so requests "
                   "in flight together never speculate"),
        )

    def checkpoints(self) -> dict[str, Path]:
        """The checkpoint folders this backend runs (capability checkpoint_evidence)."""
        return {"target": self.target_path, "assistant": self.draft_path}

    # -- generation
    def plan(self, req: GenerationRequest) -> tuple[SpeculationRequest, bool, int, str | None, str | None]:
        return plan_speculation(req, self.default, "assistant", str(self.draft_path), 2, MAX_DEPTH,
                                "mlx-lm's speculative step gives its logits processors a history without "
                                "the prompt, so these need target-only decoding (guard=on)" if self.guard else None)

    def sampler(self, sp: SamplingParams, sample_utils):
        if sp.temperature == 0.0:
            return None  # mlx-lm's greedy_sampler
        args = library_sampling(sp)
        if args is not None:
            if args["top_k"] >= self.vocab_size:
                args["top_k"] = 0
            return sample_utils.make_sampler(**args)
        return composed_sampler(sp, sample_utils)

    def _run(self, request: GenerationRequest):
        import mlx.core as mx

        gen = require_library("mlx_lm.generate", EXTRA)
        sample_utils = require_library("mlx_lm.sample_utils", EXTRA)
        self.check(request)
        spec, used, depth, reason, message = self.plan(request)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(2**31)
        kwargs: dict[str, Any] = {"max_tokens": request.max_tokens, "sampler": self.sampler(sp, sample_utils)}
        if sp.speculation_blockers():
            context = len(request.prompt_tokens) + request.max_tokens
            kwargs["logits_processors"] = penalty_processors(sp, context, sample_utils)
        eos = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        prompt = mx.array(request.prompt_tokens, dtype=mx.uint32)
        mx.random.seed(seed)
        counter = RoundCounter(depth, request.max_tokens)
        if used:
            raw = gen.speculative_generate_step(prompt, self.model, self.draft_model, num_draft_tokens=depth, **kwargs)

            def counted():
                for tok, _, from_draft in raw:
                    yield tok, counter.see(bool(from_draft))

            stream, close = counted(), raw.close
        else:
            raw = gen.generate_step(prompt, self.model, **kwargs)
            stream, close = ((tok, True) for tok, _ in raw), raw.close
        try:
            out = yield from drive_chunks(stream, request, eos, self.decode,
                                          round_end=(lambda item: item[1]) if used else None)
        finally:
            close()
        return self.result(out, spec=spec, used=used, depth=depth, reason=reason, message=message,
                           drafter=str(self.draft_path), draft_kind="assistant", accept_lens=counter.accept_lens,
                           draft_lens=counter.draft_lens, seed=seed)


def load_mlx_lm(
    path: str | Path | None = None,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    depth: int | str = 3,
    speculation: str | bool = True,
    guard: str | bool = False,
    context_length: int | str | None = None,
    logit_scale: float | str | None = None,
    dtype: str | None = None,
) -> MlxLmBackend:
    """Load an mlx-lm target and its draft model (default: the shipped fixture
    ``mtpcheck/fixture/real/mlx_lm``: ``target/`` and ``draft/``).

    Options (strings from --mtp-backend-option): path (folder holding target/
    and draft/), target, draft, depth (default 3), speculation (on|off: the
    loaded default), guard (off|on, default off:
    :data:`~mtpcheck.backends._library.GUARD_DOC`), context_length (most prompt
    tokens; default the target's max_position_embeddings), dtype (float16,
    bfloat16 or float32: both models cast to it; default as stored, float16 for
    the fixture). logit_scale: a bound of |logit| (default 32), the size at which the precision rule counts ulps."""
    require_library("mlx_lm", EXTRA)
    from mlx_lm import load

    from mtpcheck.inspect import check_pair

    if dtype is not None and dtype not in MLX_DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(MLX_DTYPES)}")
    base = Path(path) if path else fixture_dir()
    target_path = Path(target) if target else base / "target"
    draft_path = Path(draft) if draft else base / "draft"
    check_pair(target_path, draft_path)  # AssistantMismatchError: vocabulary or tokenizer differ
    model, tokenizer = load(str(target_path))
    draft_model, _ = load(str(draft_path))
    if dtype is not None:
        cast(dtype, model, draft_model)
    vocab = int(model.args.vocab_size)
    eos = sorted(int(e) for e in getattr(tokenizer, "eos_token_ids", []) or [])
    if not eos and getattr(model.args, "eos_token_id", None) is not None:
        eos = [int(model.args.eos_token_id)]
    return with_scale(MlxLmBackend(model, tokenizer, draft_model, target_path=target_path, draft_path=draft_path,
                                   depth=int(depth), speculation=switch(speculation), vocab_size=vocab, eos_ids=eos,
                                   guard=switch(guard), context=context_limit(model.args, context_length)),
                      logit_scale)
