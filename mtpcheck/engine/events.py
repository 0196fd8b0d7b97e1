"""Semantic events, the stop matcher, and transactional commit.

A round's emitted tokens go through `commit_tokens` one by one; the matcher
decides where the output ends (EOS, stop string, budget) and everything after
that point is dropped before any event is published (bug class B10: a stop
accepted mid-block with tokens after it still emitted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mtpcheck.contracts import FinishEvent, StopEvent, StreamChunk, TextEvent, TokenEvent


@dataclass
class OutputState:
    """Everything a rejection must not advance: committed tokens, published
    text, events. Mutated only by `commit_tokens`."""

    prompt_len: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    events: list = field(default_factory=list)
    text_published: str = ""
    finish_reason: str | None = None


class StopMatcher:
    def __init__(self, decode: Callable[[list[int]], str] | None, stop: Sequence[str], eos: Sequence[int]):
        if stop and decode is None:
            raise ValueError("stop sequences need a backend with a tokenizer (text capability)")
        self.decode, self.stop, self.eos = decode, list(stop), set(eos)

    def text_of(self, tokens: list[int]) -> str:
        return "" if self.decode is None else self.decode([t for t in tokens if t not in self.eos])

    def find_stop(self, text: str) -> tuple[int, str] | None:
        hits = [(text.find(s), s) for s in self.stop if s in text]
        return min(hits) if hits else None

    def holdback(self, text: str) -> int:
        """Characters at the end of `text` that may still grow into a stop
        string or are an incomplete UTF-8 sequence; not published yet."""
        n = 0
        for s in self.stop:
            for i in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:i]):
                    n = max(n, i)
                    break
        while n < len(text) and text[len(text) - n - 1 : len(text) - n] == "\ufffd":
            n += 1
        return n


def commit_tokens(
    out: OutputState,
    matcher: StopMatcher,
    emitted: list[int],
    logprobs: list[float],
    max_tokens: int,
) -> int:
    """Commit the longest allowed prefix of `emitted`; publish its events.
    Returns how many tokens were committed (the rest are dropped)."""
    committed = 0
    for tok, lp in zip(emitted, logprobs, strict=True):
        out.tokens.append(tok)
        out.logprobs.append(lp)
        out.events.append(TokenEvent(index=len(out.tokens) - 1, token=tok, logprob=lp))
        committed += 1
        text = matcher.text_of(out.tokens)
        stop = matcher.find_stop(text)
        if tok in matcher.eos or stop is not None:
            final = text if stop is None else text[: stop[0]]
            _publish_text(out, final)
            out.events.append(StopEvent(matched=f"eos:{tok}" if stop is None else stop[1]))
            out.finish_reason = "stop"
            break
        if len(out.tokens) >= max_tokens:
            _publish_text(out, text)
            out.finish_reason = "length"
            break
        _publish_text(out, text[: len(text) - matcher.holdback(text)])
    if out.finish_reason:
        out.events.append(FinishEvent(reason=out.finish_reason))
    return committed


def _publish_text(out: OutputState, text: str) -> None:
    if len(text) > len(out.text_published) and text.startswith(out.text_published):
        out.events.append(TextEvent(text=text[len(out.text_published) :]))
        out.text_published = text


def stream_chunks(st, advance: Callable[[], None]):
    """Chunks of a request's published events: what `st.out` (an OutputState,
    reached as st.out, st.done) published since the last chunk, after each
    `advance()` until the request is done."""
    sent = 0
    while True:
        new, sent = st.out.events[sent:], len(st.out.events)
        tokens = [e.token for e in new if isinstance(e, TokenEvent)]
        text = "".join(e.text for e in new if isinstance(e, TextEvent))
        if tokens or text or st.done:
            yield StreamChunk(tokens=tokens, text=text, finish_reason=st.out.finish_reason if st.done else None)
        if st.done:
            return
        advance()
