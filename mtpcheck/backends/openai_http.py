"""OpenAI-compatible completion servers as a backend (name "openai-http"):
vLLM, SGLang, llama-server's ``/v1/completions``.

The runtime is two endpoints given as URLs: ``url=`` serves speculative
decoding (at one depth, ``depth=``, the server's own setting) and
``plain_url=`` the same model without it (speculation off, and the ground
truth). ``launch=llama-server`` starts both from the llama-server backend
(options ``config``, ``depth``, ``draft_sampling``, ``server`` as there)
instead and stops them on close.

Requests: ``POST /v1/completions`` with token-id prompts (``prompt: [ids]``),
``max_tokens``, ``seed``, ``temperature``, ``top_p``, ``presence_penalty``,
``frequency_penalty``, ``logit_bias`` (OpenAI fields) and the extension
fields of the server's dialect (``dialect=``) for the rest; a contract field
the dialect cannot carry is refused (:class:`UnsupportedControl`), never dropped:

* ``llama.cpp``: llama-server's own names (``top_k``, ``min_p``,
  ``repeat_penalty`` with ``repeat_last_n: -1``, the sampler order
  ``samplers``), ``verbose: true`` for the generated token ids
  (``__verbose.tokens``), ``timings_per_token`` in a stream for the rounds;
* ``vllm``: ``top_k``, ``min_p``, ``repetition_penalty`` (vLLM's extra
  sampling parameters), ``return_token_ids``; vLLM's sampler order is its own;
* ``sglang``: ``top_k``, ``min_p``, ``repetition_penalty``.

Token ids come from the response's token-id fields, never from text. The
speculation report needs per-request counters: llama.cpp's streamed
``timings.draft_n`` / ``draft_n_accepted``; vLLM's per-step arrays in
``metrics.speculative_decoding`` (a server started with
``--per-request-spec-decode-metrics detailed``; read by
:mod:`mtpcheck.backends.httpserver`, as the ``vllm`` backend reads them).
SGLang exposes its counters only as server-wide metrics: with that dialect a
speculative request raises :class:`NoSpeculationCounters` (not run here;
docs/backends/openai-http.md). With vLLM, min_p and logit_bias go to
``plain_url`` (vLLM refuses them with speculation), and the request's stops
are sent as vLLM's ``ignore_eos`` / ``stop_token_ids`` (no resume after EOS).

Ground truth: ``logprobs: N`` (top N log-probabilities; with llama.cpp
``post_sampling_probs`` makes them the processed law) of one-token
completions along the plain decoding path. The laws are declared truncated
(``truncated_laws=N``): the statistical clauses pool ranks beyond N.
"""

from __future__ import annotations

import math
import random

from mtpcheck.backends.httpserver import (
    Client,
    ServerError,
    ServerTruth,
    constraint_fields,
    grammar_fields,
    kept_rounds,
    openai_top,
    post_logprobs,
    serve_together,
    slots_option,
    token_logprobs,
    vllm_refused_controls,
    vllm_rounds,
    vllm_steps,
    vllm_stop_fields,
)
from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    MtpCheckError,
    SamplingParams,
    SpeculationRequest,
)

DIALECTS = ("llama.cpp", "vllm", "sglang")
SEED_MOD = 2**32 - 1


class UnsupportedControl(MtpCheckError):
    """A contract field this server dialect cannot carry."""


class NoSpeculationCounters(MtpCheckError):
    """The server gives no per-request speculation counters."""


def completion_body(sp: SamplingParams, dialect: str) -> dict:
    body: dict = {"temperature": sp.temperature, "top_p": sp.top_p if sp.top_p is not None else 1.0,
                  "presence_penalty": sp.presence_penalty or 0.0, "frequency_penalty": sp.frequency_penalty or 0.0}
    if sp.logit_bias:
        body["logit_bias"] = {str(int(t)): float(b) for t, b in sorted(sp.logit_bias.items())}
    if dialect == "llama.cpp":
        from mtpcheck.backends.llama_server import sampling_body

        return sampling_body(sp)  # llama-server reads its own names on /v1/completions too
    body["top_k"] = sp.top_k if sp.top_k is not None else -1
    body["min_p"] = sp.min_p or 0.0
    body["repetition_penalty"] = sp.repetition_penalty if sp.repetition_penalty is not None else 1.0
    return body


class OpenAIHttpBackend(ServerTruth):
    runtime = "openai-http"

    def __init__(self, *, url: str, plain_url: str, model: str, dialect: str, depth: int, kind: str,
                 top_logprobs: int, vocab_size: int, eos_ids: list[int], speculation: bool,
                 tokenizer=None, owner=None, rule: str = "exact_match", slots: int = 4,
                 logit_dtype: str = "bfloat16", logit_scale: float = 32.0):
        self.spec, self.plain = Client(url), Client(plain_url)
        self.model, self.dialect, self.depth, self.kind = model, dialect, depth, kind
        self.top_logprobs, self.vocab_size, self.eos_ids = top_logprobs, vocab_size, eos_ids
        self.tokenizer, self.owner, self.rule, self.slots = tokenizer, owner, rule, slots
        self.logit_dtype, self.logit_scale = logit_dtype, logit_scale
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter=kind,
                                          num_draft_tokens=depth)

    def close(self) -> None:
        self.spec.close()
        self.plain.close()
        if self.owner is not None:
            self.owner.close()

    def pids(self) -> list[int]:
        return self.owner.pids() if self.owner is not None else []

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name="openai-http",
            version=f"{self.dialect} at {self.spec.url}",
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            mtp_kinds=["embedded" if self.kind == "mtp" else "assistant"],
            max_depth=self.depth,
            depths=[self.depth],  # the server's speculative depth is set at launch
            acceptance_rule=self.rule,
            first_token_from_prefill=True,
            # vLLM's per-step counters are observed; llama.cpp's rounds are replayed from its stream
            round_statistics="observed" if self.dialect == "vllm" else "replayed",
            seeded_determinism=True,
            speculative_sampling_controls=[c for c in ("temperature", "top_k", "top_p", "min_p", "seed",
                                                       "repetition_penalty", "presence_penalty", "frequency_penalty",
                                                       "logit_bias")
                                           if self.dialect != "vllm" or c not in ("min_p", "logit_bias")],
            target_distributions=True,
            truncated_laws=self.top_logprobs if self.top_logprobs < self.vocab_size else None,
            logit_dtype=self.logit_dtype,
            logit_scale=self.logit_scale,
            logprobs=True,  # the OpenAI field `logprobs`, read back per token (NaN where the server gives none)
            generate_batch=True,
            concurrent=self.slots > 1,
            streaming=self.dialect in ("vllm", "llama.cpp"),  # the server's own SSE stream (generate_stream)
            text=self.tokenizer is not None,
            # vLLM's structured_outputs.choice (as the vllm backend), llama.cpp's `grammar` (GBNF, as llama-server)
            request_constraints=self.dialect in ("vllm", "llama.cpp") and self.tokenizer is not None,
            notes=(f"speculative endpoint {self.spec.url} (depth {self.depth}), plain endpoint {self.plain.url}; "
                   f"ground truth from the top {self.top_logprobs} log-probabilities; generate_batch: {self.slots} "
                   "concurrent connections"),
        )

    def _body(self, prompt, n, sp, seed) -> dict:
        body = {"model": self.model, "prompt": list(prompt), "max_tokens": n, "seed": seed, "stream": False,
                **completion_body(sp, self.dialect)}
        if self.dialect == "llama.cpp":
            body.update({"verbose": True, "return_tokens": True, "cache_prompt": True})
        elif self.dialect == "vllm":
            body["return_token_ids"] = True
        return body

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Capability `concurrent`: `slots` concurrent connections (httpserver.serve_together)."""
        return serve_together(self.generate, requests, self.slots)

    def _logprobs_fields(self) -> dict:
        # llama.cpp: post-sampling probabilities, the processed law; vLLM: its server's --logprobs-mode decides
        return {"logprobs": 1, "post_sampling_probs": True} if self.dialect == "llama.cpp" else {"logprobs": 0}

    def _sampled_logprobs(self, out: dict, n: int) -> list[float]:
        """The sampled tokens' logprobs as the response gives them; NaN where it gives none."""
        lp = (out.get("choices") or [{}])[0].get("logprobs") or {}
        if lp.get("content") is not None:  # llama.cpp: [{id, prob | logprob, top_...}]
            vals = [math.log(e["prob"]) if e.get("prob") else (-math.inf if e.get("prob") == 0 else e.get("logprob"))
                    for e in lp["content"]]
        else:  # OpenAI legacy: token_logprobs
            vals = list(lp.get("token_logprobs") or [])
        return token_logprobs(vals, n)

    def _tokens(self, out: dict) -> list[int]:
        choice = (out.get("choices") or [{}])[0]
        toks = choice.get("token_ids")
        if toks is None:
            toks = (out.get("__verbose") or {}).get("tokens")
        if toks is None:
            raise ServerError(f"{self.dialect}: the response carries no token ids (token_ids / __verbose.tokens); "
                              "text is never re-tokenized")
        n = (out.get("usage") or {}).get("completion_tokens")
        if n is not None and n != len(toks):
            raise ServerError(f"usage.completion_tokens={n} but {len(toks)} token ids returned")
        return [int(t) for t in toks]

    def _start(self, request: GenerationRequest):
        """What generate() and generate_stream() begin with: the request checked
        and planned, its seed, the endpoint that serves it, its stops."""
        from mtpcheck.backends._library import check_request, plan_speculation

        check_request(request, self.vocab_size)
        spec, used, depth, reason, message = plan_speculation(request, self.default, self.kind, self.spec.url,
                                                              self.depth, self.depth)
        if used and depth != self.depth:
            reason, message, used = "depth_exceeds_capability", f"the endpoint runs depth {self.depth} only", False
        if used and self.dialect == "sglang":
            raise NoSpeculationCounters(f"{self.dialect}: no per-request speculation counters; "
                                        "the report cannot be filled (docs/backends/openai-http.md)")
        if used and self.dialect == "vllm" and (refused := vllm_refused_controls(request.sampling)):
            from mtpcheck.contracts import SpeculationUnavailableError

            reason, message, used = "sampling_control_unsupported", (
                f"{', '.join(refused)}: vLLM refuses them with speculative decoding; served by plain_url"), False
            if spec.require_acceleration:
                raise SpeculationUnavailableError(reason, message)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(SEED_MOD)
        stops = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        return spec, used, depth, reason, message, seed, self.spec if used else self.plain, stops

    def _segment_body(self, request: GenerationRequest, sent: list[int], segment: int, seed: int) -> dict:
        """The body of one segment (llama.cpp: resumed after an EOS the request does not stop at)."""
        body = self._body(list(request.prompt_tokens) + sent, request.max_tokens - len(sent), request.sampling,
                          (seed + 7919 * segment) % SEED_MOD)
        if self.dialect == "vllm":  # vLLM's own stops: no resume after EOS
            body.update(vllm_stop_fields(request.stop_token_ids, self.eos_ids))
            body.update(constraint_fields(request))
        elif self.dialect == "llama.cpp":
            body.update(grammar_fields(request, self.eos_ids))
        return body

    def _resumes(self, finish: str | None, got: list[int], stops: list[int], emitted: int, max_tokens: int) -> bool:
        """The server stopped at its EOS, the request does not stop there and has budget left."""
        eos_stop = finish == "stop" and bool(got) and got[-1] in self.eos_ids
        return eos_stop and got[-1] not in stops and emitted < max_tokens

    def generate_stream(self, request: GenerationRequest):
        """Capability `streaming` (vllm and llama.cpp dialects): the server's own
        SSE stream of ``/v1/completions``, each chunk's token ids (vLLM
        ``token_ids``, llama.cpp ``__verbose.tokens``) put through the stop
        matcher as they arrive; resumed after an EOS the request does not stop
        at, as generate() resumes. What the stream leaves out or repeats
        reaches STREAM-COMMIT-ONLY as it is."""
        from mtpcheck.backends._library import drive_chunks

        _, _, _, _, _, seed, client, stops = self._start(request)

        def tokens():
            sent, segment = [], 0
            while len(sent) < request.max_tokens:
                got, finish = [], None
                events = client.stream("/v1/completions", {**self._segment_body(request, sent, segment, seed),
                                                           "stream": True})
                try:
                    for chunk in events:
                        choice = (chunk.get("choices") or [{}])[0]
                        finish = choice.get("finish_reason") or finish
                        ids = choice.get("token_ids")
                        for t in ids if ids is not None else (chunk.get("__verbose") or {}).get("tokens") or []:
                            got.append(int(t))
                            yield int(t)
                finally:
                    events.close()
                sent += got
                segment += 1
                if not self._resumes(finish, got, stops, len(sent), request.max_tokens):
                    return

        yield from drive_chunks(tokens(), request, stops, self.decode if self.tokenizer else (lambda t: ""))

    def generate(self, request: GenerationRequest) -> GenerationResult:
        from mtpcheck.backends._library import drive, report, result_of
        from mtpcheck.backends.llama_server import Round, rounds_from_stream, trim_to

        spec, used, depth, reason, message, seed, client, stops = self._start(request)
        tokens: list[int] = []
        logprobs: list[float] = []
        rounds: list = []
        segment = 0
        while len(tokens) < request.max_tokens:
            body = self._segment_body(request, tokens, segment, seed)
            out, answered = post_logprobs(lambda b: client.post("/v1/completions", b), body,  # vLLM's V10
                                          self._logprobs_fields() if request.logprobs else {},
                                          retry=self.dialect == "vllm")
            got = self._tokens(out)
            if request.logprobs:
                logprobs += self._sampled_logprobs(out, len(got)) if answered else [math.nan] * len(got)
            finish = (out.get("choices") or [{}])[0].get("finish_reason")
            if used and self.dialect == "vllm":  # --per-request-spec-decode-metrics detailed
                steps = vllm_steps(out)
                if steps is None:
                    raise NoSpeculationCounters("vllm: the response has no metrics.speculative_decoding; start "
                                                "the server with --per-request-spec-decode-metrics detailed")
                rounds = vllm_rounds(steps, list(request.prompt_tokens), got)[0]
            elif used:
                chunks = client.stream("/v1/completions", {**body, "stream": True, "timings_per_token": True})
                seg_rounds, _ = rounds_from_stream(({**(c.get("__verbose") or {}), "timings": c.get("timings")}
                                                    for c in chunks), got, depth)
                if segment:
                    seg_rounds.insert(0, Round(0, 0, 0))
            resume = self._resumes(finish, got, stops, len(tokens) + len(got), request.max_tokens)
            if used and self.dialect == "llama.cpp":
                if resume:
                    trim_to(seg_rounds, len(got) - (0 if segment else 1))
                rounds += seg_rounds
            tokens += got
            segment += 1
            if not resume:
                break
        state = drive(iter(tokens), request, stops, self.decode if self.tokenizer else (lambda t: ""))
        from mtpcheck.backends.llama_server import LlamaServerBackend

        if self.dialect == "vllm":
            acc, dr = kept_rounds(rounds, len(state.tokens))
        else:
            acc, dr = LlamaServerBackend._kept_rounds(rounds, len(state.tokens))
        rep = report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=self.spec.url,
                     depth=depth, draft_kind=self.kind, runtime=self.runtime, reason=reason, message=message,
                     accept_lens=acc, draft_lens=dr).model_copy(update={"acceptance_rule": self.rule})
        res = result_of(state, rep, seed)
        return res.model_copy(update={"logprobs": logprobs[: len(res.tokens)]}) if request.logprobs else res

    # -- ground truth (httpserver.ServerTruth): the top N of the plain endpoint, truncated below N
    def law_n(self) -> int:
        return self.top_logprobs

    def law_request(self, prefix: list[int], sp: SamplingParams, seed: int) -> dict:
        body = {**self._body(prefix, 1, sp, seed), "logprobs": self.top_logprobs}
        if self.dialect == "llama.cpp":
            body["post_sampling_probs"] = True
        return self.plain.post("/v1/completions", body)

    def law_top(self, out: dict) -> list[tuple[int, float]] | None:
        return openai_top(out, "start vLLM with --return-tokens-as-token-ids")

def load_openai_http(
    url: str | None = None,
    plain_url: str | None = None,
    model: str = "",
    dialect: str = "llama.cpp",
    depth: int | str = 3,
    top_logprobs: int | str = 20,
    vocab_size: int | str | None = None,
    eos: str | None = None,
    launch: str | None = None,
    config: str = "draft",
    draft_sampling: str = "greedy",
    server: str | None = None,
    speculation: str | bool = True,
    slots: int | str = 4,
    logit_dtype: str | None = None,
    logit_scale: float | str = 32.0,
) -> OpenAIHttpBackend:
    """Options: url / plain_url (speculative / plain endpoints), model (the
    "model" field), dialect (llama.cpp|vllm|sglang), depth (the speculative
    endpoint's), top_logprobs (N of the ground truth), vocab_size and eos
    (comma-separated ids; default: the fixture's), or launch=llama-server with
    config / draft_sampling / server to start llama-server instances; slots
    (requests generate_batch keeps in flight, on concurrent connections; 1:
    capability concurrent off); logit_dtype (the server's precision: float32, float16 or bfloat16;
    default bfloat16, float16 for launch=llama-server's float16 KV cache) and logit_scale (a bound of
    |logit|) set the precision rule every exact check follows (mtpcheck.laws.precision)."""
    from mtpcheck.backends._library import switch

    if logit_dtype is None:
        logit_dtype = "float16" if launch else "bfloat16"
    if logit_dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"logit_dtype={logit_dtype!r}: expected float32, float16 or bfloat16")
    if dialect not in DIALECTS:
        raise ValueError(f"dialect={dialect!r}: expected one of {', '.join(DIALECTS)}")
    depth, n, slots = int(depth), int(top_logprobs), slots_option(slots)
    owner, tokenizer = None, None
    rule = "rejection" if draft_sampling == "probabilistic" else "exact_match"
    if launch:
        if launch != "llama-server":
            raise ValueError(f"launch={launch!r}: only llama-server")
        from mtpcheck.backends.llama_server import load_llama_server

        owner = load_llama_server(config=config, depth=depth, draft_sampling=draft_sampling, server=server,
                                  slots=slots)
        url, plain_url = owner.client(depth).url, owner.client(None).url
        vocab_size, eos_ids, tokenizer = owner.vocab_size, owner.eos_ids, owner.tokenizer
    else:
        if not url or not plain_url:  # speculation off must not be served by the speculative endpoint
            raise ValueError("openai-http needs url= and plain_url= (speculative and plain endpoints), "
                             "or launch=llama-server")
        eos_ids = [int(e) for e in eos.split(",")] if eos else [0]
        if vocab_size is None:
            raise ValueError("openai-http needs vocab_size= for a server it did not launch")
    kind = "mtp" if config == "mtp" else "assistant"
    return OpenAIHttpBackend(url=url, plain_url=plain_url, model=model, dialect=dialect, depth=depth,
                             kind=kind, top_logprobs=n, vocab_size=int(vocab_size), eos_ids=eos_ids,
                             speculation=switch(speculation), tokenizer=tokenizer, owner=owner, rule=rule,
                             slots=slots, logit_dtype=logit_dtype, logit_scale=float(logit_scale))
