"""A stand-in for llama-server, for the adapter's plumbing when no binary is
installed: the request and response fields the adapters use, as
tools/server of llama.cpp build 11434 has them (server-schema.cpp,
server-task.cpp, server-context.cpp), over a toy model: a random bigram law
over the GGUF's vocabulary. What it cannot show is llama.cpp's own
behaviour; the real server runs in the tests and suite runs when installed.

Kept faithful where the adapter depends on it: the sampler chain (logit bias,
then `samplers` in order, then a seeded draw), post-sampling probabilities,
greedy drafts verified by exact match with running `draft_n` /
`draft_n_accepted`, at most `n_remaining - 1` proposals, a stop at EOS with
the EOS token in `tokens`, streamed chunks that skip a token whose text would
end inside a UTF-8 character (here: ids 300-309) and no `tokens` in the
final streamed chunk."""

from __future__ import annotations

import http.server
import json
import sys
import time

import numpy as np

V, EOS = 512, 0
PARTIAL = set(range(300, 310))
W = np.random.default_rng(0).normal(0.0, 2.0, (V, V))
W[:, EOS] -= 2.0
DRAFT = W + np.random.default_rng(1).normal(0.0, 1.0, (V, V))


def chain(logits, body, history):
    x = np.array(logits, dtype=np.float64)
    for tok, bias in body.get("logit_bias") or []:
        x[int(tok)] += float(bias)
    for name in body.get("samplers", ["penalties", "top_k", "top_p", "min_p", "temperature"]):
        if name == "penalties" and history:
            ids, counts = np.unique(np.array(history), return_counts=True)
            r = float(body.get("repeat_penalty", 1.0))
            x[ids] = np.where(x[ids] > 0, x[ids] / r, x[ids] * r)
            x[ids] -= counts * float(body.get("frequency_penalty", 0.0)) + float(body.get("presence_penalty", 0.0))
        elif name == "temperature":
            t = float(body.get("temperature", 0.8))
            if t <= 0:
                keep = int(np.argmax(x))
                x = np.where(np.arange(V) == keep, x, -np.inf)
            else:
                x = x / t
        elif name == "top_k" and int(body.get("top_k", 40)) > 0:
            k = int(body["top_k"])
            order = np.argsort(-x, kind="stable")
            x[order[k:]] = -np.inf
        elif name in ("top_p", "min_p"):
            p = np.exp(x - x.max())
            p /= p.sum()
            if name == "top_p" and float(body.get("top_p", 0.95)) < 1.0:
                order = np.argsort(-p, kind="stable")
                keep = int(np.searchsorted(np.cumsum(p[order]), float(body["top_p"]) - 1e-12)) + 1
                x[order[keep:]] = -np.inf
            elif name == "min_p" and float(body.get("min_p", 0.05)) > 0:
                x = np.where(p >= float(body["min_p"]) * p.max(), x, -np.inf)
    p = np.exp(x - x.max())
    return p / p.sum()


class Slot:
    def __init__(self, body, depth):
        self.body, self.depth = body, depth
        self.rng = np.random.default_rng(int(body.get("seed", 0)))
        self.history = [int(t) for t in body["prompt"]]
        self.n_prompt = len(self.history)
        self.draft_n = self.draft_acc = 0

    def sample(self):
        p = chain(W[self.history[-1]], self.body, self.history)
        return int(np.searchsorted(np.cumsum(p), self.rng.random() * p.sum())), p

    def run(self):
        """Yields (token, probs-at-token, stopped_by_eos)."""
        n_predict = int(self.body.get("n_predict", self.body.get("max_tokens", 16)))
        out = 0
        while out < n_predict:
            remaining = n_predict - out
            k = min(self.depth, remaining - 1) if out else 0
            if k > 0:
                proposals, h = [], list(self.history)
                for _ in range(k):
                    proposals.append(int(np.argmax(DRAFT[h[-1]])))
                    h.append(proposals[-1])
                self.draft_n += k
                emitted = []
                for j in range(k + 1):
                    tok, p = self.sample()
                    emitted.append((tok, p))
                    self.history.append(tok)
                    if j == k or tok != proposals[j]:
                        break
                self.draft_acc += len(emitted) - 1
            else:
                tok, p = self.sample()
                self.history.append(tok)
                emitted = [(tok, p)]
            for tok, p in emitted:
                out += 1
                yield tok, p, tok == EOS
                if tok == EOS or out >= n_predict:
                    return


def probs_json(p, tok, n):
    order = [int(i) for i in np.argsort(-p, kind="stable") if p[i] > 0][:n]
    return [{"id": tok, "prob": float(p[tok]),
             "top_probs": [{"id": i, "token": f"t{i}", "prob": float(p[i])} for i in order]}]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    depth = 0
    disconnects = 0  # streams whose client went away before the end (GET /health reports them)

    def log_message(self, *a):
        pass

    def _send(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"status": "ok", "disconnects": Handler.disconnects})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        oai = self.path.startswith("/v1/")
        slot = Slot(body, self.depth)
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            n = 0
            for tok, _, _ in slot.run():
                n += 1
                if tok in PARTIAL:
                    continue  # the text ends inside a UTF-8 character: no chunk
                chunk = {"tokens": [tok], "tokens_predicted": n, "content": f"t{tok}"}
                if body.get("timings_per_token"):
                    t = {"predicted_n": n}
                    if slot.draft_n:
                        t.update(draft_n=slot.draft_n, draft_n_accepted=slot.draft_acc)
                    chunk["timings"] = t
                if oai:
                    chunk = {"choices": [{"text": chunk["content"], "finish_reason": None}],
                             "timings": chunk.get("timings"), "__verbose": chunk if body.get("verbose") else None}
                try:  # a few ms a token, as a server generates: a client that goes away is seen at a write
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(0.005)
                except (BrokenPipeError, ConnectionResetError):
                    Handler.disconnects += 1
                    self.close_connection = True
                    return
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        if not oai and int(body.get("n", 1)) > 1:  # llama.cpp's children: sample j runs under seed + j (S10)
            self._send([{**self._result({**body, "n": 1, "seed": int(body.get("seed", 0)) + j}, oai), "index": j}
                        for j in range(int(body["n"]))])
            return
        self._send(self._result(body, oai))

    def _result(self, body, oai):
        slot = Slot(body, self.depth)
        n_probs = int(body.get("n_probs", body.get("logprobs", 0)) or 0)
        toks, probs, eos = [], [], False
        for tok, p, at_eos in slot.run():
            toks.append(tok)
            probs.append((tok, p))
            eos = at_eos
        timings = {"prompt_ms": 1.0, "predicted_ms": 2.0 * len(toks), "predicted_n": len(toks)}
        if slot.draft_n:
            timings.update(draft_n=slot.draft_n, draft_n_accepted=slot.draft_acc)
        complete = [(t, p) for t, p in probs if t not in PARTIAL] if n_probs else []
        stop_type = "eos" if eos else "limit"
        if oai:
            res = {"choices": [{"text": "", "finish_reason": "stop" if eos else "length",
                                "logprobs": {"content": [x for t, p in complete for x in probs_json(p, t, n_probs)]}
                                if n_probs else None}],
                   "usage": {"completion_tokens": len(toks)}, "timings": timings}
            if body.get("verbose"):
                res["__verbose"] = {"tokens": toks, "stop_type": stop_type}
            return res
        res = {"tokens": toks, "stop_type": stop_type, "tokens_predicted": len(toks), "timings": timings}
        if n_probs:
            res["completion_probabilities"] = [x for t, p in complete for x in probs_json(p, t, n_probs)]
        return res


def main(argv):
    Handler.depth = int(argv[argv.index("--spec-draft-n-max") + 1]) if "--spec-draft-n-max" in argv else 0
    port = int(argv[argv.index("--port") + 1])
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv)
