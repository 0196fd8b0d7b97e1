"""A backend seen from outside: the white-box capabilities withheld.

Two masks (`mtpcheck mutants --black-box` / `--server`):

* ``output``: what a runtime shows in its final tokens alone - no round
  traces, logprobs, scheduler, lookahead or constraint hooks, and requests
  served one at a time (generate_batch kept, `concurrent` withheld);
* ``server``: what a real server shows through its ordinary API - only the
  traces and the hooks (scheduler, lookahead, constraint states) withheld;
  requests in flight together, logprobs and streams kept as declared.

A mask, not an edit of each mutant: the wrapped backend keeps its bug; only
what the suite can see of it changes.
"""

from __future__ import annotations

from mtpcheck.contracts import GenerationRequest, GenerationResult

# what a runtime without hooks declares; everything else (laws, seeds, text,
# streaming, checkpoint folders) is kept as the wrapped backend declares it
WHITE_BOX = {"traces": False, "logprobs": False, "scheduler": False, "lookahead": False, "constraints": False}
HOOKS = {"traces": False, "scheduler": False, "lookahead": False, "constraints": False}
# a request's structured-output field is API, not a hook: the server mask keeps it
MASKS = {"output": {**WHITE_BOX, "concurrent": False, "request_constraints": False, "parallel_samples": False},
         "server": HOOKS}
# the optional methods a runtime without hooks may still offer
PASSED_THROUGH = ("encode", "decode", "checkpoints", "generate_stream")


class BlackBox:
    def __init__(self, inner, mask: str = "output"):
        if mask not in MASKS:
            raise ValueError(f"mask={mask!r}: expected one of {', '.join(MASKS)}")
        self.inner, self.mask = inner, mask

    def __getattr__(self, name: str):
        # only the optional black-box surface; open_scheduler and the like stay hidden
        if name in PASSED_THROUGH:
            return getattr(self.inner, name)
        raise AttributeError(f"{type(self.inner).__name__} seen black-box has no {name}")

    def capabilities(self):
        return self.inner.capabilities().model_copy(update=MASKS[self.mask])

    def _seen(self, res: GenerationResult) -> GenerationResult:
        return res.model_copy(update={"trace": None, **({"logprobs": None} if self.mask == "output" else {})})

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return self._seen(self.inner.generate(request.model_copy(update={"trace": False})))

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        # served together where the mask keeps `concurrent`; one after another where it does not
        if not hasattr(self.inner, "generate_batch"):
            raise AttributeError(f"{type(self.inner).__name__} seen black-box has no generate_batch")
        reqs = [r.model_copy(update={"trace": False}) for r in requests]
        if self.mask == "output":
            return [self.generate(r) for r in reqs]
        return [self._seen(res) for res in self.inner.generate_batch(reqs)]

    def generate_n(self, request: GenerationRequest, n: int) -> list[GenerationResult]:
        if self.mask == "output":
            raise AttributeError(f"{type(self.inner).__name__} seen output-only has no generate_n")
        return [self._seen(r) for r in self.inner.generate_n(request.model_copy(update={"trace": False}), n)]

    def target_distributions(self, prompt, continuation, sampling):
        return self.inner.target_distributions(prompt, continuation, sampling)

    def draft_distributions(self, request, tokens, accept_lens, draft_lens):
        # ground truth of the declared proposal law, computed from the fixture's weights: kept
        return self.inner.draft_distributions(request.model_copy(update={"trace": False}), tokens, accept_lens,
                                              draft_lens)

    def target_logits(self, prompt, continuation):
        # ground truth like the laws (capability raw_logits), not a white-box hook: kept
        return self.inner.target_logits(prompt, continuation)


def load_black_box(backend: str = "toy", mask: str = "output", **options: str) -> BlackBox:
    """Backend factory: `--mtp-backend=mtpcheck.backends.blackbox:load_black_box
    --mtp-backend-option backend=NAME [mask=output|server] [other options of that backend]`."""
    from mtpcheck.backends import load_backend

    if mask not in MASKS:
        raise ValueError(f"mask={mask!r}: expected one of {', '.join(MASKS)}")
    return BlackBox(load_backend(backend, options), mask)
