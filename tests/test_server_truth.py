"""The HTTP adapters' one ground-truth path (httpserver.ServerTruth) as each
adapter parameterises it, on canned answers (no server): the requests sent,
the rows, the retries over seeds, the memo and the error texts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mtpcheck.backends.httpserver import ServerError
from mtpcheck.contracts import SamplingParams

V = 8
P = np.array([0.4, 0.2, 0.15, 0.1, 0.06, 0.05, 0.03, 0.01])
SP = SamplingParams(temperature=0.7)


def legacy(p, ids=range(V)):
    return {"choices": [{"logprobs": {"top_logprobs": [{f"token_id:{i}": math.log(p[i]) for i in ids}]}}]}


def native(p):
    return {"completion_probabilities": [{"top_probs": [{"id": i, "prob": float(p[i])} for i in range(V)]}]}


class Answers:
    """A post(...) that records the bodies and answers from a list (the last one repeats)."""

    def __init__(self, *answers):
        self.answers, self.bodies = list(answers), []

    def __call__(self, *args):
        self.bodies.append(args[-1])
        return self.answers[min(len(self.bodies), len(self.answers)) - 1]


def vllm(answers):
    from mtpcheck.backends.vllm_server import VllmBackend

    b = object.__new__(VllmBackend)
    b.vocab_size, b.post = V, answers
    return b


def llama(answers):
    from mtpcheck.backends.llama_server import LlamaServerBackend

    b = object.__new__(LlamaServerBackend)
    b.vocab_size, b.ctx = V, 64
    b.client = lambda depth: type("C", (), {"post": staticmethod(answers)})()
    return b


def openai(answers, dialect="vllm", n=3):
    from mtpcheck.backends.openai_http import load_openai_http

    b = load_openai_http(url="http://127.0.0.1:9", plain_url="http://127.0.0.1:8", dialect=dialect,
                         vocab_size=str(V), top_logprobs=str(n))
    b.plain.post = answers
    return b


def test_vllm_asks_once_for_the_whole_law_and_memoises_it():
    ask = Answers(legacy(P))
    b = vllm(ask)
    assert np.allclose(b.law([1, 2], SP), P) and np.allclose(b.law([1, 2], SP), P)
    assert len(ask.bodies) == 1
    body = ask.bodies[0]
    assert (body["logprobs"], body["ignore_eos"], body["seed"], body["max_tokens"]) == (V, True, 0, 1)
    rows = b.target_distributions([1], [2, 3], SP)
    assert rows.shape == (2, V) and len(ask.bodies) == 2  # [1] asked, [1, 2] memoised


@pytest.mark.parametrize("answer,text", [
    ({"choices": [{"logprobs": {}}]}, "no top_logprobs in the plain server's answer (start it with --max-logprobs V)"),
    ({"choices": [{"logprobs": {"top_logprobs": [{"a": -0.1}]}}]},
     "top_logprobs keyed by text: the plain server needs --return-tokens-as-token-ids"),
    (legacy(P * 0.5), "processed probabilities sum to 0.5, not 1 (logprobs=8): "
                      "start the plain server with --logprobs-mode processed_logprobs"),
])
def test_vllm_errors_say_what_to_start_the_server_with(answer, text):
    ask = Answers(answer)
    with pytest.raises(ServerError) as e:
        vllm(ask).law([1], SP)
    assert str(e.value) == text and len(ask.bodies) == 1


def test_llama_server_tries_seeds_until_probabilities_come_back():
    ask = Answers({"completion_probabilities": []}, {}, native(P))
    b = llama(ask)
    assert np.allclose(b.law([1, 2, 3], SP), P)
    assert [x["seed"] for x in ask.bodies] == [0, 1, 2]
    assert all(x["n_probs"] == V and x["post_sampling_probs"] and x["n_predict"] == 1 for x in ask.bodies)
    with pytest.raises(ServerError, match=r"^no completion_probabilities after 64 seeds for a prefix of 2 tokens$"):
        llama(Answers({})).law([1, 2], SP)
    with pytest.raises(ServerError, match=r"^post-sampling probabilities sum to 0\.9, not 1 \(n_probs=8\)$"):
        llama(Answers(native(P * 0.9))).law([1], SP)


def test_openai_http_keeps_the_top_n_unnormalised():
    p = P.copy()
    ask = Answers({"choices": [{"logprobs": {}}]}, legacy(p, ids=[0, 1, 2, 6]))  # vLLM adds the sampled token
    row = openai(ask).law([4], SP)
    assert np.allclose(row, np.where(np.arange(V) < 3, P, 0.0)) and [x["seed"] for x in ask.bodies] == [0, 1]
    assert ask.bodies[0]["logprobs"] == 3 and "post_sampling_probs" not in ask.bodies[0]
    with pytest.raises(ServerError, match=r"^top-3 probabilities sum to 1\.5 > 1$"):
        openai(Answers(legacy(P * 2, ids=[0, 1, 2]))).law([4], SP)
    with pytest.raises(ServerError, match=r"^top_logprobs keyed by text: start vLLM with --return-tokens-as-token-ids$"):
        openai(Answers({"choices": [{"logprobs": {"top_logprobs": [{"a": -0.1}]}}]})).law([4], SP)
    with pytest.raises(ServerError, match=r"^no log-probabilities after 64 seeds for a prefix of 1 tokens$"):
        openai(Answers({})).law([4], SP)


def test_openai_http_llama_cpp_dialect_reads_content_and_renormalises_a_whole_law():
    content = {"choices": [{"logprobs": {"content": [{"id": 0, "top_probs": [
        {"id": i, "prob": float(P[i] * 0.99995)} for i in range(V)]}]}}]}
    ask = Answers(content)
    row = openai(ask, dialect="llama.cpp", n=V).law([4], SP)
    assert np.isclose(row.sum(), 1.0) and np.allclose(row, P) and ask.bodies[0]["post_sampling_probs"] is True
    logp = {"choices": [{"logprobs": {"content": [{"top_logprobs": [
        {"id": i, "logprob": math.log(P[i])} for i in range(3)]}]}}]}
    assert np.allclose(openai(Answers(logp), dialect="llama.cpp").law([4], SP)[:3], P[:3])
