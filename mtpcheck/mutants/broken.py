"""Backends broken at the protocol level: they raise, hang, or answer garbage.
The suite must turn each into a named failure and carry on."""

from __future__ import annotations

import time

from mtpcheck.backends.toy import load_toy


class _Wrapper:
    def __init__(self, inner):
        self.inner = inner
        self.engine = inner.engine

    def capabilities(self):  # the wrapper offers no stream: what it breaks is generate()
        return self.inner.capabilities().model_copy(update={"streaming": False})

    def generate(self, req):
        return self.inner.generate(req)

    def generate_batch(self, reqs):  # through this wrapper's own (broken) generate()
        return [self.generate(r) for r in reqs]

    def target_distributions(self, prompt, continuation, sampling):
        return self.inner.target_distributions(prompt, continuation, sampling)

    def target_logits(self, prompt, continuation):
        return self.inner.target_logits(prompt, continuation)


class Raising(_Wrapper):
    def generate(self, req):
        raise RuntimeError("device lost")


class Hanging(_Wrapper):
    def generate(self, req):
        time.sleep(3600)


class OutOfVocab(_Wrapper):
    def generate(self, req):
        res = self.inner.generate(req)
        return res.model_copy(update={"tokens": [t + 10_000 for t in res.tokens]})


class WrongType(_Wrapper):
    def generate(self, req):
        return {"tokens": "not a list"}


class BadLaws(_Wrapper):
    def target_distributions(self, prompt, continuation, sampling):
        return self.inner.target_distributions(prompt, continuation, sampling)[:, :-1] * 2


class NoTraces(_Wrapper):
    def capabilities(self):
        return self.inner.capabilities().model_copy(update={"traces": False})


KINDS = {"raising": Raising, "hanging": Hanging, "out-of-vocab": OutOfVocab, "wrong-type": WrongType,
         "bad-laws": BadLaws, "no-traces": NoTraces}


def load_broken(kind: str, **options: str):
    """`--mtp-backend=mtpcheck.mutants.broken:load_broken --mtp-backend-option kind=raising`."""
    if kind not in KINDS:
        raise ValueError(f"unknown broken kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind](load_toy(**options))
