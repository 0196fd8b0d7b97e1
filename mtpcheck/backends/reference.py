"""The reference engine as a backend (name "mlx")."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mtpcheck import __version__
from mtpcheck.contracts import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculationRequest,
    check_prompt_length,
)

SLOTS = 4  # requests generate_batch keeps in flight at once
LOGIT_DTYPES = ("float32", "float16", "bfloat16")
TOP_K_TIES = ("exactly_k", "keep_ties")


def child_seed(seed: int | None, index: int) -> int:
    """The seed of sample `index` of a request: hashed from (seed, index), so
    that no two requests' samples share a seed (vLLM's seed + index makes
    samples 1.. of seed s those of seed s + 1 ..)."""
    import hashlib
    import os

    if seed is None:
        return int.from_bytes(os.urandom(7), "little")
    return int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=7).digest(), "little")


class ReferenceBackend:
    """Wraps one loaded `Engine`. Options (from --mtp-backend-option):
    acceptance=rejection|exact_match, drafter=mtp|assistant, depth=N, fixture=tiny|mlx-vlm|mlx-vlm-native|PATH."""

    def __init__(self, engine, folders: dict[str, Path] | None = None, context_length: int | None = None,
                 logit_dtype: str = "float32"):
        self.engine, self.logit_dtype = engine, logit_dtype
        self.folders = folders or {}  # role -> checkpoint folder, when loaded from disk
        # longest prompt accepted: attention over an unbounded one grows without limit (23.5 GB at 100 KB)
        self.context_length = context_length

    def checkpoints(self) -> dict[str, Path]:
        """The checkpoint folders this backend runs (capability checkpoint_evidence)."""
        return dict(self.folders)

    def capabilities(self) -> Capabilities:
        e = self.engine
        kinds = (["embedded"] if e.target.args.mtp_layers else []) + (["assistant"] if e.assistant else [])
        from mtpcheck.engine.decode import MAX_DEPTH

        return Capabilities(
            name=e.name,
            version=f"mtpcheck-reference {__version__}",
            vocab_size=e.vocab_size,
            eos_token_ids=list(e.eos_ids),
            mtp_kinds=kinds,
            max_depth=MAX_DEPTH,
            acceptance_rule=e.rule.name,
            seeded_determinism=True,
            position_addressed_target_sampling=True,
            speculative_sampling_controls=["temperature", "top_k", "top_p", "min_p", "seed"],
            target_distributions=True,
            draft_distributions=True,
            raw_logits=True,
            logprobs=True,
            traces=True,
            text=e.tokenizer is not None,
            scheduler=True,
            lookahead="assistant" in kinds,
            constraints=True,
            request_constraints=e.tokenizer is not None,
            streaming=True,
            checkpoint_evidence=bool(self.folders),
            context_length=self.context_length,
            generate_batch=True,
            concurrent=True,
            parallel_samples=True,
            logit_dtype=self.logit_dtype,
            top_k_ties=self.engine.top_k_ties,
            stop_text="special_tokens_kept" if e.tokenizer is not None else None,
            notes=f"default drafter {e.default_speculation.drafter}, depth {e.default_speculation.num_draft_tokens}",
        )

    def generate(self, request: GenerationRequest) -> GenerationResult:
        check_prompt_length(request.prompt_tokens, self.context_length)
        return self.engine.generate(request, constraint=self.output_constraint(request))

    def generate_n(self, request: GenerationRequest, n: int) -> list[GenerationResult]:
        """Capability parallel_samples: sample i runs under child_seed(seed, i)
        (a fresh random seed each when the request has none), served together."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        sp = request.sampling
        seeds = [child_seed(sp.seed, i) for i in range(n)]
        return self.generate_batch([request.model_copy(update={"sampling": sp.model_copy(update={"seed": s})})
                                    for s in seeds])

    def output_constraint(self, request: GenerationRequest):
        """Capability request_constraints: the request's `choice` as the engine's
        constraint automaton (over the tokenizer's per-token texts), or None."""
        if request.constraint is None:
            return None
        from mtpcheck.engine.constraints import TokenDFA

        e = self.engine
        texts = e.token_texts()
        if texts is None:
            raise ValueError("constraint: a choice of strings needs a backend with a tokenizer (text capability)")
        eos = e.eos_ids if request.stop_token_ids is None else request.stop_token_ids
        return TokenDFA.from_strings(request.constraint.choice, texts, eos)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Capability `concurrent`: the requests are served together by the
        engine's own scheduler, as a server serves concurrent users - at most
        SLOTS in flight, a request admitted one scheduler action after the
        previous one (joining while others run) and leaving when done. No
        lookahead: the same work as generate(), interleaved."""
        from mtpcheck.engine.scheduler import Scheduler, SchedulerOptions

        for r in requests:
            check_prompt_length(r.prompt_tokens, self.context_length)
        sched = Scheduler(self.engine, SchedulerOptions(lookahead=False, adaptive_after=None))
        waiting, ids = list(requests), []
        while waiting or sched.runnable():
            if waiting and len(sched.runnable()) < SLOTS:
                req = waiting.pop(0)
                ids.append(sched.submit(req, constraint=self.output_constraint(req)))
            sched.step()
        return [self.engine.result(sched.jobs[i].state) for i in ids]

    def generate_stream(self, request: GenerationRequest):
        """Capability `streaming`: one chunk per round, holding what that round
        published (its token and text events), so a caller sees committed
        tokens only, as they are committed."""
        from mtpcheck.engine.events import stream_chunks

        check_prompt_length(request.prompt_tokens, self.context_length)
        engine = self.engine
        st = engine.start(request, constraint=self.output_constraint(request))
        yield from stream_chunks(st, lambda: engine.step(st))

    def target_logits(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        """Capability raw_logits: the target's unprocessed logits, float64
        [len(continuation), V], row i after prompt + continuation[:i] (one
        teacher-forced pass, speculation off)."""
        import mlx.core as mx

        if not continuation:
            return np.zeros((0, self.engine.vocab_size))
        seq = list(prompt) + list(continuation)
        check_prompt_length(seq, self.context_length)
        _, logits = self.engine.target(mx.array(seq[:-1])[None])  # [1, P+C-1, V]
        return np.array(logits[0, len(prompt) - 1 :], dtype=np.float64)

    def target_distributions(self, prompt: list[int], continuation: list[int], sampling: SamplingParams) -> np.ndarray:
        from mtpcheck.engine.sampling import process

        rows = self.target_logits(prompt, continuation)
        seq = list(prompt) + list(continuation)
        return np.stack([process(rows[i], sampling, seq[: len(prompt) + i], self.engine.top_k_ties)
                         for i in range(len(continuation))]) if len(continuation) else rows

    def draft_distributions(self, request, tokens, accept_lens, draft_lens) -> np.ndarray:
        """The proposal law, replayed on the engine's models with clean drafters (mtpcheck.engine.replay)."""
        from mtpcheck.engine.replay import draft_laws

        return draft_laws(self.engine, request, tokens, accept_lens, draft_lens)

    def open_scheduler(self, lookahead: bool = True, adaptive_after: int | None = 8):
        """A scheduling session (mtpcheck.contracts.scheduling.SchedulerSession) on this engine."""
        from mtpcheck.engine.scheduler import Scheduler, SchedulerOptions

        return Scheduler(self.engine, SchedulerOptions(lookahead=lookahead, adaptive_after=adaptive_after))

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text).ids

    def decode(self, tokens: list[int]) -> str:
        return self.engine.decode_text(tokens)


def load_reference(
    acceptance: str = "rejection",
    drafter: str = "mtp",
    depth: int | str = 3,
    fixture: str | Path | None = None,
    logits: str = "float32",
    jitter: int | str = 0,
    top_k_ties: str = "exactly_k",
) -> ReferenceBackend:
    """fixture: a folder, "tiny" (default: the reference fixture, target/ +
    assistant/), "mlx-vlm" (mlx-vlm's Qwen3.5 fixture, target/ + mtp/, decoded
    through mtpcheck.engine.qwen3_5: the same checkpoint mlx-vlm runs) or
    "mlx-vlm-native" (the same weights as one checkpoint with embedded mtp.*).
    logits: float16 or bfloat16 rounds the target's logits through that dtype
    on every path (verify, plain, ground truth): a correct half-precision
    runtime, declared as such, for calibrating the precision rule; jitter=n
    moves each of its logits by up to n ulps by its row in the forward chunk,
    so the verify, plain and teacher-forced paths disagree as batched kernels do.
    top_k_ties: exactly_k (default) or keep_ties, the target's top-k convention,
    declared as such (Capabilities.top_k_ties)."""
    if logits not in LOGIT_DTYPES:
        raise ValueError(f"logits={logits!r}: expected one of {', '.join(LOGIT_DTYPES)}")
    if top_k_ties not in TOP_K_TIES:
        raise ValueError(f"top_k_ties={top_k_ties!r}: expected one of {', '.join(TOP_K_TIES)}")
    from mtpcheck.fixture import FIXTURE_DIR, REAL_DIR
    from mtpcheck.inspect import check_pair

    named = {"tiny": FIXTURE_DIR, "mlx-vlm": REAL_DIR / "mlx_vlm", "mlx-vlm-native": REAL_DIR / "mlx_vlm" / "native"}
    folder = named.get(str(fixture or "tiny")) or Path(fixture)
    spec = SpeculationRequest(mode="native_mtp", drafter=drafter, num_draft_tokens=int(depth))
    if (logits != "float32" or int(jitter)) and ((folder / "mtp").is_dir() or (folder / "config.json").is_file()):
        raise ValueError(f"logits={logits}: the rounded stand-in runs the reference's own fixture models, not {folder}")
    if (folder / "mtp").is_dir():  # mlx-vlm layout: target/ + separate head mtp/
        return _load_qwen35(folder / "target", folder / "mtp", acceptance, spec, top_k_ties)
    if (folder / "config.json").is_file():  # one checkpoint with an embedded head
        return _load_qwen35(folder, folder, acceptance, spec, top_k_ties)
    # seed 000: an external assistant is validated against the target's
    # tokenizer and vocabulary at load; a mismatch raises AssistantMismatchError
    check_pair(folder / "target", folder / "assistant", strict=True)
    from mtpcheck.engine.decode import Engine
    from mtpcheck.fixture import load_fixture

    target, assistant, tokenizer, meta = load_fixture(folder)
    if logits != "float32" or int(jitter):
        import mlx.core as mx

        target.logit_dtype, target.logit_jitter = getattr(mx, logits), int(jitter)
    engine = Engine(target, assistant, tokenizer=tokenizer, eos_ids=(meta["tokenizer"]["eos_id"],),
                    acceptance=acceptance, default_speculation=spec, top_k_ties=top_k_ties)
    return ReferenceBackend(engine, {"target": folder / "target", "assistant": folder / "assistant"},
                            context_length=context_length(folder / "target"), logit_dtype=logits)


def context_length(folder: Path) -> int | None:
    """The context a checkpoint declares: config.json's max_position_embeddings
    (top level or text_config), else tokenizer_config.json's model_max_length."""
    import json

    def read(name):
        path = folder / name
        return json.loads(path.read_text()) if path.is_file() else {}

    config = read("config.json")
    for value in (config.get("max_position_embeddings"), config.get("text_config", {}).get("max_position_embeddings"),
                  read("tokenizer_config.json").get("model_max_length")):
        if isinstance(value, int) and 0 < value < 2**40:  # tokenizers write 1e30 for "no limit"
            return value
    return None


def _load_qwen35(target: Path, head: Path, acceptance: str, spec: SpeculationRequest,
                 top_k_ties: str = "exactly_k") -> ReferenceBackend:
    """The reference engine over an mlx-vlm Qwen3.5 target and its MTP head
    (a separate folder, or the target folder itself when the head is embedded)."""
    import json

    from mtpcheck.backends._library import require_library
    from mtpcheck.fixture import load_tokenizer
    from mtpcheck.inspect import check_pair

    require_library("mlx_vlm", "mlx-vlm")
    from mtpcheck.engine.decode import Engine
    from mtpcheck.engine.qwen3_5 import load_qwen35

    if spec.drafter != "mtp":
        raise ValueError(f"drafter={spec.drafter!r}: the Qwen3.5 checkpoint {target} has an MTP head and no assistant")
    check_pair(target, head, strict=True)  # hidden size, vocabulary, tokenizer
    form = load_qwen35(target, head)
    eos = json.loads((target / "config.json").read_text()).get("eos_token_id", [])
    engine = Engine(form, None, tokenizer=load_tokenizer(target),
                    eos_ids=tuple(eos if isinstance(eos, list) else [eos]), acceptance=acceptance,
                    default_speculation=spec, top_k_ties=top_k_ties)
    # embedded-head evidence (CAP-HONESTY) exists only when the target checkpoint carries the head
    return ReferenceBackend(engine, {"target": target} if target.resolve() == head.resolve() else None,
                            context_length=context_length(target))
