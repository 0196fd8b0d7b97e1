"""A backend seen from its output only: the white-box capabilities withheld.

Real runtimes (mlx-vlm, mlx-lm, llama.cpp, vLLM, SGLang) expose no round
traces, scheduler or constraint hooks; `BlackBox(backend)` declares what such
a runtime declares, so the suite judges the wrapped backend by the black-box
clauses alone (`mtpcheck mutants --black-box`, issue 12). A mask, not an edit
of each mutant: the wrapped backend keeps its bug; only what the suite can see
of it changes.
"""

from __future__ import annotations

from mtpcheck.contracts import GenerationRequest, GenerationResult

# what a runtime without hooks declares; everything else (laws, seeds, text,
# streaming, checkpoint folders) is kept as the wrapped backend declares it
WHITE_BOX = {"traces": False, "logprobs": False, "scheduler": False, "lookahead": False, "constraints": False}
# the optional methods a runtime without hooks may still offer
PASSED_THROUGH = ("encode", "decode", "checkpoints", "generate_stream")


class BlackBox:
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name: str):
        # only the optional black-box surface; open_scheduler and the like stay hidden
        if name in PASSED_THROUGH:
            return getattr(self.inner, name)
        raise AttributeError(f"{type(self.inner).__name__} seen black-box has no {name}")

    def capabilities(self):
        return self.inner.capabilities().model_copy(update=WHITE_BOX)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        res = self.inner.generate(request.model_copy(update={"trace": False}))
        return res.model_copy(update={"trace": None, "logprobs": None})

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        # a runtime that batches (parallel slots) may declare it black-box too; same mask as generate
        if not hasattr(self.inner, "generate_batch"):
            raise AttributeError(f"{type(self.inner).__name__} seen black-box has no generate_batch")
        results = self.inner.generate_batch([r.model_copy(update={"trace": False}) for r in requests])
        return [res.model_copy(update={"trace": None, "logprobs": None}) for res in results]

    def target_distributions(self, prompt, continuation, sampling):
        return self.inner.target_distributions(prompt, continuation, sampling)

    def target_logits(self, prompt, continuation):
        # ground truth like the laws (capability raw_logits), not a white-box hook: kept
        return self.inner.target_logits(prompt, continuation)


def load_black_box(backend: str = "toy", **options: str) -> BlackBox:
    """Backend factory: `--mtp-backend=mtpcheck.backends.blackbox:load_black_box
    --mtp-backend-option backend=NAME [other options of that backend]`."""
    from mtpcheck.backends import load_backend

    return BlackBox(load_backend(backend, options))
