"""The llama-server backend: the GGUF conversion of the shipped fixtures, the
adapter's pure parts, and - when a llama-server binary is installed (extra
``llama-cpp``) - the conversion proved against the MLX runtimes and the
servers' lifecycle. The conformance suite proper runs with
``pytest --pyargs mtpcheck.suite --mtp-backend=llama-server``."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from mtpcheck.contracts import GenerationRequest, SamplingParams

HAVE_LM = importlib.util.find_spec("mlx_lm") is not None
HAVE_VLM = importlib.util.find_spec("mlx_vlm") is not None


def _binary():
    from mtpcheck.backends.llama_server import LlamaServerUnavailable, find_binary

    try:
        return find_binary()
    except LlamaServerUnavailable as exc:
        return str(exc)


BINARY = _binary()
needs_server = pytest.mark.skipif(isinstance(BINARY, str), reason=f"llama-server not installed: {BINARY}")

# Agreement of the converted models with the MLX runtimes on the fixture prompts
# (measured: see docs/backends/llama-server.md, "The GGUF conversion"). MLX runs
# the fixtures in float16, llama.cpp the float32 GGUF: the laws differ by the
# float16 rounding of the MLX logits.
PROB_TOL = 0.01  # max |p_mlx - p_llama| over MLX's top 5 tokens at every position (measured <= 0.006)
NEAR_TIE = 0.03  # nats: a greedy divergence is excused only where MLX's top two are this close


# -- conversion (no binary needed) ---------------------------------------------


@pytest.fixture(scope="module")
def ggufs():
    from mtpcheck.fixture import gguf_export

    return {label: gguf_export.cached_gguf(src) for label, src in gguf_export.fixtures().items()}


def _reader(path):
    import gguf

    return gguf.GGUFReader(str(path))


def test_qwen35_gguf_has_the_nextn_block(ggufs):
    r = _reader(ggufs["qwen35-native"])
    assert r.fields["general.architecture"].contents() == "qwen35"
    assert r.fields["qwen35.block_count"].contents() == 4  # 3 trunk layers + 1 nextn
    assert r.fields["qwen35.nextn_predict_layers"].contents() == 1
    names = {t.name for t in r.tensors}
    for n in ("blk.3.nextn.eh_proj.weight", "blk.3.nextn.enorm.weight", "blk.3.nextn.hnorm.weight",
              "blk.3.nextn.shared_head_norm.weight", "blk.3.attn_q.weight", "blk.0.ssm_a", "blk.0.ssm_conv1d.weight"):
        assert n in names, n
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 512


def test_v_head_reorder_is_llama_cpps_permutation():
    """Grouped V heads [G0v0 G0v1 G1v0 G1v1] -> tiled [G0v0 G1v0 G0v1 G1v1]."""
    from mtpcheck.fixture.gguf_export import _reorder_v_heads

    heads = np.repeat(np.array([0, 1, 2, 3]), 2)  # 4 v heads of dim 2, grouped by 2 k heads
    assert _reorder_v_heads(heads, 0, 2, 2, 2).tolist() == [0, 0, 2, 2, 1, 1, 3, 3]
    w = np.arange(8 * 3).reshape(8, 3)
    assert _reorder_v_heads(w.T, 1, 2, 2, 2).tolist() == _reorder_v_heads(w, 0, 2, 2, 2).T.tolist()


def test_llama_rope_permutation_pairs_the_halves():
    from mtpcheck.fixture.gguf_export import _permute_rope

    w = np.arange(8)[:, None]  # one head of dim 8: rows [x0..x3 | y0..y3] -> [x0 y0 x1 y1 ...]
    assert _permute_rope(w, 1)[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_conversion_refuses_an_unknown_architecture(tmp_path):
    from mtpcheck.fixture.gguf_export import convert

    (tmp_path / "config.json").write_text('{"model_type": "gpt_neox"}')
    with pytest.raises(ValueError, match="no GGUF conversion for model_type 'gpt_neox'"):
        convert(tmp_path, tmp_path / "x.gguf")


# -- adapter pieces (no binary needed) ---------------------------------------------


def test_sampling_maps_every_field_in_the_contracts_order():
    from mtpcheck.backends.llama_server import sampling_body

    sp = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, repetition_penalty=1.3,
                        presence_penalty=0.5, frequency_penalty=0.25, logit_bias={7: -2.0, 3: 1.5}, seed=4)
    body = sampling_body(sp)
    assert body["samplers"] == ["penalties", "temperature", "top_k", "top_p", "min_p"]
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (0.7, 5, 0.9, 0.1)
    assert (body["repeat_penalty"], body["presence_penalty"], body["frequency_penalty"]) == (1.3, 0.5, 0.25)
    assert body["repeat_last_n"] == 2048 and body["logit_bias"] == [[3, 1.5], [7, -2.0]]
    mapped = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty", "logit_bias", "seed"}
    assert set(SamplingParams.model_fields) <= mapped, "a new contract field must be mapped or refused"


def _chunk(n, tok, d=None, a=None):
    t = {} if d is None else {"draft_n": d, "draft_n_accepted": a}
    return {"tokens_predicted": n, "tokens": [tok] if tok is not None else [], "timings": t}


def test_rounds_come_from_counter_changes_and_skipped_tokens_are_tolerated():
    from mtpcheck.backends.llama_server import rounds_from_stream, trim_to

    tokens = [5, 6, 7, 8, 9, 10]
    # prefill token; round 1 drafts 3 accepts 2 (tokens 6,7,8; 7 skipped by the stream); round 2 drafts 3 accepts 1
    chunks = [_chunk(1, 5), _chunk(2, 6, 3, 2), _chunk(4, 8, 3, 2), _chunk(5, 9, 6, 3), _chunk(6, 10, 6, 3)]
    rounds, timings = rounds_from_stream(chunks, tokens)
    assert [(r.drafted, r.accepted) for r in rounds] == [(3, 2), (3, 1)]
    assert timings == {"draft_n": 6, "draft_n_accepted": 3}
    # the last token of the budget is decoded without a draft: a surplus token, a round of 0 proposals
    rounds7, _ = rounds_from_stream([*chunks, _chunk(7, 11, 6, 3)], [*tokens, 11])
    assert [(r.drafted, r.accepted) for r in rounds7] == [(3, 2), (3, 1), (0, 0)]
    trim_to(rounds, 4)  # a stop after 4 tokens of the segment's rounds
    assert [(r.drafted, r.accepted) for r in rounds] == [(3, 2), (3, 0)]


def test_a_stream_that_disagrees_with_the_plain_response_is_refused():
    from mtpcheck.backends.httpserver import ServerError
    from mtpcheck.backends.llama_server import rounds_from_stream

    with pytest.raises(ServerError, match="differs from the plain response"):
        rounds_from_stream([_chunk(1, 5), _chunk(2, 99, 3, 2)], [5, 6, 7])


def test_missing_binary_is_one_named_error(tmp_path):
    from mtpcheck.backends.llama_server import LlamaServerUnavailable, find_binary

    with pytest.raises(LlamaServerUnavailable, match="not an executable file"):
        find_binary(tmp_path / "nope")


# -- against a real llama-server ---------------------------------------------------


@pytest.fixture(scope="module")
def plain_draft():
    from mtpcheck.backends.llama_server import load_llama_server

    b = load_llama_server(config="draft", speculation="off")
    yield b
    b.close()


@pytest.fixture(scope="module")
def plain_mtp():
    from mtpcheck.backends.llama_server import load_llama_server

    b = load_llama_server(config="mtp", speculation="off")
    yield b
    b.close()


def _prompts(backend, n=4):
    from mtpcheck.fixture import fixture_prompts

    return list(fixture_prompts(backend).values())[:n]


def _agreement(mlx_backend, llama_backend, n_tokens=24):
    """(greedy mismatches not excused by a near tie, max top-5 probability difference)."""
    bad, worst = [], 0.0
    for prompt in _prompts(llama_backend):
        req = GenerationRequest(prompt_tokens=prompt, max_tokens=n_tokens, stop_token_ids=[],
                                sampling=SamplingParams(temperature=0.0), speculation={"mode": "off"})
        ours, theirs = mlx_backend.generate(req).tokens, llama_backend.generate(req).tokens
        laws_m = mlx_backend.target_distributions(prompt, ours, SamplingParams(temperature=1.0))
        laws_l = llama_backend.target_distributions(prompt, ours, SamplingParams(temperature=1.0))
        for i in range(len(ours)):
            top = np.argsort(-laws_m[i], kind="stable")[:5]
            worst = max(worst, float(np.abs(laws_m[i][top] - laws_l[i][top]).max()))
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if a != b:
                p = np.sort(laws_m[i])[::-1]
                if np.log(p[0] / p[1]) >= NEAR_TIE:
                    bad.append((prompt[:4], i, a, b, float(np.log(p[0] / p[1]))))
                break  # the histories differ from here on
    return bad, worst


@needs_server
@pytest.mark.skipif(not HAVE_LM, reason="mlx-lm is not installed (pip install 'mtpcheck[mlx-lm]')")
def test_llama_gguf_decodes_like_mlx_lm(plain_draft):
    from mtpcheck.backends.mlx_lm import load_mlx_lm

    bad, worst = _agreement(load_mlx_lm(speculation="off"), plain_draft)
    assert not bad, f"greedy divergences beyond a near tie: {bad}"
    assert worst < PROB_TOL, f"top-5 probabilities differ by up to {worst:.4f} (tolerance {PROB_TOL})"


@needs_server
@pytest.mark.skipif(not HAVE_VLM, reason="mlx-vlm is not installed (pip install 'mtpcheck[mlx-vlm]')")
def test_qwen35_gguf_decodes_like_mlx_vlm(plain_mtp):
    from mtpcheck.backends.mlx_vlm import load_mlx_vlm

    bad, worst = _agreement(load_mlx_vlm(checkpoint="native", speculation="off"), plain_mtp)
    assert not bad, f"greedy divergences beyond a near tie: {bad}"
    assert worst < PROB_TOL, f"top-5 probabilities differ by up to {worst:.4f} (tolerance {PROB_TOL})"


@needs_server
def test_servers_are_started_per_depth_and_stopped_by_pid():
    from mtpcheck.backends.llama_server import load_llama_server

    b = load_llama_server(config="draft")
    prompt = _prompts(b, 1)[0]
    for depth in (2, 3):
        res = b.generate(GenerationRequest(prompt_tokens=prompt, max_tokens=12, stop_token_ids=[],
                                           sampling=SamplingParams(temperature=0.0),
                                           speculation={"mode": "native_mtp", "num_draft_tokens": depth}))
        s = res.speculation
        assert s.used and s.num_draft_tokens == depth and s.rounds >= 1
        assert 1 + s.accepted + s.rounds >= len(res.tokens)
    pids = b.pids()
    assert len(pids) == 2
    b.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# -- process lifecycle, with a stand-in server (no llama-server needed) ----------------

FAKE_SERVER = r'''
import http.server, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
if "--crash" in sys.argv:
    print("model file not found", flush=True); sys.exit(3)
start = time.monotonic()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = time.monotonic() - start > 0.3  # "loading" first, as llama-server answers 503
        self.send_response(200 if ok else 503); self.end_headers(); self.wfile.write(b'{"status": "ok"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_binary(tmp_path):
    import sys

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    exe = tmp_path / "fake-llama-server"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_is_waited_on_through_health_and_stopped_by_pid(fake_binary):
    import gc

    from mtpcheck.backends.httpserver import Client, ServerProcess

    s = ServerProcess(fake_binary, ["-m", "x.gguf"], "fake").start()
    assert Client(s.url).get("/health")[0] == 200
    pid = s.pid
    s.stop()
    assert not _alive(pid)
    s2 = ServerProcess(fake_binary, [], "fake").start()  # garbage collection stops it too
    pid2 = s2.pid
    del s2
    gc.collect()
    assert not _alive(pid2)


def test_a_server_that_dies_while_starting_is_one_named_error_with_its_log(fake_binary):
    from mtpcheck.backends.httpserver import ServerError, ServerProcess

    with pytest.raises(ServerError, match="exited with 3 while starting: model file not found"):
        ServerProcess(fake_binary, ["--crash"], "fake").start()


# -- the adapters' plumbing against a stand-in server (tests/llama_server_standin.py) ---------


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    import sys
    from pathlib import Path

    exe = tmp_path_factory.mktemp("standin") / "llama-server"
    script = Path(__file__).with_name("llama_server_standin.py")
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    return exe


@pytest.fixture(scope="module")
def standin_backend(standin):
    from mtpcheck.backends.llama_server import load_llama_server

    b = load_llama_server(server=str(standin))
    yield b
    b.close()


def _spec_req(prompt, n=24, depth=3, **sp):
    return GenerationRequest(prompt_tokens=prompt, max_tokens=n, stop_token_ids=[],
                             sampling=SamplingParams(**{"temperature": 0.0, **sp}),
                             speculation={"mode": "native_mtp", "num_draft_tokens": depth})


def _with(req, **kw):
    return GenerationRequest.model_validate({**req.model_dump(), **kw})


def test_standin_reports_rounds_that_add_up(standin_backend):
    from mtpcheck.machinery.checks import stats_problems

    b = standin_backend
    for i, prompt in enumerate(_prompts(b)):
        for sp in ({}, {"temperature": 1.0, "seed": 10 + i}):
            req = _spec_req(prompt, **sp)
            res = b.generate(req)
            assert res.speculation.used and len(res.tokens) == 24
            assert not stats_problems(res, req, b.capabilities()), stats_problems(res, req, b.capabilities())
            off = b.generate(_with(req, speculation={"mode": "off"}))
            if not sp:
                assert off.tokens == res.tokens  # greedy: same law, same tokens


def test_standin_resumes_after_an_eos_the_request_does_not_stop_at(standin_backend):
    from mtpcheck.machinery.checks import stats_problems

    b = standin_backend
    found = 0
    for seed in range(40):
        req = _spec_req(_prompts(b, 1)[0], n=32, temperature=1.5, seed=seed)
        res = b.generate(req)
        assert len(res.tokens) == 32 and not stats_problems(res, req, b.capabilities())
        if 0 in res.tokens[:-1]:
            found += 1
            stopped = b.generate(_with(req, stop_token_ids=None))  # EOS stops: cut there
            assert stopped.tokens == res.tokens[: res.tokens.index(0) + 1] and stopped.finish_reason == "stop"
            if found == 2:
                break
    assert found, "no EOS in 40 seeded runs: the resume path was not exercised"


def test_standin_ground_truth_rows_are_laws(standin_backend):
    b = standin_backend
    prompt = _prompts(b, 1)[0]
    cont = b.generate(_spec_req(prompt, n=8)).tokens
    laws = b.target_distributions(prompt, cont, SamplingParams(temperature=0.8, top_k=8))
    assert laws.shape == (8, 512) and np.allclose(laws.sum(axis=1), 1.0)
    assert ((laws > 0).sum(axis=1) <= 8).all()
    hot = b.target_distributions(prompt, cont, SamplingParams(temperature=0.0))
    assert (hot.max(axis=1) == 1.0).all() and hot.argmax(axis=1).tolist() == cont  # greedy path = argmax


def test_standin_openai_http_gives_truncated_laws(standin):
    from mtpcheck.backends.openai_http import load_openai_http
    from mtpcheck.machinery.checks import stats_problems

    b = load_openai_http(launch="llama-server", server=str(standin), top_logprobs=5)
    try:
        caps = b.capabilities()
        assert caps.truncated_laws == 5
        prompt = _prompts(b.owner, 1)[0]
        req = _spec_req(prompt, n=16, temperature=1.0, seed=3)
        res = b.generate(req)
        assert res.speculation.used and not stats_problems(res, req, caps)
        laws = b.target_distributions(prompt, res.tokens, SamplingParams(temperature=1.0))
        assert ((laws > 0).sum(axis=1) <= 5).all() and (laws.sum(axis=1) <= 1 + 1e-6).all()
        pids = b.pids()
    finally:
        b.close()
    assert pids and not any(_alive(p) for p in pids)


@pytest.mark.parametrize("bad", ["x", "0", "-2", "1.5"])
def test_a_bad_slots_option_is_one_clear_error(bad):
    from mtpcheck.backends.httpserver import slots_option

    with pytest.raises(ValueError, match=r"slots=.*expected a whole number of parallel requests >= 1"):
        slots_option(bad)
    assert slots_option("4") == 4 and slots_option(1) == 1


def test_an_abandoned_stream_drops_its_connection_and_the_server_sees_the_client_go(standin_backend):
    """STREAM-DISCONNECT's client, through the adapter: closing the stream part-way closes the HTTP
    connection in the reading thread (drive_chunks closes its source), and the server's next write fails."""
    import json
    import time
    import urllib.request

    from mtpcheck.machinery.harness import Guarded

    b = standin_backend
    req = _spec_req(_prompts(b, 1)[0], n=200, temperature=1.0, seed=3)
    key = next(k for k in b.clients if k.startswith("spec"))

    def gone():
        with urllib.request.urlopen(b.clients[key].url + "/health", timeout=10) as r:
            return json.loads(r.read())["disconnects"]

    before = gone()
    chunks, ended = Guarded(b, timeout=60).abandon_stream(req, after=2)
    assert len(chunks) == 2 and not ended
    deadline = time.monotonic() + 10
    while gone() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone() == before + 1
    assert len(b.generate(_spec_req(_prompts(b, 1)[0], n=8)).tokens) == 8  # still serving


def test_a_choice_becomes_a_gbnf_grammar_with_escaped_literals():
    from mtpcheck.backends.httpserver import gbnf_choice

    assert gbnf_choice(["name", "city"]) == 'root ::= "name" | "city"'
    assert gbnf_choice(['a"b', "x\\y", "new\nline", "[z]", "é\x01"]) == \
        'root ::= "a\\"b" | "x\\\\y" | "new\\nline" | "[z]" | "é\\x01"'


def test_a_constrained_request_goes_out_with_its_grammar_and_other_stops_are_refused(standin_backend, monkeypatch):
    from mtpcheck.backends.httpserver import Client
    from mtpcheck.contracts import OutputConstraint

    b, sent = standin_backend, []
    post, stream = Client.post, Client.stream
    monkeypatch.setattr(Client, "post", lambda self, path, body: sent.append(body) or post(self, path, body))
    monkeypatch.setattr(Client, "stream", lambda self, path, body: sent.append(body) or stream(self, path, body))
    req = _with(_spec_req(_prompts(b, 1)[0], n=8), stop_token_ids=None,
                constraint=OutputConstraint(choice=["ab", "cd"]).model_dump())
    assert b.capabilities().request_constraints
    b.generate(req)
    list(b.generate_stream(req))
    assert sent and all(x.get("grammar") == 'root ::= "ab" | "cd"' for x in sent)
    with pytest.raises(ValueError, match="end-of-generation"):
        b.generate(_with(req, stop_token_ids=[7]))


def test_n_samples_come_back_in_order_and_are_what_the_server_makes_them(standin_backend):
    """generate_n: one request with llama.cpp's `n`, results by index (the stand-in, like build 11434,
    runs sample j under seed + j: S10, which SEED-SAMPLES-INDEPENDENT fails); n beyond the slots is refused."""
    b = standin_backend
    req = _spec_req(_prompts(b, 1)[0], n=12, temperature=1.0, seed=40)
    req = _with(req, stop_token_ids=None)  # stops at EOS: no resumed segment, so solo and sample compare
    assert b.capabilities().parallel_samples
    samples = b.generate_n(req, 3)
    solo = [b.generate(_with(req, sampling={**req.sampling.model_dump(), "seed": 40 + j})).tokens for j in range(3)]
    assert [s.tokens for s in samples] == solo and len({tuple(t) for t in solo}) == 3
    assert all(s.speculation.used and s.seed == 40 for s in samples)
    with pytest.raises(ValueError, match="parallel slots"):
        b.generate_n(req, b.slots + 1)


def test_the_ngram_configuration_drives_llama_cpps_own_lookup(standin):
    """config=ngram: --spec-type ngram-simple with m = the depth, drafter kind model_free, drafting up_to_k;
    probabilistic drafts are refused (a lookup proposes tokens, not a law)."""
    from mtpcheck.backends.llama_server import NGRAM_N, load_llama_server

    with pytest.raises(ValueError, match="draft_sampling=greedy only"):
        load_llama_server(config="ngram", draft_sampling="probabilistic", server=str(standin))
    b = load_llama_server(config="ngram", depth=4, server=str(standin))
    try:
        args = b._args(4)
        assert args[args.index("--spec-type") + 1] == "ngram-simple" and "--spec-draft-model" not in args
        assert args[args.index("--spec-ngram-simple-size-m") + 1] == "4"
        assert args[args.index("--spec-ngram-simple-size-n") + 1] == str(NGRAM_N)
        caps = b.capabilities()
        assert (caps.mtp_kinds, caps.drafting, caps.acceptance_rule) == (["model_free"], "up_to_k", "exact_match")
    finally:
        b.close()


def test_client_sends_a_request_twice_only_after_a_stale_keep_alive():
    """Client.request reconnects once where a kept-alive connection was closed
    by the server between requests; a request on a new connection that the
    server drops (a crash mid-request) raises, sent once."""
    import http.server
    import threading

    from mtpcheck.backends.httpserver import Client

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.path)
            if self.path == "/crash":
                self.close_connection = True  # no response: what a server dying mid-request sends
                return
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = self.path == "/close"  # answered, then the keep-alive closed

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        c = Client(url, timeout=10)
        assert c.post("/close", {}) == {"ok": True}
        assert c.post("/again", {}) == {"ok": True}  # the stale keep-alive: reconnected once
        assert seen == ["/close", "/again"]
        fresh = Client(url, timeout=10)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            fresh.request("POST", "/crash", {})
        assert seen.count("/crash") == 1
    finally:
        server.shutdown()
