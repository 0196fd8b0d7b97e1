"""The vllm backend's pure parts (no vLLM needed): the request mapping, the
rounds read from vLLM's per-request metrics (shared with openai-http's vllm
dialect), the n-gram replay of steps vLLM does not record, and the
speculation plan for controls vLLM refuses with speculation. The suite
proper runs with ``pytest --pyargs mtpcheck.suite --mtp-backend=vllm``
(docs/backends/vllm.md); the padded checkpoint it serves is proved in
tests/test_hf_export.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mtpcheck.backends.httpserver import (
    Client,
    ServerError,
    kept_rounds,
    ngram_proposes,
    vllm_rounds,
    vllm_steps,
)
from mtpcheck.contracts import GenerationRequest, SamplingParams, SpeculationUnavailableError


def _resp(drafted, accepted, steps=None):
    block = {"num_spec_steps": len(drafted or []) if steps is None else steps,
             "per_step_drafted": drafted, "per_step_accepted": accepted}
    return {"metrics": {"speculative_decoding": block}}


def test_steps_come_from_the_per_step_arrays():
    assert vllm_steps(_resp([3, 3, 3], [0, 2, 1])) == [(3, 0), (3, 2), (3, 1)]
    assert vllm_steps(_resp(None, None, steps=0)) == []  # max_tokens=1: no step, arrays null
    assert vllm_steps({"metrics": None}) is None  # the server runs without the flag
    with pytest.raises(ServerError, match="detailed"):
        vllm_steps(_resp(None, None, steps=4))  # summary level: counts without the arrays
    with pytest.raises(ServerError, match="entries"):
        vllm_steps(_resp([3, 3], [1]))


def test_rounds_are_cut_to_the_tokens_emitted():
    # 1 prefill token + (2+1) + (3+1): 8 tokens implied, 6 emitted (the budget cut the last block)
    assert kept_rounds([(3, 2), (3, 3)], 6) == ([2, 1], [3, 3])
    # a stop string cut the output after the first round: the second round is dropped
    assert kept_rounds([(3, 2), (3, 3)], 4) == ([2], [3])
    assert kept_rounds([(3, 2)], 1) == ([], [])  # only the prefill token was kept


def test_ngram_rule_is_a_suffix_seen_before():
    assert ngram_proposes([1, 2, 3, 1, 2], 2)  # [1, 2] occurs earlier
    assert not ngram_proposes([1, 2, 3, 2, 1], 2)
    assert not ngram_proposes([1, 2], 2)  # nothing before the suffix
    assert ngram_proposes([7, 7, 7], 2)  # overlapping occurrence, as vLLM's KMP finds it


def test_steps_without_proposals_are_replayed_where_the_ngram_finds_nothing():
    prompt = [1, 2, 3]
    # tokens: t0 from the prefill; context [1,2,3,9]: no match -> a 0-draft step emits 1;
    # [1,2,3,9,1]: no match -> 0-draft step; [1,2,3,9,1,2]: [1,2] seen -> a recorded step (3 drafted, 2 accepted)
    tokens = [9, 1, 2, 3, 9, 5]
    rounds, note = vllm_rounds([(3, 2)], prompt, tokens, ngram_min=2)
    assert rounds == [(0, 0), (0, 0), (3, 2)] and note is None
    # without the n-gram rule (or when the replay disagrees) the missing steps go first, with a note
    rounds, note = vllm_rounds([(3, 2)], prompt, tokens)
    assert rounds == [(0, 0), (0, 0), (3, 2)] and "missing" in note


def test_sampling_and_stops_are_vllms_fields():
    from mtpcheck.backends.httpserver import vllm_stop_fields as stop_fields
    from mtpcheck.backends.vllm_server import sampling_fields

    sp = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, repetition_penalty=1.3,
                        presence_penalty=0.5, frequency_penalty=0.25, logit_bias={7: -2.0, 3: 1.5}, seed=4)
    f = sampling_fields(sp)
    assert (f["temperature"], f["top_k"], f["top_p"], f["min_p"]) == (0.7, 5, 0.9, 0.1)
    assert (f["repetition_penalty"], f["presence_penalty"], f["frequency_penalty"]) == (1.3, 0.5, 0.25)
    assert f["logit_bias"] == {"3": 1.5, "7": -2.0}
    assert sampling_fields(SamplingParams())["top_k"] == -1
    mapped = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty", "logit_bias", "seed"}
    assert set(SamplingParams.model_fields) <= mapped, "a new contract field must be mapped or refused"
    assert stop_fields(None, [0]) == {"ignore_eos": False, "stop_token_ids": []}
    assert stop_fields([], [0]) == {"ignore_eos": True, "stop_token_ids": []}
    assert stop_fields([5, 0], [0]) == {"ignore_eos": True, "stop_token_ids": [5, 0]}


def _attached(**kw):
    from mtpcheck.backends.vllm_server import load_vllm

    return load_vllm(url="http://127.0.0.1:9", plain_url="http://127.0.0.1:8", vocab_size="512", **kw)


@pytest.mark.parametrize("control", [{"min_p": 0.1}, {"logit_bias": {3: 1.0}}])
def test_controls_vllm_refuses_with_speculation_are_served_plain_and_said(control):
    b = _attached()
    req = GenerationRequest(prompt_tokens=[1, 2], sampling=SamplingParams(temperature=1.0, **control),
                            speculation=True)
    _, used, _, reason, message = b.plan(req)
    assert (used, reason) == (False, "sampling_control_unsupported") and next(iter(control)) in message
    strict = GenerationRequest(prompt_tokens=[1, 2], sampling=req.sampling,
                               speculation={"mode": "native_mtp", "require_acceleration": True})
    with pytest.raises(SpeculationUnavailableError):
        b.plan(strict)
    assert b.plan(req.model_copy(update={"sampling": SamplingParams(presence_penalty=0.5)}))[1]


def test_top_k_is_served_plain_unless_the_guard_is_off():
    req = GenerationRequest(prompt_tokens=[1, 2], sampling=SamplingParams(temperature=1.0, top_k=5), speculation=True)
    _, used, _, reason, message = _attached().plan(req)
    assert (used, reason) == (False, "sampling_control_unsupported") and "V1" in message
    assert _attached(top_k_guard="off").plan(req)[1]
    greedy = GenerationRequest(prompt_tokens=[1, 2], sampling=SamplingParams(temperature=0.0, top_k=5),
                               speculation=True)
    assert _attached().plan(greedy)[1]  # greedy: the sampler's top-k path is not taken
    assert "top_k" not in _attached().capabilities().speculative_sampling_controls


def test_capabilities_per_configuration():
    draft, ngram = _attached().capabilities(), _attached(config="ngram").capabilities()
    assert (draft.drafting, draft.mtp_kinds, draft.depths) == ("fixed", ["assistant"], [3])
    assert (ngram.drafting, ngram.mtp_kinds) == ("up_to_k", ["model_free"])
    assert "min_p" not in draft.speculative_sampling_controls and "logit_bias" not in draft.speculative_sampling_controls
    assert _attached(num_draft_tokens="5").plan(GenerationRequest(
        prompt_tokens=[1], speculation={"num_draft_tokens": 2}))[3] == "depth_exceeds_capability"


def test_options_are_checked():
    from mtpcheck.backends.vllm_server import load_vllm

    with pytest.raises(ValueError, match="config="):
        load_vllm(config="eagle", url="http://x", plain_url="http://y", vocab_size="5")
    with pytest.raises(ValueError, match="go together"):
        load_vllm(url="http://x")


def test_openai_http_vllm_dialect_reads_the_per_request_metrics():
    """openai-http with dialect=vllm no longer raises NoSpeculationCounters: the
    rounds come from the same per-step arrays as the vllm backend's."""
    from mtpcheck.backends.openai_http import load_openai_http

    b = load_openai_http(url="http://127.0.0.1:9", plain_url="http://127.0.0.1:8", dialect="vllm",
                         vocab_size="512", depth="3")
    sent = []

    def post(path, body):
        sent.append(body)
        toks = [5, 6, 7, 8, 9, 10]  # 1 prefill + (2+1) + (3+1) implied 8: the budget cut the last block
        return {"choices": [{"token_ids": toks, "finish_reason": "length"}], "usage": {"completion_tokens": 6},
                **_resp([3, 3], [2, 3])}

    b.spec.post = post
    res = b.generate(GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=6, speculation=True, stop_token_ids=[]))
    s = res.speculation
    assert s.used and (s.accept_lens, s.draft_lens) == ([2, 1], [3, 3]) and len(res.tokens) == 6
    assert sent[0]["ignore_eos"] is True and sent[0]["stop_token_ids"] == []
    refused = b.generate.__self__.capabilities().speculative_sampling_controls
    assert "min_p" not in refused and "logit_bias" not in refused
    b.plain.post = post
    res = b.generate(GenerationRequest(prompt_tokens=[1], max_tokens=6, speculation=True,
                                       sampling=SamplingParams(min_p=0.2)))
    assert (res.speculation.used, res.speculation.reason) == (False, "sampling_control_unsupported")


def test_a_server_that_dies_is_a_named_failure_and_is_restarted(monkeypatch):
    """HTTP 500 then connection refused: VllmServerDied names the request; the
    next request to that server starts a fresh one (no cascade of errors)."""
    from mtpcheck.backends import vllm_server
    from mtpcheck.backends.vllm_server import VllmServerDied

    b = _attached()

    class Dead:
        pid, url = 4242, "http://127.0.0.1:9"

        def alive(self):
            return False

        def log_tail(self, n):
            return "EngineDeadError"

        def stop(self):
            self.stopped = True

    dead = Dead()
    b.servers = {"spec": dead}

    def refused(path, body):
        raise ServerError("POST http://127.0.0.1:9/v1/completions: HTTP 500: EngineCore encountered an issue")

    b.clients["spec"].post = refused
    body = {"prompt": [1, 2, 3], "max_tokens": 5, "top_k": 5}
    with pytest.raises(VllmServerDied, match=r"spec vLLM server died.*\[1, 2, 3\].*top_k.*EngineDeadError"):
        b.post("spec", body)
    started = []
    monkeypatch.setattr(vllm_server.VllmBackend, "_start", lambda self, keys: started.extend(keys) or
                        self.clients.update({k: Client("http://127.0.0.1:7") for k in keys}))
    b.client("spec")
    assert started == ["spec"] and getattr(dead, "stopped", False) and b.restarts == 1


def test_each_server_gets_its_own_cores():
    b = _attached(cores="0-7;8-15")
    assert (b._env("plain")["VLLM_CPU_OMP_THREADS_BIND"], b._env("spec")["VLLM_CPU_OMP_THREADS_BIND"]) == ("0-7", "8-15")
    b = _attached(cores="0,1")
    assert (b._env("plain")["VLLM_CPU_OMP_THREADS_BIND"], b._env("spec")["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")


SLEEPER = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
           "time.sleep(60)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_killed_suite_leaves_no_server_behind(tmp_path):
    """The harness starts servers from worker threads (no parent-death signal):
    when the process that started one dies without exit handlers (SIGKILL), its
    watchdog stops the server and the processes the server had started."""
    import subprocess
    import textwrap
    import time

    from mtpcheck.backends._watchdog import alive

    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, threading, time
        from mtpcheck.backends.httpserver import ServerProcess, descendants
        box = []
        t = threading.Thread(target=lambda: box.append(ServerProcess(sys.executable, ["-c", {SLEEPER!r}], "wd",
                             stop_grace=2.0, watchdog=True).launch()))
        t.start(); t.join(); time.sleep(2.5)
        print(box[0].proc.pid, *descendants(box[0].proc.pid), flush=True)
        os._exit(9)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    deadline = time.monotonic() + 15
    while any(alive(p) and "zombie" not in _state(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if alive(p) and "zombie" not in _state(p)]
    for p in left:
        os.kill(p, 9)
    assert not left, f"server processes {left} outlived the suite"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "zombie"


def _oai_vllm():
    from mtpcheck.backends.openai_http import load_openai_http

    return load_openai_http(url="http://127.0.0.1:9", plain_url="http://127.0.0.1:8", dialect="vllm",
                            vocab_size="512", depth="3")


def test_openai_http_streams_the_servers_sse_and_closes_it_when_the_caller_goes_away():
    """generate_stream (vllm dialect): each SSE chunk's token_ids through the stop matcher; a caller
    that closes the stream part-way closes the server's event stream (the connection), at once."""
    from mtpcheck.contracts import StreamChunk

    b, closed, sent = _oai_vllm(), [], []

    def stream(path, body):
        sent.append(body)

        def events():
            try:
                for i in range(6):
                    yield {"choices": [{"token_ids": [10 + i], "finish_reason": "length" if i == 5 else None}]}
            finally:
                closed.append(True)
        return events()

    b.spec.stream = stream
    req = GenerationRequest(prompt_tokens=[1, 2], max_tokens=6, speculation=True, stop_token_ids=[])
    chunks = [StreamChunk(**c) for c in b.generate_stream(req)]
    assert [t for c in chunks for t in c.tokens] == [10, 11, 12, 13, 14, 15] and chunks[-1].finish_reason == "length"
    assert sent[0]["stream"] is True and sent[0]["ignore_eos"] is True and b.capabilities().streaming
    gen = b.generate_stream(req)
    next(gen), next(gen)
    gen.close()
    assert closed == [True, True]


def test_openai_http_asks_vllm_again_without_logprobs_when_they_cannot_be_written():
    """V10 through openai-http: HTTP 400 'Out of range float values' for a -inf logprob; the tokens are
    asked again without logprobs and reported as NaN (LOGPROBS names them), never lost."""
    import math

    b, sent = _oai_vllm(), []

    def post(path, body):
        sent.append(body)
        if "logprobs" in body:
            raise ServerError("POST x: HTTP 400: {'message': 'Out of range float values are not JSON compliant'}")
        return {"choices": [{"token_ids": [5, 6], "finish_reason": "length"}], "usage": {"completion_tokens": 2},
                **_resp([3], [0])}

    b.spec.post = post
    req = GenerationRequest(prompt_tokens=[1], max_tokens=2, speculation=True, stop_token_ids=[], logprobs=True,
                            sampling=SamplingParams(temperature=1.0, seed=3))
    res = b.generate(req)
    assert res.tokens == [5, 6] and all(math.isnan(x) for x in res.logprobs) and len(sent) == 2
    b.spec.post = lambda path, body: (_ for _ in ()).throw(ServerError("HTTP 400: another refusal"))
    with pytest.raises(ServerError, match="another refusal"):
        b.generate(req)


def test_post_logprobs_asks_again_without_logprobs_only_for_v10():
    from mtpcheck.backends.httpserver import post_logprobs

    sent = []

    def post(body):
        sent.append(body)
        if "logprobs" in body:
            raise ServerError("HTTP 400: Out of range float values are not JSON compliant")
        return {"ok": 1}

    assert post_logprobs(post, {"a": 1}, {"logprobs": 0}) == ({"ok": 1}, False) and sent == [{"a": 1, "logprobs": 0},
                                                                                             {"a": 1}]
    assert post_logprobs(lambda b: b, {"a": 1}, {"logprobs": 0}) == ({"a": 1, "logprobs": 0}, True)
    assert post_logprobs(lambda b: b, {"a": 1}, {}) == ({"a": 1}, False)
    with pytest.raises(ServerError, match="Out of range"):
        post_logprobs(post, {"a": 1}, {"logprobs": 0}, retry=False)
    with pytest.raises(ServerError, match="Out of range"):  # nothing asked: nothing to leave out
        post_logprobs(lambda b: post({**b, "logprobs": 0}), {"a": 1}, {})
