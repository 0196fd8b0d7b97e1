"""OpenVINO GenAI's speculative decoding as a backend (name "openvino").

Drives OpenVINO GenAI through its public Python API only:

* models: the shipped llama fixture (``mtpcheck/fixture/real/mlx_lm``, the
  folders the transformers backend loads) converted to float32 OpenVINO IR at
  first use and cached (:mod:`mtpcheck.fixture.ov_export`), or IR folders of
  your own (options ``target`` / ``draft``).
* pipelines: ``LLMPipeline(target, "CPU", draft_model=draft_model(draft, "CPU",
  **props), scheduler_config=..., **props)`` (configuration ``draft``) or
  ``LLMPipeline(target, "CPU", prompt_lookup=True, ...)`` (``prompt_lookup``),
  and a plain ``LLMPipeline(target, "CPU", ...)`` for speculation off: the
  speculative pipeline cannot run a request without drafting
  (``num_assistant_tokens=0`` still drafts), so one adapter holds two
  pipelines over the same IR, with the same properties and scheduler config.
  ``props`` are ``INFERENCE_PRECISION_HINT`` and ``KV_CACHE_PRECISION`` (f32
  by default: a float32 IR runs in bfloat16 on a CPU with avx512_bf16
  otherwise) and ``INFERENCE_NUM_THREADS``.
* generation: ``pipe.generate(ov.Tensor(prompt ids), GenerationConfig,
  streamer)`` with ``max_new_tokens``, ``do_sample``, ``temperature``,
  ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``,
  ``presence_penalty``, ``frequency_penalty``, ``rng_seed`` (the request's
  seed as it is), ``stop_token_ids`` / ``ignore_eos``, ``stop_strings`` with
  ``include_stop_str_in_output=True``, and ``num_assistant_tokens`` (plus
  ``max_ngram_size`` for prompt lookup). OpenVINO GenAI has no logit bias:
  declared in ``unsupported_controls``; a request with one raises ValueError.

Per-round statistics. The streamer's ``write`` receives the prefill's token
alone, then each round's emitted tokens (accepted proposals plus one
correction or bonus) in one call: the accepted counts are observed
(``len(chunk) - 1``). How many tokens the drafter proposed per round is not
exposed (the request's ``extended_perf_metrics`` totals leave out the last
round), so ``draft_lens`` are inferred from the drafting policy,
min(depth, room - 1): ``round_statistics="inferred"``.

Stops and output. The library decides where the output ends; the result's
tokens are every token ``generate`` returned, committed through the project's
stop matcher for the text and events (tokens the library emits after a stop
follow the StopEvent, where the suite sees them). The adapter never cuts or
extends what the library returned.

Runtime errors. An exception from ``generate`` leaves the pipeline unusable
(it then serves every request with no accepted proposal), so the adapter
rebuilds the pipeline that raised and re-raises the library's error as
:class:`OpenVINORuntimeError`, naming it: the suite records it as the failure
of the clause that sent the request (BackendRaised), never as a result.

Ground truth: the same target IR through ``openvino.Core`` (the stateful
model, same precision properties): the prompt in one prefill, then one token
per inference, raw float32 logits (``target_logits``); the processed law in
the runtime's own order (its ``LogitProcessor``): repetition penalty over
prompt and output, presence / frequency penalties over the output with the
runtime's sign rule, then top-k, temperature, min-p, top-p (:func:`ov_law`).

Import this module freely: openvino is imported when a backend is loaded.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from mtpcheck.backends._library import (
    LibraryBackend,
    check_request,
    drive,
    library_version,
    plan_speculation,
    real_fixture_dir,
    report,
    require_library,
    switch,
    with_scale,
)
from mtpcheck.contracts import (
    Capabilities,
    FinishEvent,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculationRequest,
    StopEvent,
    TokenEvent,
)

MAX_DEPTH = 8
EXTRA = "openvino"
CONFIGS = ("draft", "prompt_lookup")
UNSUPPORTED = ["logit_bias"]
PRECISIONS = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


class OpenVINORuntimeError(RuntimeError):
    """openvino_genai raised inside generate(); the pipeline has been rebuilt."""


def penalised(raw: np.ndarray, sp: SamplingParams, prompt: list[int], output: list[int]) -> np.ndarray:
    """The runtime's penalties on one row of raw logits: repetition over the
    prompt and output (divide a positive logit, multiply a negative one);
    presence and frequency over the output only, subtracted from a positive
    logit and *added* to a negative one (openvino.genai's LogitTransformers)."""
    x = np.array(raw, dtype=np.float64)
    if sp.repetition_penalty not in (None, 1.0):
        seen = sorted(set(prompt) | set(output))
        x[seen] = np.where(x[seen] >= 0, x[seen] / sp.repetition_penalty, x[seen] * sp.repetition_penalty)
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=len(x)) if output else np.zeros(len(x))
    for penalty, amount in ((sp.presence_penalty, counts > 0), (sp.frequency_penalty, counts)):
        if penalty:
            delta = penalty * np.asarray(amount, dtype=np.float64)
            x = np.where(x >= 0, x - delta, x + delta)
    return x


def ov_law(raw: np.ndarray, sp: SamplingParams, prompt: list[int], output: list[int]) -> np.ndarray:
    """The law openvino.genai samples from, float64: penalties, then (T > 0)
    top-k, softmax(logits / T), min-p (p >= min_p * max p), top-p (the most
    probable tokens up to and including the one where the running sum first
    exceeds top_p); T = 0: one-hot at the argmax (lowest id on ties)."""
    x = penalised(raw, sp, prompt, output)
    out = np.zeros_like(x)
    if sp.temperature == 0:
        out[int(np.argmax(x))] = 1.0
        return out
    keep = np.ones(len(x), dtype=bool)
    if sp.top_k is not None and sp.top_k < len(x):
        order = np.lexsort((np.arange(len(x)), -x))
        keep[:] = False
        keep[order[: sp.top_k]] = True
    z = np.where(keep, x / sp.temperature, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if sp.min_p:
        p = np.where(p >= sp.min_p * p.max(), p, 0.0)
        p /= p.sum()
    if sp.top_p is not None and sp.top_p < 1.0:
        order = np.lexsort((np.arange(len(p)), -p))
        cum = np.cumsum(p[order])
        n = int(np.searchsorted(cum, sp.top_p, side="right")) + 1  # first index with cum > top_p, included
        mask = np.zeros(len(p), dtype=bool)
        mask[order[: min(n, len(p))]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


class CorePath:
    """Raw float32 logits of teacher-forced continuations from the target IR
    through ``openvino.Core`` (the stateful model: one prefill inference, then
    one token per inference), memoised."""

    def __init__(self, compiled, size: int = 512):
        self.compiled, self.size = compiled, size
        self.memo: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def _infer(self, request, ids: list[int], start: int) -> np.ndarray:
        n = len(ids)
        out = request.infer({"input_ids": np.array([ids], dtype=np.int64),
                             "attention_mask": np.ones((1, start + n), dtype=np.int64),
                             "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
                             "beam_idx": np.zeros(1, dtype=np.int32)})
        return np.array(out["logits"][0, -1], dtype=np.float32)

    def logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        P, key, n = len(prompt), tuple(prompt) + tuple(continuation[:-1]), len(continuation)
        for (p, k), rows in self.memo.items():
            if p == P and len(k) >= len(key) and k[: len(key)] == key:
                return rows[:n]
        request = self.compiled.create_infer_request()
        request.reset_state()
        rows = [self._infer(request, list(prompt), 0)]
        for i, tok in enumerate(key[P:]):
            rows.append(self._infer(request, [tok], P + i))
        arr = np.stack(rows).astype(np.float64)
        if len(self.memo) >= self.size:
            self.memo.pop(next(iter(self.memo)))
        self.memo[(P, key)] = arr
        return arr

    def laws(self, prompt: list[int], continuation: list[int], sp: SamplingParams) -> np.ndarray:
        raw = self.logits(prompt, continuation)
        return np.stack([ov_law(raw[i], sp, list(prompt), list(continuation[:i])) for i in range(len(continuation))])


class Chunks:
    """The streamer: each ``write`` call's tokens, as one list (the prefill's
    token, then one list per round)."""

    def __init__(self):
        import openvino_genai as ov_genai

        class Streamer(ov_genai.StreamerBase):
            def __init__(inner):
                super().__init__()
                inner.chunks: list[list[int]] = []

            def write(inner, token):
                inner.chunks.append([int(t) for t in token] if isinstance(token, list) else [int(token)])
                return ov_genai.StreamingStatus.RUNNING

            def end(inner):
                pass

        self.streamer = Streamer()

    @property
    def chunks(self) -> list[list[int]]:
        return self.streamer.chunks


class OpenVINOBackend(LibraryBackend):
    """A speculative and a plain OpenVINO GenAI pipeline over one target IR.
    Options of :func:`load_openvino`."""

    runtime = "openvino"

    def __init__(self, *, config: str, target_ir: Path, draft_ir: Path | None, sources: dict[str, Path],
                 depth: int, speculation: bool, ngram: int, precision: str, prefix_caching: bool, threads: int,
                 context: int | None):
        import openvino as ov
        import openvino_genai as ov_genai

        self.ov, self.ov_genai = ov, ov_genai
        self.config, self.target_ir, self.draft_ir, self.sources = config, target_ir, draft_ir, sources
        self.ngram, self.precision, self.prefix_caching, self.threads = ngram, precision, prefix_caching, threads
        self.context = context
        self.props = {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": precision,
                      "INFERENCE_NUM_THREADS": threads}
        self.own = "draft" if config == "draft" else "prompt_lookup"
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter=self.own,
                                          num_draft_tokens=depth)
        self.version = library_version("openvino-genai")
        self.errors: list[str] = []  # runtime errors raised (and the pipeline rebuilt), in order
        self.spec = self._pipeline(speculative=True)
        self.plain = self._pipeline(speculative=False)
        self.tokenizer = self.plain.get_tokenizer()
        self.eos_ids = sorted({int(self.tokenizer.get_eos_token_id())} - {-1})
        compiled = ov.Core().compile_model(str(target_ir / "openvino_model.xml"), "CPU", self.props)
        self.vocab_size = int(compiled.output("logits").get_partial_shape()[-1].get_length())
        self.truth = CorePath(compiled)

    def _pipeline(self, speculative: bool):
        g = self.ov_genai
        sc = g.SchedulerConfig()
        sc.enable_prefix_caching = self.prefix_caching
        kw: dict[str, Any] = {"scheduler_config": sc, **self.props}
        if speculative and self.config == "draft":
            kw["draft_model"] = g.draft_model(str(self.draft_ir), "CPU", **self.props)
        elif speculative:
            kw["prompt_lookup"] = True
        return g.LLMPipeline(str(self.target_ir), "CPU", **kw)

    def capabilities(self) -> Capabilities:
        draft = self.config == "draft"
        return Capabilities(
            name="openvino" if draft else "openvino-prompt-lookup",
            version=f"openvino-genai {self.version} (openvino {library_version('openvino')})",
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            mtp_kinds=["assistant"] if draft else ["model_free"],
            max_depth=MAX_DEPTH,
            drafting="fixed" if draft else "up_to_k",  # prompt lookup proposes nothing without a match
            # the runtime samples the target at each position and keeps proposals while they equal it
            acceptance_rule="exact_match",
            first_token_from_prefill=True,  # the streamer's first write is the prefill's token alone
            round_statistics="inferred",  # accepted counts observed per round; draft_lens min(depth, room - 1)
            seeded_determinism=True,
            position_addressed_target_sampling=False,
            speculative_sampling_controls=["temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty",
                                           "presence_penalty", "frequency_penalty"],
            penalty_history="output_only",  # presence / frequency over the generated tokens (OpenAI's convention)
            unsupported_controls=list(UNSUPPORTED),
            target_distributions=True,
            raw_logits=True,
            checkpoint_evidence=True,
            logit_dtype=PRECISIONS[self.precision],
            logprobs=False,
            text=True,
            **self.declared_context(),
            notes=(f"configuration {self.config}: "
                   + (f"draft model {self.draft_ir}" if draft else f"prompt lookup, max_ngram_size={self.ngram}")
                   + f"; target IR {self.target_ir}; INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION "
                   f"{self.precision}; prefix caching {'on' if self.prefix_caching else 'off'}; a plain "
                   "LLMPipeline serves speculation off; checkpoints() names the HF folders the IR was converted "
                   f"from; runtime errors so far: {len(self.errors)} (each re-raised, pipeline rebuilt)"),
        )

    def checkpoints(self) -> dict[str, Path]:
        """The HF checkpoints the IR was converted from (the IR itself is no
        safetensors folder): evidence of what runs, declared as its source."""
        return dict(self.sources)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def target_distributions(self, prompt: list[int], continuation: list[int], sampling: SamplingParams) -> np.ndarray:
        if not continuation:
            return np.zeros((0, self.vocab_size))
        check_request(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)), self.vocab_size,
                      self.context)
        return self.truth.laws(list(prompt), list(continuation), sampling)

    def generation_config(self, pipe, request: GenerationRequest, seed: int, depth: int | None):
        sp = request.sampling
        if sp.logit_bias:
            raise ValueError("openvino_genai has no logit bias (declared in unsupported_controls)")
        c = pipe.get_generation_config()
        c.max_new_tokens = request.max_tokens
        c.do_sample = sp.temperature > 0
        if sp.temperature > 0:
            c.temperature = sp.temperature
            if sp.top_k is not None:
                c.top_k = sp.top_k
            c.top_p = sp.top_p if sp.top_p is not None else 1.0
            c.min_p = sp.min_p or 0.0
        c.repetition_penalty = sp.repetition_penalty or 1.0
        c.presence_penalty = sp.presence_penalty or 0.0
        c.frequency_penalty = sp.frequency_penalty or 0.0
        c.rng_seed = seed
        stop_ids = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        c.stop_token_ids = set(stop_ids)
        c.ignore_eos = not stop_ids  # []: no token stops the output
        if request.stop:
            c.stop_strings = set(request.stop)
            c.include_stop_str_in_output = True  # the project's matcher cuts the text; the tokens stay whole
        if depth is not None:
            c.num_assistant_tokens = depth
            if self.config == "prompt_lookup":
                c.max_ngram_size = self.ngram
        return c

    def _rebuild(self, speculative: bool, exc: BaseException) -> None:
        self.errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        if speculative:
            self.spec = self._pipeline(speculative=True)
        else:
            self.plain = self._pipeline(speculative=False)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        self.check(request)
        loaded = str(self.draft_ir) if self.config == "draft" else "prompt lookup"
        spec, used, depth, reason, message = plan_speculation(request, self.default, self.own, loaded, 3, MAX_DEPTH)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(2**63)
        pipe = self.spec if used else self.plain
        cfg = self.generation_config(pipe, request, seed, depth if used else None)
        rec = Chunks()
        ids = self.ov.Tensor(np.array([list(request.prompt_tokens)], dtype=np.int64))
        try:
            out = pipe.generate(ids, cfg, rec.streamer)
        except Exception as exc:  # the pipeline is unusable after an error: rebuild it, then report the error
            self._rebuild(used, exc)
            raise OpenVINORuntimeError(
                f"openvino_genai {'speculative' if used else 'plain'} LLMPipeline.generate raised "
                f"{type(exc).__name__}: {str(exc).strip()[:400]} (pipeline rebuilt; runtime error "
                f"{len(self.errors)} of this run)") from exc
        emitted = [int(t) for t in out.tokens[0]]
        streamed = [t for c in rec.chunks for t in c]
        if streamed != emitted:
            raise RuntimeError(f"openvino_genai's streamer saw {len(streamed)} tokens, generate returned "
                               f"{len(emitted)}: the rounds cannot be read from the stream")
        eos = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        state = drive(iter(emitted), request, eos, self.decode)
        tokens, events = list(state.tokens), list(state.events)
        if len(emitted) > len(tokens):  # the library went on past a stop: its tokens, after the StopEvent
            extra = [TokenEvent(index=len(tokens) + j, token=t) for j, t in enumerate(emitted[len(tokens):])]
            events = events[:-1] + extra + events[-1:]
            tokens = list(emitted)
        finish = state.finish_reason
        if finish == "length" and len(emitted) < request.max_tokens:
            # the library ended the output before the budget by a rule of its own (an EOS outside the request's
            # list, a stop string one token early): report that stop as it is, never as a spent budget
            last = emitted[-1] if emitted else None
            matched = f"eos:{last}" if last in self.eos_ids else "library stop: no stop id or string of the request"
            events = events[:-1] + [StopEvent(matched=matched), FinishEvent(reason="stop")]
            finish = "stop"
        accept_lens, draft_lens = [], []
        if used:
            done = len(rec.chunks[0]) if rec.chunks else 0
            for chunk in rec.chunks[1:]:
                accept_lens.append(len(chunk) - 1)
                draft_lens.append(min(depth, request.max_tokens - done - 1))
                done += len(chunk)
        rep = report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=self.own,
                     depth=depth, draft_kind="assistant" if self.config == "draft" else "model_free",
                     runtime=self.runtime, reason=reason, message=message, accept_lens=accept_lens,
                     draft_lens=draft_lens)
        return GenerationResult(tokens=tokens, text=state.text_published, finish_reason=finish,
                                logprobs=None, events=events, speculation=rep, seed=seed)


def load_openvino(
    config: str = "draft",
    target: str | Path | None = None,
    draft: str | Path | None = None,
    depth: int | str = 3,
    speculation: str | bool = True,
    ngram: int | str = 3,
    precision: str = "f32",
    prefix_caching: str | bool = False,
    threads: int | str = 1,
    context_length: int | str | None = None,
    logit_scale: float | str | None = None,
) -> OpenVINOBackend:
    """Load OpenVINO GenAI pipelines over IR folders (default: the shipped
    llama fixture ``mtpcheck/fixture/real/mlx_lm`` converted to float32 IR at
    first use, cached).

    Options (strings from --mtp-backend-option): config (draft |
    prompt_lookup), target, draft (IR folders, or HF llama folders to convert),
    depth (default 3: num_assistant_tokens; a request's num_draft_tokens
    overrides it per call), speculation (on|off: the loaded default), ngram
    (prompt lookup's max_ngram_size, default 3), precision (f32 | bf16 | f16:
    INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION on both models and the
    ground truth; default f32), prefix_caching (on|off, default off: on, the
    LLMPipeline default, sampled speculation raises, docs/backends/openvino.md
    O1), threads (INFERENCE_NUM_THREADS, default 1), context_length (most
    prompt tokens; default the target's max_position_embeddings). logit_scale: a bound of |logit| (default 32), the size at which the precision rule counts ulps."""
    if config not in CONFIGS:
        raise ValueError(f"config={config!r}: expected one of {', '.join(CONFIGS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
    require_library("openvino", EXTRA)
    require_library("openvino_genai", EXTRA)
    from mtpcheck.backends._library import context_limit

    base = real_fixture_dir("mlx_lm")
    sources = {"target": Path(target) if target else base / "target"}
    if config == "draft":
        sources["assistant"] = Path(draft) if draft else base / "draft"
        from mtpcheck.inspect import check_pair

        if not (sources["target"] / "openvino_model.xml").exists():
            check_pair(sources["target"], sources["assistant"])  # AssistantMismatchError: vocabularies differ
    irs = {role: ir_of(folder) for role, folder in sources.items()}
    import json

    cfg = json.loads((irs["target"] / "config.json").read_text()) if (irs["target"] / "config.json").exists() else {}
    return with_scale(OpenVINOBackend(config=config, target_ir=irs["target"], draft_ir=irs.get("assistant"),
                                      sources=sources, depth=int(depth), speculation=switch(speculation),
                                      ngram=int(ngram), precision=precision, prefix_caching=switch(prefix_caching),
                                      threads=int(threads), context=context_limit(cfg, context_length)), logit_scale)


def ir_of(folder: Path) -> Path:
    """An IR folder as it is; an HF folder converted (cached)."""
    if (folder / "openvino_model.xml").exists():
        return folder
    require_library("optimum.intel", EXTRA)
    require_library("openvino_tokenizers", EXTRA)
    from mtpcheck.fixture.ov_export import cached_export

    return cached_export(folder)
