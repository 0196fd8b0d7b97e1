"""Runtimes behind HTTP: a JSON client, and server processes this process
starts itself and must stop (by PID, never by name).

A :class:`ServerProcess` listens on 127.0.0.1 at a free port, is waited on
through ``GET /health``, and is stopped by :meth:`ServerProcess.stop`, by
garbage collection, at interpreter exit (Ctrl-C included: KeyboardInterrupt
unwinds to exit) through one ``weakref.finalize`` per process. On Linux a
child started from the main thread also gets ``PR_SET_PDEATHSIG`` so that it
dies with this process even when this process is killed outright (SIGKILL
runs no exit handlers); the signal fires when the forking *thread* ends, so
children started from worker threads (the harness's timeout guard) go
without it."""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from urllib.parse import urlsplit

from mtpcheck.backends import _watchdog
from mtpcheck.backends._watchdog import descendants
from mtpcheck.contracts import MtpCheckError

UNSERIALIZABLE = "Out of range float values are not JSON compliant"  # vLLM's deviation V10 (post_logprobs)


class ServerError(MtpCheckError):
    """A server could not be started, or answered an error."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """JSON over keep-alive HTTP/1.1, one connection per calling thread
    (re-opened on failure): concurrent requests (serve_together) each hold
    their own connection, as concurrent users do."""

    def __init__(self, url: str, timeout: float = 300.0):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https"):
            raise ServerError(f"{url!r}: only http:// and https:// URLs")
        self.url, self.timeout = url.rstrip("/"), timeout
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or (443 if self.https else 80)
        self.base = parts.path.rstrip("/")
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []  # every thread's, for close()
        self._lock = threading.Lock()

    @property
    def conn(self) -> http.client.HTTPConnection | None:
        return getattr(self._local, "conn", None)

    def _connect(self) -> http.client.HTTPConnection:
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._local.conn = cls(self.host, self.port, timeout=self.timeout)
            with self._lock:
                self._all.append(self._local.conn)
        return self.conn

    def _drop(self) -> None:
        """Close this thread's connection."""
        conn = self.conn
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                self._all = [c for c in self._all if c is not conn]

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()

    def request(self, method: str, path: str, body: dict | None = None, stream: bool = False):
        """(status, parsed JSON) or, with `stream`, (status, iterator of SSE data objects)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (0, 1):
            conn = self._connect()
            kept_alive = conn.sock is not None
            try:
                conn.request(method, self.base + path, body=data, headers=headers)
                resp = conn.getresponse()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                self._drop()
                # a kept-alive connection the server had closed: once more on a new one; a new
                # connection that fails is the server's failure, never sent twice
                if attempt or not kept_alive:
                    raise
        if stream and resp.status == 200:
            return resp.status, self._events(resp)
        raw = resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return resp.status, {"raw": raw.decode("utf-8", "replace")}

    def _events(self, resp):
        try:
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                yield json.loads(payload)
            resp.read()
        finally:
            if not resp.isclosed():
                self._drop()  # the stream was abandoned part-way: the connection is not reusable

    def post(self, path: str, body: dict) -> dict:
        status, out = self.request("POST", path, body)
        if status != 200:
            raise ServerError(f"POST {self.url}{path}: HTTP {status}: {_short(out)}")
        return out

    def stream(self, path: str, body: dict):
        status, out = self.request("POST", path, body, stream=True)
        if status != 200:
            raise ServerError(f"POST {self.url}{path} (stream): HTTP {status}: {_short(out)}")
        return out

    def get(self, path: str):
        return self.request("GET", path)


def token_logprobs(values: list, n: int) -> list[float]:
    """n logprobs for n tokens from what a server returned for them: None (or
    nothing, past its end) becomes NaN, so LOGPROBS names the token instead of
    the adapter inventing a value."""
    vals = [math.nan if v is None else float(v) for v in list(values)[:n]]
    return vals + [math.nan] * (n - len(vals))


def slots_option(value: int | str) -> int:
    """A loader's ``slots`` option: requests in flight at once, a whole number >= 1."""
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"slots={value!r}: expected a whole number of parallel requests >= 1 (1: one at a time)")
    return int(text)


def serve_together(generate, requests: list, slots: int, stagger_s: float = 0.02) -> list:
    """generate_batch for a server with `slots` parallel slots (capability
    `concurrent`): each request on its own thread and connection, at most
    `slots` in flight, request i sent `stagger_s` after request i-1, so
    requests join while others are in flight and leave when done, as
    concurrent users do. Results in request order; the first error raises
    once every thread has ended."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, slots), thread_name_prefix="mtpcheck-user") as pool:
        futures = []
        for i, req in enumerate(requests):
            if i and stagger_s:
                time.sleep(stagger_s)
            futures.append(pool.submit(generate, req))
        return [f.result() for f in futures]


def _short(obj, n: int = 300) -> str:
    text = json.dumps(obj) if not isinstance(obj, str) else obj
    return text if len(text) <= n else text[:n] + "..."


def _die_with_parent() -> None:  # runs in the child before exec (Linux)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop(proc: subprocess.Popen, log, grace: float = 5.0, guard: subprocess.Popen | None = None) -> None:
    """Stop one child by its PID: SIGTERM, then SIGKILL after `grace` s; then
    the processes it had started (a server's engine workers), by their PIDs;
    then its watchdog."""
    kids = descendants(proc.pid) if proc.poll() is None else []
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)  # a worker its parent did not take down with it
            except OSError:
                pass
    finally:
        if guard is not None and guard.poll() is None:
            guard.kill()
            guard.wait(5)
        log.close()
        if os.environ.get("MTPCHECK_KEEP_SERVER_LOGS") is None:
            try:
                os.unlink(log.name)
            except OSError:
                pass


class ServerProcess:
    """One server child process. `args` are the server's own arguments less
    ``--host``/``--port`` (added here)."""

    def __init__(self, binary: str | Path, args: list[str], label: str, startup_timeout: float = 180.0,
                 env: dict[str, str] | None = None, stop_grace: float = 5.0, watchdog: bool = False):
        self.binary, self.args, self.label = str(binary), list(args), label
        self.startup_timeout, self.env, self.stop_grace = startup_timeout, env, stop_grace
        # a watchdog process stops the server if this process dies without running its exit handlers
        # (SIGKILL, or SIGTERM with Python's default handler): the parent-death signal cannot, since
        # servers are started from the harness's worker threads
        self.watchdog = watchdog
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path: str | None = None
        self._finalizer = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> ServerProcess:
        last = None
        for _ in range(3):  # the free port may be taken between the probe and the bind
            try:
                return self._start_once()
            except ServerError as exc:
                last = exc
                self.stop()
                if "bind" not in str(exc).lower() and "address" not in str(exc).lower():
                    raise
        raise last  # type: ignore[misc]

    def _start_once(self) -> ServerProcess:
        return self.launch().wait_healthy()

    def launch(self) -> ServerProcess:
        """Start the process and return at once (:meth:`wait_healthy` waits for it):
        several servers then start side by side."""
        self.port = free_port()
        log = tempfile.NamedTemporaryFile(prefix=f"mtpcheck-{self.label}-", suffix=".log", delete=False)
        self.log_path = log.name
        cmd = [self.binary, *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            # the parent-death signal follows the *thread* that forks: only from the main thread
            # (the harness calls backends from worker threads, which end after each call)
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") and
            threading.current_thread() is threading.main_thread() else None,
            env=None if self.env is None else {**os.environ, **self.env},
        )
        guard = None
        if self.watchdog:
            guard = subprocess.Popen(
                [sys.executable, _watchdog.__file__, str(os.getpid()), str(self.proc.pid), str(self.stop_grace)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._finalizer = weakref.finalize(self, _stop, self.proc, log, self.stop_grace, guard)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self) -> ServerProcess:
        """Wait until ``GET /health`` answers 200 (ServerError if the process exits or the time runs out)."""
        client = Client(self.url, timeout=5.0)
        deadline = time.monotonic() + self.startup_timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise ServerError(f"{self.label}: {Path(self.binary).name} exited with {self.proc.returncode} "
                                      f"while starting: {self.log_tail()}")
                try:
                    status, _ = client.get("/health")
                    if status == 200:
                        return self
                except OSError:
                    pass
                client.close()
                time.sleep(0.1)
        finally:
            client.close()
        raise ServerError(f"{self.label}: no healthy /health within {self.startup_timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines() if self.log_path else []
        except OSError:
            return ""
        return " | ".join(lines[-n:])

    def stop(self) -> None:
        """Idempotent; the log is removed unless MTPCHECK_KEEP_SERVER_LOGS is set."""
        if self._finalizer is not None:
            self._finalizer()


def close_all(clients: dict, servers: dict) -> None:
    """Close the clients and stop the servers (by PID) of a backend's pools; empties both."""
    for c in clients.values():
        c.close()
    clients.clear()
    for s in servers.values():
        s.stop()
    servers.clear()


def plain_path_laws(prompt: list[int], continuation: list[int], sampling, law, vocab_size: int):
    """target_distributions of a server: `law(prefix, sampling)` after each
    prefix of the continuation, one token at a time (the plain decoding path,
    not one batched pass), the seed dropped; greedy is the contract's one-hot
    law at the argmax (lowest id on ties) of the temperature-1 law."""
    import numpy as np

    from mtpcheck.backends._library import check_request
    from mtpcheck.contracts import GenerationRequest

    if not continuation:
        return np.zeros((0, vocab_size))
    check_request(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)), vocab_size)
    greedy = sampling.temperature == 0.0
    sp = sampling.model_copy(update={"temperature": 1.0 if greedy else sampling.temperature, "seed": None})
    out = np.stack([law(list(prompt) + list(continuation[:i]), sp) for i in range(len(continuation))])
    if greedy:
        hot = np.zeros_like(out)
        hot[np.arange(len(out)), np.argmax(out, axis=1)] = 1.0
        return hot
    return out



# -- ground truth of a server: the law after a prefix, from one-token completions


class ServerTruth:
    """Ground truth for an adapter of an HTTP server, written once: the law
    after a prefix is the top-N probabilities of a one-token completion on
    the plain server, one prefix at a time along the plain decoding path
    (:func:`plain_path_laws`), memoised by (prefix, sampling).

    A subclass sets ``vocab_size`` and defines what differs between servers:
    :meth:`law_request` (post the completion asking N probabilities, N =
    :meth:`law_n`) and :meth:`law_top` (read (id, probability) pairs from the
    answer; None when it has none, and the next seed is tried). The class
    attributes hold the rest: how many seeds, and the error texts."""

    vocab_size: int
    law_seeds = 64  # seeds tried while an answer has no probabilities (the law does not depend on the seed)
    law_missing = "no log-probabilities after {seeds} seeds for a prefix of {prefix} tokens"
    # None: the top N may be truncated (a row sums to at most 1, renormalised only when N >= V);
    # a text: the row is the whole law, checked to sum to 1 ({total}, {n}) and renormalised
    law_not_one: str | None = None
    law_memo_size = 200_000

    def law_n(self) -> int:
        """N, the probabilities asked per completion."""
        return self.vocab_size

    def law_request(self, prefix: list[int], sp, seed: int) -> dict:
        """The server's answer to a one-token completion after `prefix` with N probabilities."""
        raise NotImplementedError

    def law_top(self, out: dict) -> list[tuple[int, float]] | None:
        """(id, probability) in rank order from an answer; None when it carries none."""
        raise NotImplementedError

    def target_distributions(self, prompt: list[int], continuation: list[int], sampling):
        return plain_path_laws(prompt, continuation, sampling, self.law, self.vocab_size)

    def law(self, prefix: list[int], sp):
        """The law after `prefix` under `sp` (zeros beyond the top N; memoised)."""
        import numpy as np

        memo = self.__dict__.setdefault("_law_memo", {})
        key = (tuple(prefix), sp.model_dump_json())
        if key in memo:
            return memo[key]
        n, entries = self.law_n(), None
        for seed in range(self.law_seeds):
            entries = self.law_top(self.law_request(prefix, sp, seed))
            if entries is not None:
                break
        if entries is None:
            raise ServerError(self.law_missing.format(seeds=self.law_seeds, prefix=len(prefix)))
        row = np.zeros(self.vocab_size)
        for tok, p in entries[:n]:
            row[tok] = p
        total = row.sum()
        if self.law_not_one is None:
            if total > 1.0 + 1e-4:
                raise ServerError(f"top-{n} probabilities sum to {total:.6g} > 1")
        elif not abs(total - 1.0) < 1e-4:
            raise ServerError(self.law_not_one.format(total=total, n=n))
        if self.law_not_one is not None or n >= self.vocab_size:
            row /= total
        if len(memo) > self.law_memo_size:
            memo.clear()
        memo[key] = row
        return row


def completion_top(out: dict) -> list[tuple[int, float]] | None:
    """llama-server's ``POST /completion`` with ``n_probs``: the first token's
    ``completion_probabilities[0].top_probs`` (none when the sampled token's
    text ends inside a UTF-8 character: deviation S2)."""
    probs = out.get("completion_probabilities") or []
    return [(int(e["id"]), float(e["prob"])) for e in probs[0].get("top_probs", [])] if probs else None


def legacy_top(out: dict, text_keys: str) -> list[tuple[int, float]] | None:
    """OpenAI legacy ``choices[0].logprobs.top_logprobs[0]``, keyed
    ``token_id:N`` (vLLM's ``--return-tokens-as-token-ids``), by rank; keys
    that are text raise ServerError("top_logprobs keyed by text: " + `text_keys`)."""
    tops = ((out.get("choices") or [{}])[0].get("logprobs") or {}).get("top_logprobs")
    if not tops:
        return None
    entries = []
    for name, value in tops[0].items():
        if not name.startswith("token_id:"):
            raise ServerError(f"top_logprobs keyed by text: {text_keys}")
        entries.append((int(name.split(":", 1)[1]), math.exp(float(value))))
    return sorted(entries, key=lambda e: (-e[1], e[0]))


def openai_top(out: dict, text_keys: str) -> list[tuple[int, float]] | None:
    """``/v1/completions`` as llama-server answers it (``logprobs.content[0]``'s
    ``top_probs`` or ``top_logprobs``, {id, prob | logprob}), else OpenAI's
    legacy form (:func:`legacy_top`); None when empty."""
    content = ((out.get("choices") or [{}])[0].get("logprobs") or {}).get("content")
    if content:
        tops = content[0].get("top_probs") or content[0].get("top_logprobs") or []
        entries = [(int(e["id"]), float(e["prob"]) if "prob" in e else math.exp(float(e["logprob"]))) for e in tops]
    else:
        entries = legacy_top(out, text_keys)
    return entries or None

# -- vLLM's per-request speculation metrics (shared by the vllm backend and openai-http's vllm dialect)


def constraint_fields(request) -> dict:
    """GenerationRequest.constraint as vLLM's structured outputs (a choice of strings)."""
    return {"structured_outputs": {"choice": list(request.constraint.choice)}} if request.constraint else {}


GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def post_logprobs(post, body: dict, logprobs: dict, retry: bool = True) -> tuple[dict, bool]:
    """post(body + logprobs fields) -> (response, whether logprobs were asked
    for and came back). vLLM's V10 (docs/backends/vllm.md): a sampled token of
    processed probability 0 has logprob -inf, which the server cannot write as
    JSON (HTTP 400); with `retry` the tokens are asked again without logprobs,
    which the caller reports as NaN, so LOGPROBS names the tokens instead of
    the suite losing the request."""
    try:
        return post({**body, **logprobs}), bool(logprobs)
    except ServerError as exc:
        if not (retry and logprobs and UNSERIALIZABLE in str(exc)):
            raise
        return post(body), False


def gbnf_choice(choice: list[str]) -> str:
    """A choice of strings as a llama.cpp grammar: ``root ::= "a" | "b"``
    (GBNF string literals: backslash escapes, other control characters as
    \\xNN, the rest as UTF-8). The grammar, once complete, lets only the
    model's end-of-generation tokens through."""
    def literal(text: str) -> str:
        return '"' + "".join(GBNF_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 32 else c) for c in text) + '"'

    return "root ::= " + " | ".join(literal(c) for c in choice)


def grammar_fields(request, eos_ids: list[int]) -> dict:
    """GenerationRequest.constraint as llama.cpp's `grammar`. llama.cpp ends a
    complete grammar at its end-of-generation tokens only, so a constrained
    request must stop at the EOS ids (an adapter resuming after EOS would
    restart the grammar): other stops are refused, never dropped."""
    if request.constraint is None:
        return {}
    stops = eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
    if set(stops) != set(eos_ids):
        raise ValueError(f"constraint with stop_token_ids {stops}: llama.cpp's grammar ends at the model's "
                         f"end-of-generation tokens {eos_ids} only")
    return {"grammar": gbnf_choice(list(request.constraint.choice))}


def vllm_stop_fields(stop_token_ids: list[int] | None, eos_ids: list[int]) -> dict:
    """A request's stops as vLLM's own fields: None = the model's EOS (vLLM's
    default), else exactly these ids (``ignore_eos`` and ``stop_token_ids``)."""
    if stop_token_ids is None:
        return {"ignore_eos": False, "stop_token_ids": []}
    return {"ignore_eos": True, "stop_token_ids": [int(t) for t in stop_token_ids]}


def vllm_refused_controls(sp) -> list[str]:
    """Controls vLLM 0.32 refuses with speculative decoding (HTTP 400: "The min_p
    and logit_bias sampling parameters are not yet supported with speculative decoding")."""
    return [name for name, on in (("min_p", bool(sp.min_p)), ("logit_bias", bool(sp.logit_bias))) if on]


def vllm_steps(response: dict) -> list[tuple[int, int]] | None:
    """(drafted, accepted) of each verify step, in order, from a vLLM completion
    response's ``metrics.speculative_decoding`` (a server started with
    ``--per-request-spec-decode-metrics detailed``). [] when the request ran no
    step (its arrays are null then, e.g. max_tokens=1); None when the response
    has no such block (the server runs without the flag or without speculation)."""
    block = (response.get("metrics") or {}).get("speculative_decoding")
    if block is None:
        return None
    drafted, accepted = block.get("per_step_drafted"), block.get("per_step_accepted")
    if drafted is None and accepted is None:
        if block.get("num_spec_steps"):
            raise ServerError(f"{block['num_spec_steps']} speculative steps but no per-step arrays: start the server "
                              "with --per-request-spec-decode-metrics detailed")
        return []
    if len(drafted or []) != len(accepted or []):
        raise ServerError(f"per_step_drafted has {len(drafted or [])} entries, per_step_accepted {len(accepted or [])}")
    return [(int(d), int(a)) for d, a in zip(drafted, accepted, strict=True)]


def ngram_proposes(context: list[int], min_n: int) -> bool:
    """Whether vLLM's n-gram proposer drafts anything after `context`: its
    longest suffix match is at least `min_n` long, i.e. the last `min_n` tokens
    occur earlier in the context (vllm/v1/spec_decode/ngram_proposer.py)."""
    n = len(context)
    if n < min_n + 1:
        return False
    tail = context[n - min_n :]
    return any(context[i : i + min_n] == tail for i in range(n - min_n))


def vllm_rounds(steps: list[tuple[int, int]], prompt: list[int], tokens: list[int],
                ngram_min: int | None = None) -> tuple[list[tuple[int, int]], str | None]:
    """The rounds (drafted, accepted) that emitted `tokens` after the prefill
    token, and a note when they had to be guessed. vLLM records a step only
    when it verified proposals, so a step that drafted nothing (an n-gram
    drafter that found no match) is missing from its arrays. With
    `ngram_min` (the server's ``prompt_lookup_min``) those steps are put back
    where the n-gram proposer finds nothing after the tokens so far; without
    it, or if that replay disagrees with the arrays, the missing steps go
    first and the note says so. The last step may count proposals accepted
    past a stop or the budget: :func:`kept_rounds` cuts them."""
    implied = 1 + sum(a + 1 for _, a in steps)
    if ngram_min is not None and tokens:
        rounds, it, pos = [], iter(steps), 1
        ok = True
        while pos < len(tokens):
            if ngram_proposes(list(prompt) + list(tokens[:pos]), ngram_min):
                step = next(it, None)
                if step is None:
                    ok = False
                    break
                rounds.append(step)
                pos += step[1] + 1
            else:
                rounds.append((0, 0))
                pos += 1
        if ok and next(it, None) is None:
            return rounds, None
    missing = max(0, len(tokens) - implied)
    note = (f"{missing} step(s) without proposals are missing from vLLM's per-step arrays; reported first"
            if missing else None)
    return [(0, 0)] * missing + list(steps), note


def kept_rounds(rounds: list[tuple[int, int]], committed: int, lead: int = 1) -> tuple[list[int], list[int]]:
    """(accept_lens, draft_lens) of the rounds that produced `committed` tokens
    (after `lead` prefill tokens), each emitting accepted + 1; the last one's
    accepted count is cut to what it emitted (a stop or the budget inside its block)."""
    acc, dr = [], []
    emitted = lead
    for d, a in rounds:
        if emitted >= committed:
            break
        a = min(a, committed - emitted - 1)
        acc.append(a)
        dr.append(d)
        emitted += a + 1
    return acc, dr
