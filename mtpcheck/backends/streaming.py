"""Capability `streaming` for the library adapters (mlx-lm, mlx-vlm).

`drive_stream` is the generator form of `mlx_vlm.drive`: library tokens go
through the project's stop matcher (EOS ids, stop strings, budget) and every
commit is handed to the caller as a StreamChunk at once, so STREAM-COMMIT-ONLY
judges what the library's stream delivers token by token.

For mlx-vlm (whose streaming path is the same `generate_step` its adapter
drives), the adapter's generate splits at `stream = gen.generate_step(...)`
and `generate_stream` yields `drive_stream(stream, request, eos, self.decode)`.

`MlxLmStreaming` maps mlx-lm's own streaming interface, `stream_generate`,
onto `generate_stream`: mix it into MlxLmBackend (class MlxLmBackend(MlxLmStreaming,
LibraryBackend)) and declare `streaming=True`. `load_mlx_lm_streaming` does
both without touching the adapter, for the suite: `--mtp-backend=
mtpcheck.backends.streaming:load_mlx_lm_streaming`.

Import this module freely: the libraries are imported when a stream starts.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from mtpcheck.contracts import GenerationRequest, StreamChunk


class _Driven:
    """A library token stream committed one token at a time (what stream_chunks advances)."""

    def __init__(self, tokens: Iterable[int], req: GenerationRequest, eos: list[int], decode):
        from mtpcheck.engine.events import OutputState, StopMatcher

        self.tokens, self.req = iter(tokens), req
        self.out = OutputState(prompt_len=len(req.prompt_tokens))
        self.matcher = StopMatcher(decode, req.stop, eos)

    @property
    def done(self) -> bool:
        return self.out.finish_reason is not None

    def advance(self) -> None:
        from mtpcheck.contracts import FinishEvent, TextEvent
        from mtpcheck.engine.events import commit_tokens

        item = next(self.tokens, None)
        if item is not None:  # a token id, or a library tuple led by one (as drive takes them)
            tok = item[0] if isinstance(item, tuple) else item
            commit_tokens(self.out, self.matcher, [int(tok)], [None], self.req.max_tokens)
            return
        # the library stopped before the budget: publish what the matcher held back (as drive does)
        out, text = self.out, self.matcher.text_of(self.out.tokens)
        if len(text) > len(out.text_published) and text.startswith(out.text_published):
            out.events.append(TextEvent(text=text[len(out.text_published):]))
            out.text_published = text
        out.finish_reason = "length"
        out.events.append(FinishEvent(reason="length"))


def drive_stream(tokens: Iterable[int], req: GenerationRequest, eos: list[int], decode) -> Iterator[StreamChunk]:
    """Chunks of the committed output of a library token stream, in arrival order."""
    from mtpcheck.engine.events import stream_chunks

    driven = _Driven(tokens, req, eos, decode)
    yield from stream_chunks(driven, driven.advance)


class MlxLmStreaming:
    """`generate_stream` through mlx-lm's `stream_generate`, with the sampler,
    processors and seed `MlxLmBackend.generate` uses (so a seeded stream and a
    seeded generate() agree). Stops are the request's: mlx-lm's own EOS check
    is switched off and the project's matcher ends the stream."""

    def generate_stream(self, request: GenerationRequest) -> Iterator[StreamChunk]:
        import mlx.core as mx

        from mtpcheck.backends.mlx_lm import EXTRA
        from mtpcheck.backends.mlx_vlm import check_request, penalty_processors, require_library

        gen = require_library("mlx_lm.generate", EXTRA)
        sample_utils = require_library("mlx_lm.sample_utils", EXTRA)
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        check_request(request, self.vocab_size)
        _, used, depth, _, _ = self.plan(request)
        sp = request.sampling
        seed = sp.seed if sp.seed is not None else random.SystemRandom().randrange(2**31)
        kwargs = {"max_tokens": request.max_tokens, "sampler": self.sampler(sp, sample_utils)}
        if sp.speculation_blockers():
            context = len(request.prompt_tokens) + request.max_tokens
            kwargs["logits_processors"] = penalty_processors(sp, context, sample_utils)
        if used:
            kwargs.update(draft_model=self.draft_model, num_draft_tokens=depth)
        tokenizer = TokenizerWrapper(self.tokenizer)
        tokenizer.eos_token_ids = []  # stops are the request's (the matcher below)
        eos = self.eos_ids if request.stop_token_ids is None else list(request.stop_token_ids)
        mx.random.seed(seed % 2**32)
        responses = gen.stream_generate(self.model, tokenizer, mx.array(request.prompt_tokens, dtype=mx.uint32),
                                        **kwargs)
        try:
            # each response carries one token once: the last one (finish_reason set) the budget's last
            yield from drive_stream((r.token for r in responses), request, eos, self.decode)
        finally:
            responses.close()


def load_mlx_lm_streaming(**options: str):
    """mlx-lm's adapter with MlxLmStreaming mixed in and `streaming` declared."""
    from mtpcheck.backends.mlx_lm import MlxLmBackend, load_mlx_lm

    backend = load_mlx_lm(**options)

    class Streaming(MlxLmStreaming, MlxLmBackend):
        def capabilities(self):
            return super().capabilities().model_copy(update={"streaming": True})

    backend.__class__ = Streaming
    return backend
