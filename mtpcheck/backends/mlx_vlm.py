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

Penalties and logit bias: mlx-vlm applies its logits processors in plain
decoding but its speculative loop (``run_speculative_rounds``) never receives
them, so with speculation they would be applied to the first token only.
Requests with them run unaccelerated (used=False,
reason=sampling_control_unsupported) or raise SpeculationUnavailableError with
require_acceleration; the penalty context is the whole history (prompt and
output), as in the contract.

The library's speculative path yields no log-probabilities and its plain path
yields the unprocessed ones, so ``logprobs`` is not declared.

Import this module freely: mlx-vlm is imported when a backend is loaded.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculationReport,
    SpeculationRequest,
    SpeculationUnavailableError,
)

MAX_DEPTH = 8  # proposals per round; the one MTP layer is reused recurrently
FLOAT16_NEAR_TIE = 0.03  # nats: about 4 float16 ulps of a logit in [8, 16)
EXTRA = "mlx-vlm"


def fixture_dir() -> Path:
    from mtpcheck.fixture.realbackends import REAL_DIR

    return REAL_DIR / "mlx_vlm"


def require_library(module: str, extra: str):
    """Import `module` or fail with an ImportError that names the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"the {extra!r} backend needs the {extra} library, which is not installed: "
            f"pip install 'mtpcheck[{extra}]' ({exc})"
        ) from exc


def library_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


# -- shared with mtpcheck.backends.mlx_lm: request checks, sampling, output -----


def check_request(req: GenerationRequest, vocab_size: int) -> None:
    """Token ids of the request must fit the vocabulary (ValueError before any work)."""
    for field, ids in (("prompt_tokens", req.prompt_tokens), ("stop_token_ids", req.stop_token_ids or []),
                       ("sampling.logit_bias", list((req.sampling.logit_bias or {}).keys()))):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{field}: token ids {bad[:5]} are outside the vocabulary (size {vocab_size})")


def resolve_drafter(spec: SpeculationRequest, own: str, loaded: str) -> tuple[str | None, str | None]:
    """(reason, message) when the requested drafter is not the one loaded."""
    if spec.drafter in (None, own, loaded):
        return None, None
    return "drafter_unavailable", (
        f"drafter {spec.drafter!r} is not loaded; this backend runs its {own!r} drafter ({loaded})"
    )


def plan_speculation(req: GenerationRequest, default: SpeculationRequest, own: str, loaded: str,
                     fallback_depth: int, max_depth: int, blocked_because: str | None = None):
    """(spec, used, depth, reason, message) for one request; raises before any
    generation when acceleration is required but impossible. `blocked_because`
    names why this library cannot speculate with penalties / logit bias (None:
    it can)."""
    spec = req.speculation or default
    if spec.mode == "off":
        return spec, False, 0, "not_requested", "speculation is off for this call"
    depth = spec.num_draft_tokens or default.num_draft_tokens or fallback_depth
    reason, message = resolve_drafter(spec, own, loaded)
    if reason is None and depth > max_depth:
        reason, message = "depth_exceeds_capability", f"num_draft_tokens={depth} exceeds this adapter's maximum {max_depth}"
    if reason is None and blocked_because and (blockers := req.sampling.speculation_blockers()):
        reason = "sampling_control_unsupported"
        message = f"{', '.join(blockers)}: {blocked_because}; ran unaccelerated"
    if reason is not None:
        if spec.require_acceleration:
            raise SpeculationUnavailableError(reason, message)
        return spec, False, depth, reason, message
    return spec, True, depth, None, None


def library_sampling(sp: SamplingParams) -> dict[str, Any] | None:
    """Arguments of the libraries' own ``make_sampler`` that give the contract's
    processed law exactly, or None when no such arguments exist.

    The libraries' ``make_sampler`` applies top-p, then min-p, then top-k to the
    *untempered* log-probabilities and divides by the temperature last. Min-p
    at temperature T on the tempered law keeps p_i >= m * p_max, i.e. untempered
    p_i >= m**T * p_max; top-k keeps the same set at any temperature; both
    commute with each other. Top-p does not commute with temperature or top-k,
    so it maps exactly only at T == 1 without top-k."""
    T = sp.temperature
    top_p = sp.top_p if sp.top_p is not None and sp.top_p < 1.0 else None
    if top_p is not None and (T != 1.0 or sp.top_k is not None):
        return None
    return {"temp": T, "top_p": top_p or 0.0, "min_p": (sp.min_p or 0.0) ** T if sp.min_p else 0.0,
            "top_k": sp.top_k or 0}


def composed_sampler(sp: SamplingParams, sample_utils):
    """A sampler built from the library's public filters in the contract's order:
    temperature, top-k, top-p, min-p, then a categorical draw."""
    import mlx.core as mx

    T = sp.temperature

    def sampler(logprobs):
        x = logprobs.astype(mx.float32) * (1.0 / T)
        x = x - mx.logsumexp(x, axis=-1, keepdims=True)
        if sp.top_k is not None and sp.top_k < x.shape[-1]:
            x = sample_utils.apply_top_k(x, sp.top_k)
        if sp.top_p is not None and sp.top_p < 1.0:
            x = x - mx.logsumexp(x, axis=-1, keepdims=True)
            x = sample_utils.apply_top_p(x, sp.top_p)
        if sp.min_p:
            x = sample_utils.apply_min_p(x, sp.min_p)
        return mx.random.categorical(x)

    return sampler


def penalty_processors(sp: SamplingParams, context: int, sample_utils) -> list:
    """The library's logits processors for penalties and logit bias, with the
    whole history (prompt + output) as context, as the contract has it."""
    return sample_utils.make_logits_processors(
        sp.logit_bias or None, sp.repetition_penalty, context, sp.presence_penalty, context,
        sp.frequency_penalty, context,
    )


def drive(stream, req: GenerationRequest, eos: list[int], decode, round_end=None):
    """Commit tokens from a library token stream through the project's stop
    matcher (EOS ids, stop strings, budget). Returns the OutputState.

    `stream` yields token ids; `round_end(item) -> bool`, when given, lets the
    caller drain the rest of the current round after a stop (those tokens are
    computed already, never committed) so that its statistics are complete."""
    from mtpcheck.engine.events import OutputState, StopMatcher, commit_tokens

    out = OutputState(prompt_len=len(req.prompt_tokens))
    matcher = StopMatcher(decode, req.stop, eos)
    last = None
    for last in stream:
        tok = last[0] if isinstance(last, tuple) else last
        commit_tokens(out, matcher, [int(tok)], [None], req.max_tokens)
        if out.finish_reason is not None:
            break
    if out.finish_reason is None:  # the library stopped before the budget: publish what is held back
        from mtpcheck.contracts import FinishEvent, TextEvent

        text = matcher.text_of(out.tokens)
        if len(text) > len(out.text_published) and text.startswith(out.text_published):
            out.events.append(TextEvent(text=text[len(out.text_published) :]))
            out.text_published = text
        out.finish_reason = "length"
        out.events.append(FinishEvent(reason="length"))
    if round_end is not None and out.finish_reason == "stop" and last is not None and not round_end(last):
        for item in stream:
            if round_end(item):
                break
    return out


def report(*, requested: bool, used: bool, mode: str, drafter: str | None, depth: int, draft_kind: str,
           runtime: str, reason: str | None, message: str | None, accept_lens: list[int],
           draft_lens: list[int]) -> SpeculationReport:
    drafted, accepted = sum(draft_lens), sum(accept_lens)
    full = sum(a == d for a, d in zip(accept_lens, draft_lens, strict=True))
    return SpeculationReport(
        requested=requested,
        used=used,
        mode=mode,
        drafter=drafter if requested else None,
        num_draft_tokens=depth if used else 0,
        draft_kind=draft_kind if used else None,
        runtime=runtime,
        acceptance_rule="exact_match",
        reason=reason,
        message=message,
        rounds=len(accept_lens),
        drafted=drafted,
        accepted=accepted,
        accept_lens=accept_lens,
        draft_lens=draft_lens,
        acceptance_rate=(accepted / drafted) if drafted else None,
        bonus_tokens=full,
        corrections=len(accept_lens) - full,
    )


def switch(value: str | bool) -> bool:
    """A loader's on/off option (a string from --mtp-backend-option, or a bool)."""
    return value.lower() not in ("off", "false", "0", "no") if isinstance(value, str) else bool(value)


class LibraryBackend:
    """What both library adapters do alike: text through the library's
    tokenizer, ground truth from the decode path (``self.truth``), and the
    result of a driven stream with its speculation report."""

    runtime: str
    tokenizer: Any
    truth: DecodePathLogprobs
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def target_distributions(self, prompt: list[int], continuation: list[int], sampling: SamplingParams) -> np.ndarray:
        if not continuation:
            return np.zeros((0, self.vocab_size))
        check_request(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)), self.vocab_size)
        return self.truth.laws(prompt, continuation, sampling)

    def result(self, out, *, spec: SpeculationRequest, used: bool, depth: int, reason: str | None,
               message: str | None, drafter: str, draft_kind: str, accept_lens: list[int], draft_lens: list[int],
               seed: int) -> GenerationResult:
        """The GenerationResult of a stream `drive` consumed into `out`."""
        return GenerationResult(
            tokens=out.tokens,
            text=out.text_published,
            finish_reason=out.finish_reason,
            logprobs=None,
            events=out.events,
            speculation=report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=drafter,
                               depth=depth, draft_kind=draft_kind, runtime=self.runtime, reason=reason,
                               message=message, accept_lens=accept_lens, draft_lens=draft_lens),
            seed=seed,
        )


class DecodePathLogprobs:
    """Log-probability rows of teacher-forced continuations, computed along the
    library's own speculation-off decode path: the prompt but its last token
    prefilled into a fresh cache, then one token per forward, and the
    log-probabilities taken in the model's dtype (``logits - logsumexp(logits)``),
    as the libraries do before sampling. The law is then the one plain decoding
    samples from, to the last bit: a single full-sequence forward, or
    log-probabilities taken in float64, differ from it by a few float16 ulps,
    enough to move a token across a top-k boundary (docs/backends/mlx-vlm.md,
    "Ground truth").

    The model is fixed once loaded, so rows are memoised (the statistical
    clauses ask twice for the same samples); a continuation that extends or
    prefixes a stored one reuses it.

    `forward(tokens [1, n] mx.array, cache) -> logits [1, n, V]`."""

    def __init__(self, forward, make_cache, size: int = 512):
        self.forward, self.make_cache, self.size = forward, make_cache, size
        self.memo: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def rows(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        import mlx.core as mx

        P, key = len(prompt), tuple(prompt) + tuple(continuation[:-1])
        n = len(continuation)
        for (p, k), v in self.memo.items():
            if p == P and len(k) >= len(key) and k[: len(key)] == key:
                return v[:n]
        cache = self.make_cache()
        if P > 1:
            mx.eval(self.forward(mx.array([list(prompt[:-1])], dtype=mx.int32), cache))
        rows = []
        for tok in key[P - 1 :]:
            logits = self.forward(mx.array([[tok]], dtype=mx.int32), cache)[0, -1]
            rows.append((logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float32))
            mx.async_eval(rows[-1])
        out = np.array(mx.stack(rows), dtype=np.float64)
        if len(self.memo) >= self.size:
            self.memo.pop(next(iter(self.memo)))
        self.memo[(P, key)] = out
        return out

    def laws(self, prompt: list[int], continuation: list[int], sp: SamplingParams) -> np.ndarray:
        """Processed target laws, float64 [len(continuation), V], through
        ``mtpcheck.engine.sampling.process`` (the contract's processing)."""
        from mtpcheck.engine.sampling import process

        rows = self.rows(list(prompt), list(continuation))
        seq = list(prompt) + list(continuation)
        return np.stack([process(rows[i], sp, seq[: len(prompt) + i]) for i in range(len(continuation))])


# -- the backend ----------------------------------------------------------------


class MlxVlmBackend(LibraryBackend):
    """One loaded mlx-vlm target and its MTP drafter. Options of
    :func:`load_mlx_vlm`: path, target, drafter, depth, speculation."""

    runtime = "mlx_vlm"

    def __init__(self, model, processor, drafter, *, target_path: Path, drafter_path: Path, depth: int,
                 speculation: bool):
        self.model, self.processor, self.drafter = model, processor, drafter
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
            speculative_sampling_controls=["temperature", "top_k", "top_p", "min_p", "seed"],
            target_distributions=True,
            logprobs=False,
            traces=False,
            text=True,
            checkpoint_evidence=self.native,
            # float16 logits: an ulp is 2**-7 at the fixture's top logits (8-13), and a
            # multi-token verification may round them differently from a one-token step
            near_tie_logit_gap=FLOAT16_NEAR_TIE,
            notes=(f"qwen3_5_mtp head {self.head_source}, default depth {self.default.num_draft_tokens}; "
                   "position-addressed target "
                   "sampling is mlx-vlm's seeded sampler (temperature/top-k/top-p); with min-p mlx-vlm samples "
                   "from its shared random stream, kept apart from the drafter's; penalties and logit bias "
                   "run unaccelerated"),
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
                                "so these need target-only decoding")

    def generate(self, request: GenerationRequest) -> GenerationResult:
        import mlx.core as mx

        gen = require_library("mlx_vlm.generate", EXTRA)
        sample_utils = require_library("mlx_vlm.sample_utils", EXTRA)
        check_request(request, self.vocab_size)
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
            # target-only: the library's processors over the whole history; an
            # unchunked prefill, because a chunked one leaves the prompt out of
            # the processors' history (docs/backends/mlx-vlm.md)
            context = len(request.prompt_tokens) + request.max_tokens
            kwargs.update(logits_processors=penalty_processors(sp, context, sample_utils), prefill_step_size=None)
        if used:
            kwargs.update(draft_model=self.drafter, draft_kind="mtp", draft_block_size=depth + 1)
            self.drafter.accept_lens, self.drafter.draft_lens = [], []
        eos = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        prompt = mx.array([request.prompt_tokens], dtype=mx.int32)
        mx.random.seed(seed % 2**32)  # the drafter's proposals (and a composed sampler) use the global stream
        stream = gen.generate_step(prompt, self.model, None, None, **kwargs)
        try:
            out = drive(stream, request, eos, self.decode)
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
) -> MlxVlmBackend:
    """Load an mlx-vlm target and its MTP drafter (default: the shipped fixture
    ``mtpcheck/fixture/real/mlx_vlm``: ``target/`` and ``mtp/``).

    Options (strings from --mtp-backend-option): path (folder holding target/
    and mtp/, or native/; or one native checkpoint folder), checkpoint
    (separate|native, :func:`resolve_folders`), target, drafter (a drafter
    folder, or the target folder itself for a native checkpoint with embedded
    ``mtp.*`` tensors), depth (default: the drafter's block_size - 1; mlx-vlm
    gives a native checkpoint's in-memory drafter block_size =
    mtp_num_hidden_layers + 2), speculation (on|off: the loaded default)."""
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
    return MlxVlmBackend(model, processor, draft_model, target_path=target_path, drafter_path=drafter_path,
                         depth=int(depth), speculation=switch(speculation))
