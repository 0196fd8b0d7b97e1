"""Hugging Face transformers' assisted generation as a backend (name "transformers").

Drives transformers through its public entry points only:

* loading: ``LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32,
  local_files_only=True)`` for the target and, in the assistant configuration,
  for the draft model, from the shipped llama fixture
  (``mtpcheck/fixture/real/mlx_lm``: its tensor names and RoPE layout are HF
  llama's, the float16 weights are upcast to float32); the tokenizer is the
  fixture's ``PreTrainedTokenizerFast``. Nothing is downloaded
  (``HF_HUB_OFFLINE=1``, ``local_files_only``).
* generation: ``model.generate(input_ids, max_new_tokens=..., streamer=...)``
  with ``assistant_model=draft`` (configuration ``assistant``: greedy
  assisted generation, and speculative sampling with ``do_sample=True``) or
  ``prompt_lookup_num_tokens=k`` (configuration ``prompt_lookup``), and the
  same call without either with speculation off, on the same loaded target.
* sampling: the request's controls as ``generate`` keywords (``do_sample``,
  ``temperature``, ``top_k`` - always passed, 0 when unset, since the library's
  default is 50 -, ``top_p``, ``min_p``, ``repetition_penalty``,
  ``sequence_bias`` for logit bias, ``eos_token_id``, ``stop_strings``).
  transformers has no presence / frequency penalty: declared in
  ``unsupported_controls``; a request with one raises ValueError.
* seeds: ``torch.manual_seed`` before each call. The CPU generator keeps only the
  low 32 bits of its seed, so the 63-bit request seed is mixed through blake2b
  first (seeds s and s xor 2**32 would otherwise draw the same tokens).
  Draft, acceptance and target draw from torch's one global random stream: seeded
  output is repeatable but differs between speculation on and off at T > 0.

Per-round statistics. ``generate`` calls the streamer's ``put`` once with the
prompt, then once per round of assisted decoding with the tokens the round
emitted (its accepted proposals plus one correction or bonus, as cropped by the
library at the budget or an EOS id; the library's own count is then
``len(put) - 1`` accepted, which the adapter takes). The proposals of each round
are what the library's candidate generator returned: the adapter wraps
``get_candidates`` of the generator ``_get_candidate_generator`` builds for the
call (an instance attribute for the duration of one call; behaviour unchanged)
and records ``candidate_length``. The first output token comes out of round 0
(the prefill forward verifies the first proposals): ``first_token_from_prefill=False``.

Stops and output. The library decides where the output ends: ``max_new_tokens``,
``eos_token_id`` (the request's stop ids, or the model's EOS ids when None;
none for ``[]``), and stop strings through the public
``StoppingCriteriaList([StopStringCriteria(tokenizer, stop_strings)])``
(``generate(stop_strings=...)`` raises ValueError with an assistant: T1). The
result's tokens are every token ``generate`` returned. The project's stop matcher
only publishes the text (cut before the first stop string, as the contract has
it; transformers leaves it in) and marks the stop (StopEvent); tokens the
library emitted after a stop (T2: assisted decoding checks stop strings only at
the end of a round) are reported after the StopEvent, where the suite sees them.

Ground truth: the plain path - the prompt in one prefill forward, then one token
per forward through a ``DynamicCache`` - gives float32 raw logits
(``target_logits``); the processed law is transformers' own
``LogitsProcessorList`` (``model._get_logits_processor`` with the generation
config the call would use: sequence bias, repetition penalty, temperature,
top-k, top-p, min-p), softmax in float64.

Import this module freely: torch and transformers are imported when a backend is loaded.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np

from mtpcheck.backends._library import (
    LibraryBackend,
    check_request,
    context_limit,
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
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculationRequest,
)

MAX_DEPTH = 8
EXTRA = "transformers"
CONFIGS = ("assistant", "prompt_lookup")
TORCH_DTYPES = ("float32", "bfloat16", "float16")
UNSUPPORTED = ["presence_penalty", "frequency_penalty"]
CANCEL_WAIT_S = 120.0  # a closed stream waits this long for its generation to stop (one round, normally)


def fixture_dir() -> Path:
    return real_fixture_dir("mlx_lm")


def torch_seed(seed: int) -> int:
    """A 32-bit torch seed from a 63-bit request seed, through a real hash (the
    CPU generator keeps only the low 32 bits of what torch.manual_seed gets)."""
    digest = hashlib.blake2b(int(seed).to_bytes(8, "little"), digest_size=8, person=b"mtpcheck").digest()
    return int.from_bytes(digest, "little") & 0xFFFFFFFF


def generate_kwargs(sp: SamplingParams) -> dict[str, Any]:
    """The request's sampling controls as ``generate`` keywords (ValueError for
    a control transformers does not have)."""
    missing = [c for c in UNSUPPORTED if getattr(sp, c) not in (None, 0.0)]
    if missing:
        raise ValueError(f"transformers has no {', '.join(missing)} (declared in unsupported_controls)")
    kw: dict[str, Any] = {"do_sample": sp.temperature > 0}
    if sp.temperature > 0:
        kw.update(temperature=sp.temperature, top_k=sp.top_k or 0,
                  top_p=sp.top_p if sp.top_p is not None else 1.0, min_p=sp.min_p or None)
    if sp.repetition_penalty not in (None, 1.0):
        kw["repetition_penalty"] = sp.repetition_penalty
    if sp.logit_bias:
        kw["sequence_bias"] = {(int(t),): float(b) for t, b in sp.logit_bias.items()}
    return kw


class ClientGone(Exception):
    """Raised into the library's generate() from the streamer when the stream's caller has gone away."""


class Recorder:
    """The streamer (``put`` once with the prompt, then once per round) and the
    candidate lengths of each round, from the call's candidate generator."""

    def __init__(self, on_round=None):
        self.puts: list[list[int]] = []
        self.drafts: list[int] = []
        self.on_round = on_round  # called with each round's tokens as the library streams them

    # transformers' BaseStreamer interface (duck-typed: generate calls put / end)
    def put(self, value) -> None:
        self.puts.append([int(t) for t in value.reshape(-1).tolist()])
        if self.on_round is not None and len(self.puts) > 1:
            self.on_round(self.puts[-1])

    def end(self) -> None:
        pass

    def wrap(self, generator):
        inner = generator.get_candidates

        def get_candidates(input_ids, *args, **kwargs):
            ids, logits = inner(input_ids, *args, **kwargs)
            self.drafts.append(int(ids.shape[1] - input_ids.shape[1]))
            return ids, logits

        generator.get_candidates = get_candidates
        return generator


class PlainPath:
    """Raw float32 logits of teacher-forced continuations along transformers'
    plain decode path (one prefill forward, then one token per forward through
    a DynamicCache), memoised; the processed law through the library's own
    logits processors."""

    def __init__(self, model, size: int = 512):
        self.model, self.size = model, size
        self.memo: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        import torch
        from transformers import DynamicCache

        P, key, n = len(prompt), tuple(prompt) + tuple(continuation[:-1]), len(continuation)
        for (p, k), rows in self.memo.items():
            if p == P and len(k) >= len(key) and k[: len(key)] == key:
                return rows[:n]
        cache = DynamicCache(config=self.model.config)
        rows = []
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([list(prompt)]), cache=cache, use_cache=True)
            rows.append(out.logits[0, -1].float())
            for tok in key[P:]:
                out = self.model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
                rows.append(out.logits[0, -1].float())
        arr = torch.stack(rows).numpy().astype(np.float64)
        if len(self.memo) >= self.size:
            self.memo.pop(next(iter(self.memo)))
        self.memo[(P, key)] = arr
        return arr

    def processors(self, sp: SamplingParams, prompt_len: int):
        import copy

        import torch

        gc = copy.deepcopy(self.model.generation_config)
        gc.update(**generate_kwargs(sp))
        gc.update(**gc._get_default_generation_params(), defaults_only=True)
        return self.model._get_logits_processor(generation_config=gc, input_ids_seq_length=prompt_len, device="cpu",
                                                model_kwargs={"attention_mask": torch.ones(1, prompt_len,
                                                                                           dtype=torch.long)})

    def laws(self, prompt: list[int], continuation: list[int], sp: SamplingParams) -> np.ndarray:
        import torch

        raw = self.logits(prompt, continuation)
        procs = self.processors(sp, len(prompt))
        seq = list(prompt) + list(continuation)
        out = np.zeros_like(raw)
        with torch.no_grad():
            for i in range(len(continuation)):
                ids = torch.tensor([seq[: len(prompt) + i]])
                scores = procs(ids, torch.tensor(raw[i], dtype=torch.float32)[None].clone())[0]
                if sp.temperature == 0:
                    out[i, int(np.argmax(scores.numpy()))] = 1.0  # greedy: torch.argmax, first of ties
                else:
                    out[i] = torch.softmax(scores.double(), dim=-1).numpy()
        return out


class TransformersBackend(LibraryBackend):
    """One loaded HF target and, in the assistant configuration, its assistant.
    Options of :func:`load_transformers`."""

    runtime = "transformers"

    def __init__(self, model, tokenizer, assistant, *, config: str, target_path: Path, draft_path: Path | None,
                 depth: int, speculation: bool, eos_ids: list[int], context: int | None,
                 confidence_threshold: float, ngram: int | None, pad_id: int):
        self.model, self.tokenizer, self.assistant, self.pad_id = model, tokenizer, assistant, pad_id
        self.config, self.target_path, self.draft_path = config, target_path, draft_path
        self.logit_dtype = str(model.dtype).removeprefix("torch.")
        self.vocab_size, self.eos_ids, self.context = int(model.config.vocab_size), eos_ids, context
        self.confidence_threshold, self.ngram = confidence_threshold, ngram
        self.own = "assistant" if config == "assistant" else "prompt_lookup"
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter=self.own,
                                          num_draft_tokens=depth)
        self.version = library_version("transformers")
        self.torch_version = library_version("torch")
        self.plain = PlainPath(model)

    def capabilities(self) -> Capabilities:
        assistant = self.config == "assistant"
        return Capabilities(
            name="transformers" if assistant else "transformers-prompt-lookup",
            version=f"transformers {self.version} (torch {self.torch_version})",
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            mtp_kinds=["assistant"] if assistant else ["model_free"],
            max_depth=MAX_DEPTH,
            # prompt lookup proposes 0..k tokens (no match: none); the assistant drafts
            # min(k, room) with the confidence threshold off, 1..k with it on
            drafting="fixed" if assistant and not self.confidence_threshold else "up_to_k",
            # assistant: do_sample=True is rejection sampling (_speculative_sampling), greedy
            # compares argmaxes (rejection with one-hot laws); prompt lookup: sample, then compare
            acceptance_rule="rejection" if assistant else "exact_match",
            first_token_from_prefill=False,  # round 0's verification is the prefill forward
            seeded_determinism=True,
            position_addressed_target_sampling=False,  # one global torch stream
            speculative_sampling_controls=["temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty",
                                           "logit_bias"],
            unsupported_controls=list(UNSUPPORTED),
            top_k_ties="keep_ties",  # TopKLogitsWarper removes only scores below the k-th: ties survive
            target_distributions=True,
            raw_logits=True,
            checkpoint_evidence=True,
            logit_dtype=self.logit_dtype,
            logprobs=True,
            text=True,
            stop_text="special_tokens_kept",  # StopStringCriteria matches the vocabulary's token strings, specials too
            streaming=True,  # generate_stream: the library's streamer, one put per round, through the stop matcher
            **self.declared_context(),
            notes=(f"configuration {self.config}: "
                   + (f"assistant model {self.draft_path}, num_assistant_tokens_schedule=constant, "
                      f"assistant_confidence_threshold={self.confidence_threshold}" if assistant
                      else f"prompt lookup, max_matching_ngram_size={self.ngram or 'library default (2)'}")
                   + "; float32 (fixture float16 upcast); one global torch random stream; the first token comes "
                   "from round 0 (its verification is the prefill); no presence/frequency penalty in transformers"),
        )

    def checkpoints(self) -> dict[str, Path]:
        out = {"target": self.target_path}
        if self.draft_path is not None:
            out["assistant"] = self.draft_path
        return out

    # -- ground truth
    def target_logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        if not continuation:
            return np.zeros((0, self.vocab_size))
        check_request(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)), self.vocab_size,
                      self.context)
        return self.plain.logits(list(prompt), list(continuation))

    def target_distributions(self, prompt: list[int], continuation: list[int], sampling: SamplingParams) -> np.ndarray:
        if not continuation:
            return np.zeros((0, self.vocab_size))
        check_request(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)), self.vocab_size,
                      self.context)
        return self.plain.laws(list(prompt), list(continuation), sampling)

    # -- generation
    def generate(self, request: GenerationRequest, on_round=None) -> GenerationResult:
        import torch

        self.check(request)
        spec, used, depth, reason, message = plan_speculation(request, self.default, self.own,
                                                              str(self.draft_path or "prompt lookup"), 3, MAX_DEPTH)
        sp = request.sampling
        kw = generate_kwargs(sp)
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(2**63)
        eos = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        kw.update(max_new_tokens=request.max_tokens, eos_token_id=eos or None, pad_token_id=self.pad_id,
                  return_dict_in_generate=True, output_scores=True)
        if request.stop:  # generate(stop_strings=...) raises with an assistant (T1): the public criterion instead
            from transformers import StoppingCriteriaList, StopStringCriteria

            kw["stopping_criteria"] = StoppingCriteriaList([StopStringCriteria(tokenizer=self.tokenizer,
                                                                               stop_strings=list(request.stop))])
        rec = Recorder(on_round)
        if used and self.config == "assistant":
            self.assistant.generation_config.num_assistant_tokens = depth
            kw["assistant_model"] = self.assistant
        elif used:
            kw["prompt_lookup_num_tokens"] = depth
            if self.ngram:
                kw["max_matching_ngram_size"] = self.ngram
        ids = torch.tensor([list(request.prompt_tokens)])
        torch.manual_seed(torch_seed(seed))
        if used:
            self.model._get_candidate_generator = self._wrapped(rec)
        try:
            with torch.no_grad():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), streamer=rec, **kw)
        finally:
            self.model.__dict__.pop("_get_candidate_generator", None)
        rounds = rec.puts[1:]  # the first put is the prompt
        emitted = [t for r in rounds for t in r]
        if emitted != out.sequences[0, ids.shape[1]:].tolist():
            raise RuntimeError("transformers' streamer saw other tokens than generate returned")
        state = drive(iter(emitted), request, eos, self.decode)
        tokens, events = list(state.tokens), list(state.events)
        if len(emitted) > len(tokens):  # the library went on past a stop (T2): its tokens, after the StopEvent
            from mtpcheck.contracts import TokenEvent

            extra = [TokenEvent(index=len(tokens) + j, token=t) for j, t in enumerate(emitted[len(tokens):])]
            events = events[:-1] + extra + events[-1:]
            tokens = list(emitted)
        lps = self._logprobs(out.scores, emitted, sp)
        accept_lens, draft_lens = [], []
        if used:
            if len(rec.drafts) != len(rounds):
                raise RuntimeError(f"{len(rec.drafts)} candidate calls but {len(rounds)} rounds streamed")
            accept_lens = [len(r) - 1 for r in rounds]  # the library's count: n_matches + 1 tokens per round
            draft_lens = list(rec.drafts)
        rep = report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=self.own,
                     depth=depth, draft_kind="assistant" if self.config == "assistant" else "model_free",
                     runtime=self.runtime, reason=reason, message=message, accept_lens=accept_lens,
                     draft_lens=draft_lens)
        if used:
            rep = rep.model_copy(update={"acceptance_rule": self.capabilities().acceptance_rule})
        return GenerationResult(tokens=tokens, text=state.text_published, finish_reason=state.finish_reason,
                                logprobs=lps, events=events, speculation=rep, seed=seed)

    def generate_stream(self, request: GenerationRequest):
        """Chunks (dicts of StreamChunk's fields) as the library's streamer
        delivers rounds: :meth:`generate` runs in a thread and each round's
        tokens are published through the project's stop matcher as they arrive
        (text held back while it could still grow into a stop string); tokens
        the library emits after a stop (T2) are carried as it emits them; the
        last chunk carries what text is left and the finish reason of the
        result generate() returns. A caller that closes the stream part-way
        stops the generation at its next round and waits for it, as a server
        aborts a request whose client went away (STREAM-DISCONNECT)."""
        import queue
        import threading

        rounds: queue.Queue = queue.Queue()
        box: dict[str, Any] = {}
        gone = threading.Event()  # the caller closed the stream (a client that went away)

        def on_round(tokens):
            if gone.is_set():  # the streamer has no cancel: an exception from its put ends generate()
                raise ClientGone("the stream's caller went away")
            rounds.put(tokens)

        def work():
            try:
                box["result"] = self.generate(request, on_round=on_round)
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc
            finally:
                rounds.put(None)

        worker = threading.Thread(target=work, daemon=True, name="mtpcheck-transformers-stream")
        worker.start()
        try:
            yield from self._chunks(request, rounds, box)
        except GeneratorExit:  # stop the generation at its next round, before the next request starts
            gone.set()
            worker.join(CANCEL_WAIT_S)
            raise

    def _chunks(self, request: GenerationRequest, rounds, box: dict):
        from mtpcheck.contracts import TextEvent, TokenEvent
        from mtpcheck.engine.events import OutputState, StopMatcher, commit_tokens

        eos = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        out = OutputState(prompt_len=len(request.prompt_tokens))
        matcher = StopMatcher(self.decode, request.stop, eos)
        sent, text = 0, ""
        while (tokens := rounds.get()) is not None:
            after_stop = []
            for tok in tokens:
                if out.finish_reason is None:
                    commit_tokens(out, matcher, [tok], [None], request.max_tokens)
                else:
                    after_stop.append(tok)
            new, sent = out.events[sent:], len(out.events)
            piece = "".join(e.text for e in new if isinstance(e, TextEvent))
            text += piece
            published = [e.token for e in new if isinstance(e, TokenEvent)] + after_stop
            if published or piece:
                yield {"tokens": published, "text": piece, "finish_reason": None}
        if "error" in box:
            raise box["error"]
        result = box["result"]
        yield {"tokens": [], "text": result.text[len(text):], "finish_reason": result.finish_reason}

    def _wrapped(self, rec: Recorder):
        original = type(self.model)._get_candidate_generator.__get__(self.model)

        def build(*args, **kwargs):
            return rec.wrap(original(*args, **kwargs))

        return build

    @staticmethod
    def _logprobs(scores, emitted: list[int], sp: SamplingParams) -> list[float]:
        """log p of each emitted token under the processed law: the library's
        processed scores (one row per emitted token); 0.0 at T = 0 (one-hot law)."""
        import torch

        if len(scores) != len(emitted):
            raise RuntimeError(f"{len(scores)} score rows for {len(emitted)} tokens")
        if sp.temperature == 0:
            return [0.0] * len(emitted)
        out = []
        for row, tok in zip(scores, emitted, strict=True):
            out.append(float(torch.log_softmax(row[0].double(), dim=-1)[tok]))
        return out


def load_transformers(
    config: str = "assistant",
    path: str | Path | None = None,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    depth: int | str = 3,
    speculation: str | bool = True,
    confidence_threshold: float | str = 0.0,
    ngram: int | str | None = None,
    threads: int | str = 1,
    context_length: int | str | None = None,
    logit_scale: float | str | None = None,
    dtype: str = "float32",
) -> TransformersBackend:
    """Load an HF llama target (and its assistant) from local folders, float32
    (default: the shipped fixture ``mtpcheck/fixture/real/mlx_lm``: ``target/``
    and ``draft/``).

    Options (strings from --mtp-backend-option): config (assistant |
    prompt_lookup), path (folder holding target/ and draft/), target, draft,
    depth (default 3: num_assistant_tokens / prompt_lookup_num_tokens),
    speculation (on|off: the loaded default), confidence_threshold (the
    assistant's assistant_confidence_threshold; default 0: off, so every round
    drafts min(depth, room); the library's own default is 0.4), ngram
    (prompt lookup's max_matching_ngram_size; default the library's, 2), threads
    (torch.set_num_threads, default 1), context_length (most prompt tokens;
    default the target's max_position_embeddings), dtype (float32, bfloat16 or
    float16: both models load in it, and the adapter declares it). logit_scale: a bound of |logit| (default 32), the size at which the precision rule counts ulps."""
    if config not in CONFIGS:
        raise ValueError(f"config={config!r}: expected one of {', '.join(CONFIGS)}")
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(TORCH_DTYPES)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = require_library("torch", EXTRA)
    require_library("transformers", EXTRA)
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(int(threads))
    base = Path(path) if path else fixture_dir()
    target_path = Path(target) if target else base / "target"
    draft_path = (Path(draft) if draft else base / "draft") if config == "assistant" else None
    threshold = float(confidence_threshold)
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"confidence_threshold={confidence_threshold!r}: expected a number in [0, 1)")
    if draft_path is not None:
        from mtpcheck.inspect import check_pair

        check_pair(target_path, draft_path)  # AssistantMismatchError: vocabulary or tokenizer differ
    model = LlamaForCausalLM.from_pretrained(str(target_path), dtype=getattr(torch, dtype), local_files_only=True).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(target_path), local_files_only=True)
    eos = model.config.eos_token_id
    eos_ids = sorted({int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    # EOS ids are passed per call (stop_token_ids); none in the loaded generation config
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = pad
    assistant = None
    if draft_path is not None:
        assistant = LlamaForCausalLM.from_pretrained(str(draft_path), dtype=getattr(torch, dtype),
                                                     local_files_only=True).eval()
        assistant.generation_config.eos_token_id = None
        assistant.generation_config.pad_token_id = pad
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = threshold
    backend = TransformersBackend(model, tokenizer, assistant, config=config, target_path=target_path,
                                  draft_path=draft_path, depth=int(depth), speculation=switch(speculation),
                                  eos_ids=eos_ids, context=context_limit(model.config, context_length),
                                  confidence_threshold=threshold, ngram=int(ngram) if ngram else None, pad_id=pad)
    return with_scale(backend, logit_scale)
