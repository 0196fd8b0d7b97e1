"""mlx-lm's OpenAI-compatible HTTP server, ``python -m mlx_lm.server``, as a
backend (name "mlx-lm-server"; findings: docs/backends/mlx-lm-server.md).

Two servers on the same target: a plain one (speculation off, every request
reported ``used=False``) and one started with ``--draft-model``; a request's
depth goes as the server's own ``num_draft_tokens`` field. Token ids come back
from ``logprobs: true`` (``choices[0].logprobs.content[i].id``), never from
text; the prompt goes as text (the server takes no token ids) and is refused
unless the server's tokenizer gives back exactly the request's ids. The server
stops at the model's EOS only: a request that does not stop there is resumed
after it (prompt + tokens so far, the seed + 7919 per segment), other stops are
the project's stop matcher (``kit.drive``).

Ground truth: the server's log-probabilities are raw (before temperature and
filters) and at most the top 11, so the laws come from the same target folder
loaded in this process (``kit.DecodePathLogprobs``, the plain decode path),
processed in mlx-lm's own order (``make_sampler``: top-p, min-p, top-k on the
untempered law, temperature last). The server reports no per-request
speculation counters (mlx-lm's ``from_draft`` stays inside it): speculative
results are reported used with no rounds, i.e. unobserved.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

from mtpcheck.backends import kit
from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculationRequest,
)
from mtpcheck.engine.sampling import process

MAX_DEPTH = 8
FILTERS = ("top_p", "min_p", "top_k")  # mlx-lm's make_sampler order, on the untempered law


def mlx_order_law(row: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """The law mlx-lm's make_sampler samples from a log-probability row."""
    x = np.array(row, dtype=np.float64)
    for name in FILTERS:
        value = getattr(sp, name)
        if value and not (name == "top_p" and value >= 1.0):
            x[process(x, SamplingParams(temperature=1.0, **{name: value})) <= 0] = -np.inf
    return process(x, SamplingParams(temperature=sp.temperature))


class MlxLmServerBackend(kit.LibraryBackend):
    runtime = "mlx_lm.server"

    def __init__(self, target: Path, draft: Path, depth: int, speculation: bool, slots: int,
                 context_length: str | None, logit_scale: str | None, prompt_cache: str | None):
        from mlx_lm import load
        from mlx_lm.models.cache import make_prompt_cache

        model, self.tokenizer = load(str(target))
        self.logit_dtype = kit.dtype_name(model)  # the precision of the server's logits
        self.target, self.draft, self.slots = target, draft, slots
        self.vocab_size = int(model.args.vocab_size)
        self.eos_ids = sorted(int(e) for e in self.tokenizer.eos_token_ids)
        self.context = kit.context_limit(model.args, context_length)
        kit.with_scale(self, logit_scale)
        self.truth = kit.DecodePathLogprobs(lambda x, cache: model(x, cache=cache), lambda: make_prompt_cache(model))
        self.default = SpeculationRequest(mode="native_mtp" if speculation else "off", drafter="assistant",
                                          num_draft_tokens=depth)
        self.version = kit.library_version("mlx-lm")
        base = [sys.executable, "-m", "mlx_lm.server", "--model", str(target)]
        if prompt_cache is not None:  # the server's --prompt-cache-size (0: no prompt cache; M1, M2)
            base += ["--prompt-cache-size", str(int(prompt_cache))]
        self.args = {"plain": base[1:], "spec": [*base[1:], "--draft-model", str(draft), "--num-draft-tokens",
                                                 str(depth)]}
        self.servers, self.clients, self.lock = {}, {}, threading.Lock()
        try:
            for name in self.args:
                self.start(name)
        except BaseException:
            self.close()
            raise

    def start(self, name: str) -> None:
        self.servers[name] = kit.ServerProcess(sys.executable, self.args[name], f"mlx-lm-{name}", watchdog=True)
        self.clients[name] = kit.Client(self.servers[name].start().url)

    def revive(self, name: str, client: kit.Client) -> None:
        """Restart a server whose generation thread died (M1: /health 503, every request 404), as its
        operator would; the request that killed it has failed already."""
        with self.lock:
            try:
                healthy = client.get("/health")[0] == 200
            except OSError:
                healthy = False
            if self.clients.get(name) is client and not healthy:
                client.close()
                self.servers.pop(name).stop()
                self.start(name)

    def close(self) -> None:
        kit.close_all(self.clients, self.servers)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name="mlx-lm-server", version=f"mlx-lm {self.version} (mlx_lm.server)", vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids, mtp_kinds=["assistant"], max_depth=MAX_DEPTH, acceptance_rule="exact_match",
            first_token_from_prefill=False, seeded_determinism=True, position_addressed_target_sampling=False,
            speculative_sampling_controls=self.speculative_controls(penalties_reach_library=True),
            target_distributions=True, raw_logits=True, checkpoint_evidence=True, logit_dtype=self.logit_dtype,
            logprobs=False, traces=False, text=True, stop_text="special_tokens_kept", streaming=False,
            generate_batch=True, concurrent=self.slots > 1, **self.declared_context(),
            notes=(f"mlx_lm.server at {self.clients['spec'].url} (--draft-model {self.draft.name}/) and plain twin at "
                   f"{self.clients['plain'].url}; prompts sent as text; no per-request speculation counters "
                   "(speculative results unobserved); ground truth in-process from the target folder, mlx-lm's "
                   f"filter order; logprobs raw, not declared; generate_batch: {self.slots} connections"))

    def checkpoints(self) -> dict[str, Path]:
        return {"target": self.target, "assistant": self.draft}

    def target_distributions(self, prompt, continuation, sampling: SamplingParams) -> np.ndarray:
        if not continuation:
            return np.zeros((0, self.vocab_size))
        self.check(GenerationRequest(prompt_tokens=list(prompt) + list(continuation)))
        rows = (self.truth.penalised_rows(prompt, continuation, sampling) if sampling.speculation_blockers()
                else self.truth.rows(prompt, continuation))
        return np.stack([mlx_order_law(row, sampling) for row in rows])

    def body(self, ids: list[int], n: int, sp: SamplingParams, seed: int | None, depth: int | None) -> dict:
        text = self.decode(ids)
        if list(self.tokenizer.encode(text)) != list(ids):  # what the server does with the text
            raise kit.ServerError("mlx_lm.server takes text prompts only, and this one does not re-encode to its "
                                  f"{len(ids)} token ids: {text[:60]!r}")
        ctx = len(ids) + n
        body = {"prompt": text, "max_tokens": n, "temperature": sp.temperature, "top_p": sp.top_p or 1.0,
                "top_k": sp.top_k if sp.top_k and sp.top_k < self.vocab_size else 0, "min_p": sp.min_p or 0.0, "logprobs": True, "seed": seed,
                "repetition_penalty": sp.repetition_penalty or 0.0, "repetition_context_size": ctx,
                "presence_penalty": sp.presence_penalty or 0.0, "presence_context_size": ctx,
                "frequency_penalty": sp.frequency_penalty or 0.0, "frequency_context_size": ctx}
        if sp.logit_bias:
            body["logit_bias"] = {str(t): float(b) for t, b in sp.logit_bias.items()}
        if depth is not None:
            body["num_draft_tokens"] = depth
        return body

    def generate(self, request: GenerationRequest) -> GenerationResult:
        self.check(request)
        spec, used, depth, reason, message = kit.plan_speculation(request, self.default, "assistant",
                                                                  str(self.draft), 3, MAX_DEPTH)
        sp, tokens, segment = request.sampling, [], 0
        stops = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        name = "spec" if used else "plain"
        client = self.clients[name]
        while len(tokens) < request.max_tokens:
            seed = None if sp.seed is None else (sp.seed + 7919 * segment) % 2**63
            body = self.body(list(request.prompt_tokens) + tokens, request.max_tokens - len(tokens), sp, seed,
                             depth if used else None)
            try:
                out = client.post("/v1/completions", body)
            except (kit.ServerError, OSError):
                self.revive(name, client)
                raise
            got = [int(e["id"]) for e in out["choices"][0].get("logprobs", {}).get("content", [])]
            if len(got) != out["usage"]["completion_tokens"]:
                raise kit.ServerError(f"{len(got)} token ids for {out['usage']['completion_tokens']} tokens")
            tokens, segment = tokens + got, segment + 1
            if not (got and got[-1] in self.eos_ids and got[-1] not in stops):
                break
        state = kit.drive(iter(tokens), request, stops, self.decode)
        rep = kit.report(requested=spec.mode == "native_mtp", used=used, mode=spec.mode, drafter=str(self.draft),
                         depth=depth, draft_kind="assistant", runtime=self.runtime, reason=reason, message=message,
                         accept_lens=[], draft_lens=[])  # no counters: unobserved
        return kit.result_of(state, rep, sp.seed)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return kit.serve_together(self.generate, requests, self.slots)


def load_mlx_lm_server(path: str | None = None, target: str | None = None, draft: str | None = None,
                       depth: str | int = 3, speculation: str | bool = True, slots: str | int = 4,
                       context_length: str | None = None, logit_scale: str | None = None,
                       prompt_cache: str | None = None) -> MlxLmServerBackend:
    """Options: path (folder with target/ and draft/; default the shipped fixture
    mtpcheck/fixture/real/mlx_lm), target, draft, depth (the speculative
    server's default num_draft_tokens, 3), speculation (on|off: the default of
    a request without a speculation block), slots (connections generate_batch
    keeps in flight; 1: not concurrent), context_length, logit_scale, prompt_cache
    (the servers' --prompt-cache-size; default theirs, 10)."""
    base = Path(path) if path else kit.real_fixture_dir("mlx_lm")
    return MlxLmServerBackend(Path(target) if target else base / "target", Path(draft) if draft else base / "draft",
                              int(depth), kit.switch(speculation), kit.slots_option(slots), context_length,
                              logit_scale, prompt_cache)
