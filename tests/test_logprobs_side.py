"""LOGPROBS names the side that deviates: the toy backend with its reported
logprobs zeroed on the speculative path only, or on both paths."""

import json
import os

import pytest

pytest_plugins = ["pytester"]

WRAP = '''
from mtpcheck.backends import load_backend


def make(where="speculative"):
    backend = load_backend("toy", {})
    one, many = backend.generate, backend.generate_batch

    def broken(req, res):
        plain = req.speculation is not None and req.speculation.mode == "off"
        if res.logprobs and (where == "both" or not plain):
            res = res.model_copy(update={"logprobs": [0.0] * len(res.logprobs)})
        return res

    backend.generate = lambda req: broken(req, one(req))
    backend.generate_batch = lambda reqs: [broken(q, r) for q, r in zip(reqs, many(reqs))]
    return backend
'''


@pytest.mark.parametrize("where", ["speculative", "both"])
def test_logprobs_failure_names_its_side(pytester, monkeypatch, where):
    pytester.makepyfile(zerolp=WRAP)
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    pytester.syspathinsert()
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", "mtpcheck.suite",
                                          "--mtp-backend=zerolp:make", f"--mtp-backend-option=where={where}",
                                          "--mtp-clauses=LOGPROBS", f"--mtp-json={report}")
    assert result.ret == 1
    (test,) = [t for n, t in json.loads(report.read_text())["tests"].items() if "logprobs" in n]
    assert test["outcome"] == "failed" and test["deviating_side"] == where
    result.stdout.fnmatch_lines([f"*{'speculative path deviates' if where == 'speculative' else 'both paths'}*"])
