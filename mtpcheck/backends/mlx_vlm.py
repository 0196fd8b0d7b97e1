"""mlx-vlm native MTP as a backend (name "mlx-vlm").

Drives mlx-vlm through its public entry points only:

* loading: ``mlx_vlm.utils.load`` (target + tokenizer) and
  ``mlx_vlm.speculative.drafters.load_drafter`` (the ``qwen3_5_mtp`` head),
  from two folders (``target/`` + ``mtp/``) or both from one native checkpoint
  with an embedded ``mtp.*`` head (``checkpoint=native``, :func:`resolve_folders`);
* generation: ``mlx_vlm.generate.generate_step(..., draft_model=, draft_kind="mtp",
  draft_block_size=depth + 1, seed=)``, with ``draft_model=None`` for
  speculation off, on the same loaded target;
* statistics: the drafter's own per-round counters ``accept_lens`` and
  ``draft_lens`` (the lifetime counters ``speculative_total_*`` agree; the
  tests check that).

Sampling controls are mapped onto the library's sampler so that the law it
samples from is the contract's processed law (``mtpcheck.engine.sampling.process``):

* temperature 0 -> greedy (``temperature=0``);
* temperature > 0 without min-p -> ``temperature``/``top_k``/``top_p``/``seed``:
  mlx-vlm then builds its position-addressed target sampler, which applies
  top-k, then temperature, then top-p on the tempered law: the contract's order;
* with min-p mlx-vlm falls back to its ``make_sampler``, which applies top-p
  and min-p to the *untempered* law and top-k last: min-p maps exactly (m at
  temperature T is m**T untempered), top-p only at T == 1 without top-k
  (:func:`library_sampling`); for the other combinations the adapter passes a
  ``sampler=`` composed of mlx-vlm's public filters (``apply_top_k``,
  ``apply_top_p``, ``apply_min_p``) in the contract's order.

Penalties and logit bias go to ``generate_step`` by its own names
(``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
``logit_bias``, each ``*_context_size`` = the whole history, as in the
contract), with speculation as without: the library's API takes them
together with a drafter. Its speculative loop (``run_speculative_rounds``)
never receives them, so they act on the first token only (V1), and its
default chunked prefill leaves the prompt out of their history (V2): both
listed in ``xfails/mlx_vlm.txt``. With ``guard=on`` such requests run
unaccelerated (used=False, reason=sampling_control_unsupported, or
SpeculationUnavailableError with require_acceleration) with an unchunked
prefill (``prefill_step_size=None``), which is what an application on
mlx-vlm 0.7.10 should do.

A prompt longer than the model's ``max_position_embeddings`` (or the loader
option ``context_length``) raises PromptTooLongError before any forward.

The library's speculative path yields no log-probabilities and its plain path
yields the unprocessed ones, so ``logprobs`` is not declared.

Import this module freely: mlx-vlm is imported when a backend is loaded.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from mtpcheck.backends._library import (  # noqa: F401  (re-exported: the names were public here)
    GUARD_DOC,
    DecodePathLogprobs,
    LibraryBackend,
    PromptTooLongError,
    check_request,
    composed_sampler,
    context_limit,
    drive,
    drive_chunks,
    dtype_name,
    library_sampling,
    library_version,
    penalty_processors,
    plan_speculation,
    real_fixture_dir,
    report,
    require_library,
    resolve_drafter,
    switch,
    with_scale,
)
from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    SpeculationRequest,
)

MAX_DEPTH = 8  # proposals per round; the one MTP layer is reused recurrently
EXTRA = "mlx-vlm"


def fixture_dir() -> Path:
    return real_fixture_dir("mlx_vlm")


# -- the backend ----------------------------------------------------------------


class MlxVlmBackend(LibraryBackend):
    """One loaded mlx-vlm target and its MTP drafter. Options of
    :func:`load_mlx_vlm`: path, target, drafter, depth, speculation, checkpoint,
    guard, context_length."""

    runtime = "mlx_vlm"

    def __init__(self, model, processor, drafter, *, target_path: Path, drafter_path: Path, depth: int,
                 speculation: bool, guard: bool = False, context: int | None = None):
        self.model, self.processor, self.drafter = model, processor, drafter
        self.guard, self.context = guard, context
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.target_path, self.drafter_path = target_path, drafter_path
        cfg = model.config
        self.vocab_size = int(getattr(cfg, "vocab_size", None) or cfg.text_config.vocab_size)
        eos = getattr(cfg, "eos_token_id", None)
        self.eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter="mtp",
                                          num_draft_tokens=depth)
        self.version = library_version("mlx-vlm")
        lm = model.language_model
        self.truth = DecodePathLogprobs(lambda x, cache: lm(x, cache=cache).logits, lm.make_cache)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name="mlx-vlm",
            version=f"mlx-vlm {self.version}",
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            mtp_kinds=["embedded"],
            max_depth=MAX_DEPTH,
            acceptance_rule="exact_match",
            seeded_determinism=True,
            position_addressed_target_sampling=True,
            # the library's speculative API takes penalties and logit bias (V1: it drops them)
            speculative_sampling_controls=self.speculative_controls(penalties_reach_library=True),
            target_distributions=True,
            raw_logits=True,  # target_logits: the decode path's float16 logits
            logprobs=False,
            traces=False,
            text=True,
            stop_text="special_tokens_kept",  # the project's stop matcher over decode(), special tokens kept
            streaming=True,  # generate_stream: the same token generator as generate(), chunked by the stop matcher
            **self.declared_context(),
            checkpoint_evidence=self.native,
            logit_dtype=dtype_name(self.model),  # the weights': verification and one-token steps round differently
            notes=(f"qwen3_5_mtp head {self.head_source}, default depth {self.default.num_draft_tokens}; "
                   "position-addressed target "
                   "sampling is mlx-vlm's seeded sampler (temperature/top-k/top-p); with min-p mlx-vlm samples "
                   "from its shared random stream, kept apart from the drafter's; penalties and logit bias "
                   + ("run unaccelerated (guard=on)" if self.guard else "passed to the library with speculation "
                      "(guard=off; V1: its speculative loop drops them)")),
        )

    @property
    def native(self) -> bool:
        """Target and head come from one checkpoint (embedded ``mtp.*`` tensors)."""
        return self.target_path.resolve() == self.drafter_path.resolve()

    @property
    def head_source(self) -> str:
        if self.native:
            return f"split in memory from the mtp.* tensors embedded in {self.target_path.name}/"
        return f"from {self.drafter_path.name}/ (a separate checkpoint of the target's own MTP layer)"

    def checkpoints(self) -> dict[str, Path]:
        """The checkpoint folders this backend runs. Declared as
        checkpoint_evidence only for a native checkpoint, whose target folder
        carries the embedded head CAP-HONESTY looks for; a separate head is a
        kind Capabilities.mtp_kinds cannot name yet (docs/backends/mlx-vlm.md, V7)."""
        return {"target": self.target_path, "mtp": self.drafter_path}

    # -- generation
    def plan(self, req: GenerationRequest) -> tuple[SpeculationRequest, bool, int, str | None, str | None]:
        return plan_speculation(req, self.default, "mtp", str(self.drafter_path), 3, MAX_DEPTH,
                                "mlx-vlm's speculative loop does not apply logits processors, "
                                "so these need target-only decoding (guard=on)" if self.guard else None)

    def _run(self, request: GenerationRequest):
        import mlx.core as mx

        gen = require_library("mlx_vlm.generate", EXTRA)
        sample_utils = require_library("mlx_vlm.sample_utils", EXTRA)
        self.check(request)
        spec, used, depth, reason, message = self.plan(request)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(2**31)
        kwargs: dict[str, Any] = {"max_tokens": request.max_tokens, "seed": seed}
        if sp.temperature == 0.0:
            kwargs.update(temperature=0.0, top_p=1.0, top_k=0)
        elif not sp.min_p:
            kwargs.update(temperature=sp.temperature, top_p=sp.top_p if sp.top_p is not None else 1.0,
                          top_k=sp.top_k if sp.top_k is not None and sp.top_k < self.vocab_size else 0)
        elif (args := library_sampling(sp)) is not None:
            kwargs.update(temperature=sp.temperature, top_p=args["top_p"] or 1.0, min_p=args["min_p"],
                          top_k=args["top_k"] if args["top_k"] < self.vocab_size else 0)
        else:
            kwargs.update(temperature=sp.temperature, sampler=composed_sampler(sp, sample_utils))
        if sp.speculation_blockers():
            # by the library's own names; the context is the whole history
            history = len(request.prompt_tokens) + request.max_tokens
            kwargs.update(repetition_penalty=sp.repetition_penalty, repetition_context_size=history,
                          presence_penalty=sp.presence_penalty, presence_context_size=history,
                          frequency_penalty=sp.frequency_penalty, frequency_context_size=history,
                          logit_bias=sp.logit_bias or None)
            if self.guard:  # V2: a chunked prefill leaves the prompt out of the processors' history
                kwargs.update(prefill_step_size=None)
        if used:
            kwargs.update(draft_model=self.drafter, draft_kind="mtp", draft_block_size=depth + 1)
            self.drafter.accept_lens, self.drafter.draft_lens = [], []
        eos = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        prompt = mx.array([request.prompt_tokens], dtype=mx.int32)
        mx.random.seed(seed)  # the drafter's proposals (and a composed sampler) use the global stream
        stream = gen.generate_step(prompt, self.model, None, None, **kwargs)
        try:
            out = yield from drive_chunks(stream, request, eos, self.decode)
        finally:
            stream.close()
        accept_lens = [int(a) for a in self.drafter.accept_lens] if used else []
        draft_lens = [int(d) for d in self.drafter.draft_lens] if used else []
        return self.result(out, spec=spec, used=used, depth=depth, reason=reason, message=message,
                           drafter=str(self.drafter_path), draft_kind="mtp", accept_lens=accept_lens,
                           draft_lens=draft_lens, seed=seed)


CHECKPOINT_LAYOUTS = ("separate", "native")


def resolve_folders(path: str | Path | None, target: str | Path | None, drafter: str | Path | None,
                    checkpoint: str | None) -> tuple[Path, Path]:
    """(target folder, drafter folder) for the loader's options.

    * ``checkpoint=separate`` (the default): ``path`` holds ``target/`` and
      ``mtp/`` (a target and a stand-alone ``qwen3_5_mtp`` head);
    * ``checkpoint=native``: ``path`` holds ``native/``, one checkpoint with
      the head embedded as ``mtp.*`` tensors; target and drafter are both that
      folder (mlx-vlm's target loader drops ``mtp.*``, its ``load_drafter``
      splits them out in memory);
    * ``path`` naming a checkpoint itself (it holds ``config.json``) is read
      as a native checkpoint, so ``path=<folder>`` alone runs one.

    ``target`` / ``drafter`` override either folder (``drafter`` defaults to
    the target folder when the layout is native)."""
    layout = (checkpoint or "").strip().lower() or None
    if layout is not None and layout not in CHECKPOINT_LAYOUTS:
        raise ValueError(f"checkpoint={checkpoint!r}: expected one of {', '.join(CHECKPOINT_LAYOUTS)}")
    base = Path(path) if path else fixture_dir()
    single = path is not None and (base / "config.json").is_file()
    if single and layout == "separate":
        raise ValueError(f"checkpoint=separate, but path={base} is one checkpoint (it holds config.json), "
                         "not a folder holding target/ and mtp/")
    if layout == "native" or (single and layout is None):
        target_path = Path(target) if target else (base if single else base / "native")
        return target_path, Path(drafter) if drafter else target_path
    return Path(target) if target else base / "target", Path(drafter) if drafter else base / "mtp"


def load_mlx_vlm(
    path: str | Path | None = None,
    target: str | Path | None = None,
    drafter: str | Path | None = None,
    depth: int | str | None = None,
    speculation: str | bool = True,
    checkpoint: str | None = None,
    guard: str | bool = False,
    context_length: int | str | None = None,
    logit_scale: float | str | None = None,
) -> MlxVlmBackend:
    """Load an mlx-vlm target and its MTP drafter (default: the shipped fixture
    ``mtpcheck/fixture/real/mlx_vlm``: ``target/`` and ``mtp/``).

    Options (strings from --mtp-backend-option): path (folder holding target/
    and mtp/, or native/; or one native checkpoint folder), checkpoint
    (separate|native, :func:`resolve_folders`), target, drafter (a drafter
    folder, or the target folder itself for a native checkpoint with embedded
    ``mtp.*`` tensors), depth (default: the drafter's block_size - 1; mlx-vlm
    gives a native checkpoint's in-memory drafter block_size =
    mtp_num_hidden_layers + 2), speculation (on|off: the loaded default),
    guard (off|on, default off: :data:`~mtpcheck.backends._library.GUARD_DOC`),
    context_length (most prompt tokens; default the target's
    max_position_embeddings). logit_scale: a bound of |logit| (default 32), the size at which the precision rule counts ulps."""
    require_library("mlx_vlm", EXTRA)
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.utils import load

    from mtpcheck.inspect import check_pair

    target_path, drafter_path = resolve_folders(path, target, drafter, checkpoint)
    # AssistantMismatchError: hidden size, vocabulary or tokenizer differ
    pair = check_pair(target_path, drafter_path)
    if pair.drafter.capability.kind == "none":
        raise ValueError(
            f"drafter {drafter_path} carries no MTP tensors (mtpcheck inspect: kind none)"
            + ("; a native checkpoint needs its head embedded as mtp.* tensors"
               if drafter_path.resolve() == target_path.resolve() else ""))
    model, processor = load(str(target_path))
    try:
        draft_model, kind = load_drafter(str(drafter_path), kind="mtp")
    except ValueError as exc:  # e.g. mlx's "Missing 1 parameters: fc.weight." names no folder
        raise ValueError(f"mlx-vlm could not load the MTP head from {drafter_path}: {exc}") from exc
    model_type = getattr(getattr(draft_model, "config", None), "model_type", None)
    if kind != "mtp" or not str(model_type).endswith("_mtp"):
        # load_drafter(kind="mtp") on a folder no MTP splitter claims loads it
        # as an ordinary model and still answers kind "mtp"
        raise ValueError(
            f"drafter {drafter_path} loaded as a {model_type!r} model (kind {kind!r}), not an MTP head: "
            "mlx-vlm splits embedded mtp.* tensors only for a registered base model_type "
            "(mlx_vlm.speculative.drafters.mtp_split.MTP_SPLITTERS, e.g. 'qwen3_5'; not 'qwen3_5_text')")
    if depth is None:
        depth = int(getattr(draft_model.config, "block_size", 4)) - 1
    return with_scale(MlxVlmBackend(model, processor, draft_model, target_path=target_path, drafter_path=drafter_path,
                                    depth=int(depth), speculation=switch(speculation), guard=switch(guard),
                                    context=context_limit(model.config, context_length)), logit_scale)
