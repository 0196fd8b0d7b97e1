"""Guarded calls into a backend under test, and the run profiles.

Every call runs with a timeout and every answer is validated, so a backend
that raises, hangs or returns garbage produces a named failure on the clause
being checked; the run goes on and never passes on garbage. Every result is
also held to the rules any result obeys (mtpcheck.machinery.invariants): a
broken one is recorded with the call that produced it, for the plugin to
report under the clause that owns the rule.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pydantic

from mtpcheck.contracts import (
    BackendError,
    Capabilities,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    StreamChunk,
)
from mtpcheck.contracts.errors import SettingsError
from mtpcheck.machinery.exercise import Tally
from mtpcheck.machinery.invariants import result_violations, stream_violations


class BackendRaised(BackendError):
    """The backend raised an exception the clause did not ask for."""


class BackendTimeout(BackendError):
    """The backend did not answer within the per-call timeout."""


class BackendGarbage(BackendError):
    """The backend answered with the wrong type, shape, vocabulary or values."""


@dataclass(frozen=True)
class Profile:
    name: str
    dist_runs: int  # seeded generations per sampling configuration
    dist_tokens: int  # max tokens per generation
    greedy_tokens: int
    hypothesis_examples: int
    trace_runs: int
    # DIST-CONTEXT (mtpcheck/machinery/contexts.py): short requests per prompt
    # in the pilot, and in the targeted stage over the chosen prompts. thorough's
    # 12,000 catch a per-context TV of 0.03 (docs/power.md, section E)
    context_pilot: int = 20
    context_runs: int = 200
    # hypothesis shrinks a failing example before reporting it. Off in ci: the
    # first failing example is reported as found, and shrinking one against a
    # real backend cost minutes (76-288 s on an expected failure, mlx-lm).
    shrink: bool = True
    # CTRL-CONTRACT (mtpcheck/suite/test_controls.py): fixture prompts per sampling
    # control, the most repetitive first (penalties act on repeated tokens)
    control_prompts: int = 2
    # SEED-STREAMS-INDEPENDENT's role form: the temperatures it samples at. ci keeps
    # T = 1.0 alone (15 s of a 2-core run); its four tests kill the zoo's shared-uniform
    # mutants there with p <= 1.9e-12 against alpha 6.25e-10 (docs/statistics.md)
    stream_temperatures: tuple[float, ...] = (1.0, 1.3)

    def hypothesis_phases(self) -> tuple:
        """Phases for the suite's @settings: those of the loaded hypothesis
        profile (the zoo's `-p mtpcheck.mutants._noshrink` drops shrinking
        there), less shrink and explain (which needs shrink) when this
        profile does not shrink."""
        from hypothesis import Phase, settings

        dropped = () if self.shrink else (Phase.shrink, Phase.explain)
        return tuple(p for p in settings.default.phases if p not in dropped)


PROFILES = {
    "ci": Profile("ci", dist_runs=40, dist_tokens=48, greedy_tokens=40, hypothesis_examples=10, trace_runs=6,
                  context_pilot=20, context_runs=200, shrink=False, stream_temperatures=(1.0,)),
    "dev": Profile("dev", dist_runs=80, dist_tokens=48, greedy_tokens=64, hypothesis_examples=25, trace_runs=12,
                   context_pilot=100, context_runs=1400, control_prompts=4),
    "thorough": Profile("thorough", dist_runs=300, dist_tokens=64, greedy_tokens=128, hypothesis_examples=100, trace_runs=40,
                        context_pilot=200, context_runs=12000, control_prompts=8),
}


def call_with_timeout(fn, *args, timeout: float | None, what: str):
    """Run fn(*args) in a worker thread; a hang becomes BackendTimeout. A hung
    worker cannot be killed in Python: it is left behind as a daemon."""
    if not timeout:
        return fn(*args)
    box: dict = {}

    def work():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    worker = threading.Thread(target=work, daemon=True, name=f"mtpcheck:{what}")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise BackendTimeout(f"{what} did not return within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Guarded:
    """The backend as the suite sees it: timeouts, validation, named errors.

    Exceptions the clause itself provokes (e.g. SpeculationUnavailableError,
    ValueError for a bad request) pass through unchanged when listed in
    `expect`; anything else becomes BackendRaised."""

    def __init__(self, backend, timeout: float | None = 120.0):
        self.backend, self.timeout = backend, timeout
        self._caps: Capabilities | None = None
        self.tally = Tally()  # the running suite test's speculative results (the plugin starts one per test)
        # broken result rules found since the running test started: dicts of clause, call, request, problems
        self.violations: list[dict] = []
        self.judging: frozenset[str] = frozenset()  # the running test's clauses: it judges their rules itself

    def start_tally(self, judging=()) -> Tally:
        """A suite test starts: a fresh tally and violation list; the rules of
        the clauses in `judging` are left to the test (it names sides)."""
        self.tally, self.violations, self.judging = Tally(), [], frozenset(judging)
        return self.tally

    def _judge(self, call: str, req: GenerationRequest, found, index: int | None = None) -> None:
        """Record the rules `found` broke (Violation pairs), one entry per clause."""
        for clause in dict.fromkeys(v.clause for v in found if v.clause not in self.judging):
            sp = req.sampling
            self.violations.append({
                "clause": clause, "call": call, "request": index,
                "problems": [v.problem for v in found if v.clause == clause],
                "max_tokens": req.max_tokens, "temperature": sp.temperature, "seed": sp.seed,
                "depth": req.speculation.num_draft_tokens if req.speculation else None})

    def note(self, *pairs: tuple[GenerationRequest, GenerationResult]) -> None:
        """Count (request, result) pairs a test judges that it did not draw
        itself (a sample shared with other tests, drawn once)."""
        for req, res in pairs:
            self.tally.add(req, res, self.capabilities())

    def _call(self, name: str, *args, expect: tuple[type[BaseException], ...] = ()):
        fn = getattr(self.backend, name, None)
        if fn is None:
            raise BackendGarbage(f"backend {type(self.backend).__name__} has no {name}()")
        try:
            return call_with_timeout(fn, *args, timeout=self.timeout, what=f"{name}()")
        except BackendTimeout:
            raise
        except expect:
            raise
        except NotImplementedError:
            raise
        except Exception as exc:
            raise BackendRaised(f"{name}() raised {type(exc).__name__}: {exc}") from exc

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            raw = self._call("capabilities")
            try:
                self._caps = raw if isinstance(raw, Capabilities) else Capabilities.model_validate(raw)
            except pydantic.ValidationError as exc:
                raise BackendGarbage(f"capabilities() returned an invalid Capabilities: {exc}") from exc
        return self._caps

    def generate(self, req: GenerationRequest, expect: tuple[type[BaseException], ...] = ()) -> GenerationResult:
        self._constraint_declared(req)
        return self._validated(req, self._call("generate", req, expect=expect))

    def generate_n(self, req: GenerationRequest, n: int) -> list[GenerationResult]:
        """Capability parallel_samples: n samples of one request, each validated as generate()'s."""
        self._constraint_declared(req)
        raw = self._call("generate_n", req, n)
        if not isinstance(raw, (list, tuple)) or len(raw) != n:
            raise BackendGarbage(f"generate_n() returned {type(raw).__name__} of length "
                                 f"{len(raw) if hasattr(raw, '__len__') else '?'} for n={n}")
        return [self._validated(req, r, "generate_n()", i) for i, r in enumerate(raw)]

    def decode(self, tokens: list[int]) -> str:
        """Capability text: the backend's detokenizer, under the per-call timeout."""
        out = self._call("decode", list(tokens))
        if not isinstance(out, str):
            raise BackendGarbage(f"decode() returned {type(out).__name__}, not str")
        return out

    def _text_rule(self):
        """The detokenizer the result rules judge text with: the backend's
        decode() where it declares text, else None (no text rule)."""
        if not self.capabilities().text or getattr(self.backend, "decode", None) is None:
            return None
        return self.decode

    def _constraint_declared(self, *reqs: GenerationRequest) -> None:
        # a backend that does not declare the field would drop it silently: the request never leaves
        if any(r.constraint is not None for r in reqs) and not self.capabilities().request_constraints:
            raise SettingsError("GenerationRequest.constraint given, but the backend does not declare "
                                "request_constraints: it would be ignored, not honoured")

    def _validated(self, req: GenerationRequest, raw, what: str = "generate()",
                   index: int | None = None) -> GenerationResult:
        try:
            res = raw if isinstance(raw, GenerationResult) else GenerationResult.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise BackendGarbage(f"{what} returned an invalid GenerationResult: {str(exc)[:400]}") from exc
        V = self.capabilities().vocab_size
        bad = [t for t in res.tokens if not 0 <= t < V]
        if bad:
            raise BackendGarbage(f"{what} returned token ids outside the vocabulary (size {V}): {bad[:5]}")
        if not res.tokens:
            raise BackendGarbage(f"{what} returned no tokens (max_tokens >= 1)")
        if res.logprobs is not None and len(res.logprobs) != len(res.tokens):
            raise BackendGarbage(f"{len(res.logprobs)} logprobs for {len(res.tokens)} tokens")
        self.tally.add(req, res, self.capabilities())
        self._judge(what, req, result_violations(res, req, self.capabilities(), self._text_rule()), index)
        return res

    def generate_batch(self, reqs: list[GenerationRequest]) -> list[GenerationResult]:
        """Capability generate_batch: one call, results validated as generate()'s."""
        self._constraint_declared(*reqs)
        raw = self._call("generate_batch", list(reqs))
        if not isinstance(raw, (list, tuple)) or len(raw) != len(reqs):
            raise BackendGarbage(f"generate_batch() returned {type(raw).__name__} of length "
                                 f"{len(raw) if hasattr(raw, '__len__') else '?'} for {len(reqs)} requests")
        return [self._validated(req, r, "generate_batch()", i) for i, (req, r) in enumerate(zip(reqs, raw, strict=True))]

    def generate_stream(self, req: GenerationRequest) -> list[StreamChunk]:
        """The whole stream of generate_stream(req), chunks in arrival order
        (consumed under one timeout), each validated."""
        self._streams(req)
        chunks = self._chunks(self._consume(req, lambda r: list(self.backend.generate_stream(r))))
        self._judge("generate_stream()", req, stream_violations(chunks, req, self.capabilities(), decode=self._text_rule()))
        return chunks

    def abandon_stream(self, req: GenerationRequest, after: int) -> tuple[list[StreamChunk], bool]:
        """A client that goes away: the first `after` chunks of generate_stream(req),
        then the generator closed (an HTTP adapter drops the connection), in the
        thread that read them. Returns the chunks read and whether the stream had
        ended (a finish reason) before it was abandoned."""
        self._streams(req)

        def take(r):
            gen, got = self.backend.generate_stream(r), []
            try:
                for c in gen:
                    got.append(c)
                    if len(got) >= after:
                        break
            finally:
                if hasattr(gen, "close"):
                    gen.close()
            return got

        chunks = self._chunks(self._consume(req, take))
        self._judge(f"generate_stream() abandoned after {after} chunks", req,
                    stream_violations(chunks, req, self.capabilities(), complete=False, decode=self._text_rule()))
        return chunks, any(c.finish_reason is not None for c in chunks)

    def _streams(self, req: GenerationRequest) -> None:
        if getattr(self.backend, "generate_stream", None) is None:
            raise BackendGarbage(f"backend {type(self.backend).__name__} declares streaming but has no generate_stream()")
        self._constraint_declared(req)

    def _chunks(self, raw: list) -> list[StreamChunk]:
        """A stream's chunks validated: StreamChunk fields, ids in the vocabulary, at least one."""
        if not raw:
            raise BackendGarbage("generate_stream() yielded no chunk")
        chunks = []
        V = self.capabilities().vocab_size
        for i, c in enumerate(raw):
            try:
                chunk = c if isinstance(c, StreamChunk) else StreamChunk.model_validate(c)
            except pydantic.ValidationError as exc:
                raise BackendGarbage(f"generate_stream() chunk {i} is not a StreamChunk: {str(exc)[:300]}") from exc
            bad = [t for t in chunk.tokens if not 0 <= t < V]
            if bad:
                raise BackendGarbage(f"generate_stream() chunk {i} holds token ids outside the vocabulary: {bad[:5]}")
            chunks.append(chunk)
        return chunks

    def _consume(self, req: GenerationRequest, read) -> list:
        try:
            return call_with_timeout(read, req, timeout=self.timeout, what="generate_stream()")
        except (BackendTimeout, NotImplementedError):
            raise
        except Exception as exc:
            raise BackendRaised(f"generate_stream() raised {type(exc).__name__}: {exc}") from exc

    def _rows(self, what: str, raw, n: int) -> np.ndarray:
        """A backend's per-position rows as float64 [n, V], or BackendGarbage."""
        V = self.capabilities().vocab_size
        try:
            x = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise BackendGarbage(f"{what}() returned a non-numeric {type(raw).__name__}") from exc
        if x.shape != (n, V):
            raise BackendGarbage(f"{what}() shape {x.shape}, expected {(n, V)}")
        return x

    def target_logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        """Capability raw_logits: the target's unprocessed logits at every
        teacher-forced position, float64 [len(continuation), V], finite."""
        x = self._rows("target_logits", self._call("target_logits", list(prompt), list(continuation)), len(continuation))
        if not np.all(np.isfinite(x)):
            bad = np.argwhere(~np.isfinite(x))[:3].tolist()
            raise BackendGarbage(f"target_logits() holds non-finite logits (row, token) {bad}")
        return x

    def target_distributions(self, prompt: list[int], continuation: list[int], sampling: SamplingParams) -> np.ndarray:
        raw = self._call("target_distributions", list(prompt), list(continuation), sampling)
        p = self._rows("target_distributions", raw, len(continuation))
        if not np.all(np.isfinite(p)) or (p < 0).any():
            raise BackendGarbage("target_distributions() holds negative or non-finite probabilities")
        sums = p.sum(axis=1)
        top_n = self.capabilities().truncated_laws
        if top_n:  # top-N rows: at most N nonzero, summing to at most 1 (the rest is the tail)
            if len(sums) and (np.max(sums) > 1.0 + 1e-6 or np.max((p > 0).sum(axis=1)) > top_n):
                raise BackendGarbage(f"target_distributions() truncated rows (top {top_n}) sum up to "
                                     f"{sums.max():.6g} with up to {int(np.max((p > 0).sum(axis=1)))} nonzero entries")
        elif len(sums) and np.max(np.abs(sums - 1.0)) > 1e-6:
            raise BackendGarbage(f"target_distributions() rows sum to {sums.min():.6g}..{sums.max():.6g}, not 1")
        return p

    def draft_distributions(self, req: GenerationRequest, tokens: list[int], accept_lens: list[int],
                            draft_lens: list[int]) -> np.ndarray:
        raw = self._call("draft_distributions", req, list(tokens), list(accept_lens), list(draft_lens))
        q = self._rows("draft_distributions", raw, len(tokens))
        sums = q.sum(axis=1)
        if not np.all(np.isfinite(q)) or (q < 0).any():
            raise BackendGarbage("draft_distributions() holds negative or non-finite probabilities")
        if len(sums) and not np.all((np.abs(sums - 1.0) <= 1e-6) | (sums == 0.0)):
            raise BackendGarbage("draft_distributions() rows must sum to 1 (a proposal's law) or 0 (no proposal)")
        return q
