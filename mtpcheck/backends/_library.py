"""What the library adapters (:mod:`mtpcheck.backends.mlx_vlm`,
:mod:`mtpcheck.backends.mlx_lm`) share: the base class, the request checks,
the sampling map, the stream driver and the speculation report.

The adapters are thin by default: they hand the request to the library as the
library's own API takes it (names and orders mapped exactly) and refuse only
what the API cannot express (a token id outside the vocabulary, a prompt
longer than the model's context, a drafter or depth that is not loaded).
Known deviations of a library are listed in its xfails file
(``mtpcheck/backends/xfails/``), so a library fix shows as XPASS. The option
``guard=on`` (:data:`GUARD_DOC`) adds the protective behaviour an application
should have: requests the library would mishandle with speculation run
unaccelerated and the report says so (used=False).

No module here imports an adapter; adapters import this one (tests/test_layers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mtpcheck.contracts import (
    GenerationRequest,
    GenerationResult,
    PromptTooLongError,  # noqa: F401 - re-exported for the adapters
    SamplingParams,
    SpeculationReport,
    SpeculationRequest,
    SpeculationUnavailableError,
    check_prompt_length,
)

PENALTY_CONTROLS = ["repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias"]
GUARD_DOC = ("guard=on: requests with controls the library mishandles with speculation run unaccelerated "
             "(used=False, reason sampling_control_unsupported); off (default): passed to the library as is")

MLX_DTYPES = ("float16", "bfloat16", "float32")


def cast(dtype: str, *models) -> None:
    """Option dtype=: every MLX model's parameters cast to that dtype (the precision its logits then have)."""
    if dtype not in MLX_DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(MLX_DTYPES)}")
    import mlx.core as mx

    for m in models:
        m.set_dtype(getattr(mx, dtype))
        mx.eval(m.parameters())  # now: a lazy cast evaluated on the watchdog's thread has no stream there


def dtype_name(model) -> str:
    """The dtype of an MLX model's floating-point weights: the precision of its logits."""
    from mlx.utils import tree_flatten

    kinds = {str(v.dtype).removeprefix("mlx.core.") for _, v in tree_flatten(model.parameters())}
    for name in ("bfloat16", "float16"):  # the fewest mantissa bits win: the logits round there
        if name in kinds:
            return name
    return "float32"


def real_fixture_dir(name: str) -> Path:
    """A shipped real-library fixture folder (``mtpcheck/fixture/real/<name>``)."""
    from mtpcheck.fixture import REAL_DIR

    return REAL_DIR / name


def context_limit(config: Any, option: int | str | None) -> int | None:
    """The prompt bound: the loader's ``context_length`` option, else the
    model config's ``max_position_embeddings`` (None when neither says)."""
    if option not in (None, ""):
        limit = int(option) if str(option).strip().isdigit() else 0
        if limit < 1:
            raise ValueError(f"context_length={option!r}: expected a positive number of tokens")
        return limit
    for cfg in (config, getattr(config, "text_config", None)):
        value = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else getattr(cfg, "max_position_embeddings", None)
        if value:
            return int(value)
    return None


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


def check_request(req: GenerationRequest, vocab_size: int, context: int | None = None) -> None:
    """Token ids of the request must fit the vocabulary and the prompt the
    context (ValueError / PromptTooLongError before any work)."""
    check_prompt_length(req.prompt_tokens, context)
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


def drive_chunks(stream, req: GenerationRequest, eos: list[int], decode, round_end=None):
    """Commit tokens from a library token stream through the project's stop
    matcher (EOS ids, stop strings, budget); a generator that yields, after
    each library item that published anything, one stream chunk (a dict of
    StreamChunk's fields: the tokens and text published since the last chunk;
    finish_reason on the last) and returns the OutputState.

    `stream` yields token ids; `round_end(item) -> bool`, when given, lets the
    caller drain the rest of the current round after a stop (those tokens are
    computed already, never committed) so that its statistics are complete."""
    from mtpcheck.contracts import FinishEvent, TextEvent, TokenEvent
    from mtpcheck.engine.events import OutputState, StopMatcher, commit_tokens

    out = OutputState(prompt_len=len(req.prompt_tokens))
    matcher = StopMatcher(decode, req.stop, eos)
    sent = 0

    def chunk():
        nonlocal sent
        new, sent = out.events[sent:], len(out.events)
        return {"tokens": [e.token for e in new if isinstance(e, TokenEvent)],
                "text": "".join(e.text for e in new if isinstance(e, TextEvent)),
                "finish_reason": out.finish_reason}

    last = None
    try:
        for last in stream:
            tok = last[0] if isinstance(last, tuple) else last
            commit_tokens(out, matcher, [int(tok)], [None], req.max_tokens)
            if out.finish_reason is not None:
                break
            if len(out.events) > sent:
                yield chunk()
    except GeneratorExit:  # the caller went away: close the source now (an HTTP stream drops its connection)
        if hasattr(stream, "close"):
            stream.close()
        raise
    if out.finish_reason is None:  # the library stopped before the budget: publish what is held back
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
    yield chunk()
    return out


def drive(stream, req: GenerationRequest, eos: list[int], decode, round_end=None):
    """:func:`drive_chunks` consumed: the OutputState of the whole stream."""
    return run_to_end(drive_chunks(stream, req, eos, decode, round_end))


def run_to_end(chunks):
    """Consume a generator of chunks; its return value."""
    while True:
        try:
            next(chunks)
        except StopIteration as done:
            return done.value


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


def result_of(out, speculation: SpeculationReport, seed: int | None) -> GenerationResult:
    """The GenerationResult of a token stream `drive` consumed into `out` (an
    OutputState): what was committed and published, with its report."""
    return GenerationResult(tokens=out.tokens, text=out.text_published, finish_reason=out.finish_reason,
                            logprobs=None, events=out.events, speculation=speculation, seed=seed)


def with_scale(backend, logit_scale: float | str | None):
    """`backend` declaring `logit_scale` (option logit_scale=: a bound of |logit|, the size at
    which the precision rule counts ulps; default 32) when given; a bound that is no positive
    number is a clear error."""
    if logit_scale is not None:
        value = float(logit_scale)
        if not value > 0 or value == float("inf"):
            raise ValueError(f"logit_scale={logit_scale!r}: expected a positive number (a bound of |logit|)")
        backend.logit_scale = value
    return backend


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
    context: int | None = None  # most prompt tokens (context_limit); None: unbounded
    guard: bool = False  # GUARD_DOC

    def check(self, req: GenerationRequest) -> None:
        """Refuse what the library cannot express, before any forward."""
        check_request(req, self.vocab_size, self.context)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return run_to_end(self._run(request))

    def generate_stream(self, request: GenerationRequest):
        """Stream chunks (dicts of StreamChunk's fields) in arrival order: what
        each token the library yields publishes, through the same path as
        generate(). For the `streaming` capability (not declared here yet)."""
        yield from self._run(request)

    def _run(self, request: GenerationRequest):
        """A generator of stream chunks returning the GenerationResult."""
        raise NotImplementedError

    logit_scale = 32.0  # a bound of |logit| (Capabilities.logit_scale); option logit_scale=

    def declared_context(self) -> dict[str, Any]:
        """``context_length`` and ``logit_scale`` for Capabilities."""
        return {"context_length": self.context, "logit_scale": self.logit_scale}

    def speculative_controls(self, penalties_reach_library: bool) -> list[str]:
        """The sampling controls declared to hold with speculation: penalties and
        logit bias when the library's speculative API takes them and the guard
        does not route them away."""
        base = ["temperature", "top_k", "top_p", "min_p", "seed"]
        return base + (PENALTY_CONTROLS if penalties_reach_library and not self.guard else [])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def target_distributions(self, prompt: list[int], continuation: list[int], sampling: SamplingParams) -> np.ndarray:
        if not continuation:
            return np.zeros((0, self.vocab_size))
        check_request(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)), self.vocab_size,
                      self.context)
        return self.truth.laws(prompt, continuation, sampling)

    def target_logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        """Capability raw_logits: the target's unprocessed logits along the plain
        decode path (the rows `target_distributions` starts from), float64."""
        if not continuation:
            return np.zeros((0, self.vocab_size))
        check_request(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)), self.vocab_size,
                      self.context)
        return self.truth.logits(list(prompt), list(continuation))

    def result(self, out, *, spec: SpeculationRequest, used: bool, depth: int, reason: str | None,
               message: str | None, drafter: str, draft_kind: str, accept_lens: list[int], draft_lens: list[int],
               seed: int) -> GenerationResult:
        """The GenerationResult of a stream `drive` consumed into `out`."""
        return result_of(out, report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=drafter,
                                     depth=depth, draft_kind=draft_kind, runtime=self.runtime, reason=reason,
                                     message=message, accept_lens=accept_lens, draft_lens=draft_lens), seed)


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

    The raw logits of each row are kept beside it (capability raw_logits,
    :meth:`logits`): penalties and logit bias act on logits, before the
    log-probabilities are taken (the contract's order, and the libraries':
    their logits processors run before ``logsumexp``). Applied to
    log-probabilities instead, the repetition penalty, which divides a positive
    logit and multiplies a negative one, gives another law (every log-probability
    is negative, so it only ever multiplies).

    The model is fixed once loaded, so rows are memoised (the statistical
    clauses ask twice for the same samples); a continuation that extends or
    prefixes a stored one reuses it.

    `forward(tokens [1, n] mx.array, cache) -> logits [1, n, V]`."""

    def __init__(self, forward, make_cache, size: int = 512):
        self.forward, self.make_cache, self.size = forward, make_cache, size
        self.memo: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self.dtype = None  # the model's logits dtype (an mx.Dtype), known after the first forward

    def _both(self, prompt: list[int], continuation: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(log-probability rows, raw logit rows), float64 [len(continuation), V] each."""
        import mlx.core as mx

        P, key = len(prompt), tuple(prompt) + tuple(continuation[:-1])
        n = len(continuation)
        for (p, k), (lp, raw) in self.memo.items():
            if p == P and len(k) >= len(key) and k[: len(key)] == key:
                return lp[:n], raw[:n]
        cache = self.make_cache()
        if P > 1:
            mx.eval(self.forward(mx.array([list(prompt[:-1])], dtype=mx.int32), cache))
        rows, logits_rows = [], []
        for tok in key[P - 1 :]:
            logits = self.forward(mx.array([[tok]], dtype=mx.int32), cache)[0, -1]
            self.dtype = logits.dtype
            logits_rows.append(logits.astype(mx.float32))
            rows.append((logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float32))
            mx.async_eval(rows[-1], logits_rows[-1])
        out = (np.array(mx.stack(rows), dtype=np.float64), np.array(mx.stack(logits_rows), dtype=np.float64))
        if len(self.memo) >= self.size:
            self.memo.pop(next(iter(self.memo)))
        self.memo[(P, key)] = out
        return out

    def rows(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        """Log-probability rows in the model's dtype (as float64)."""
        return self._both(list(prompt), list(continuation))[0]

    def logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        """The raw logits of the same rows (the model's dtype, exactly, as float64)."""
        return self._both(list(prompt), list(continuation))[1]

    def penalised_rows(self, prompt: list[int], continuation: list[int], sp: SamplingParams) -> np.ndarray:
        """Log-probability rows after the logit bias and penalties, applied to the
        raw logits over prompt + continuation so far (the contract's
        ``apply_penalties``, float64), rounded back to the model's dtype and
        normalised there, as the libraries normalise after their processors."""
        import mlx.core as mx

        from mtpcheck.engine.sampling import apply_penalties

        raw = self.logits(prompt, continuation)
        seq = list(prompt) + list(continuation)
        x = np.stack([apply_penalties(raw[i], sp, seq[: len(prompt) + i]) for i in range(len(continuation))])
        # one rounding into the model's dtype (numpy rounds float64 to float16 correctly; via float32 would round twice)
        y = mx.array(x.astype(np.float16)) if self.dtype == mx.float16 else mx.array(x.astype(np.float32)).astype(
            self.dtype or mx.float32)
        return np.array((y - mx.logsumexp(y, axis=-1, keepdims=True)).astype(mx.float32), dtype=np.float64)

    def laws(self, prompt: list[int], continuation: list[int], sp: SamplingParams) -> np.ndarray:
        """Processed target laws, float64 [len(continuation), V], through
        ``mtpcheck.engine.sampling.process`` (the contract's processing); with
        penalties or logit bias, from :meth:`penalised_rows` (the controls on
        logits) and the rest of the processing after them."""
        from mtpcheck.engine.sampling import process

        prompt, continuation = list(prompt), list(continuation)
        if sp.speculation_blockers():
            rows = self.penalised_rows(prompt, continuation, sp)
            rest = sp.model_copy(update=dict.fromkeys(PENALTY_CONTROLS))
            return np.stack([process(row, rest) for row in rows])
        rows = self.rows(prompt, continuation)
        seq = prompt + continuation
        return np.stack([process(rows[i], sp, seq[: len(prompt) + i]) for i in range(len(continuation))])
