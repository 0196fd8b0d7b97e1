"""docs/downstream.md's worked example runs as written: its python block is
extracted and run with pytester against the toy backend, with the command
line the doc gives (the backend name aside)."""

import json
import re
import shlex
from pathlib import Path

pytest_plugins = ["pytester"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "downstream.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_worked_example_runs_as_written(pytester):
    code, command = blocks("python")[0], blocks("bash")[0].strip()
    path = code.splitlines()[0].removeprefix("# ").strip()  # the block names its file
    assert path == "tests/test_my_runtime.py"
    (pytester.path / "tests").mkdir()
    (pytester.path / path).write_text(code)
    args = shlex.split(command)
    assert args[:2] == ["pytest", path] and "--mtp-backend=mypkg.adapter:make_backend" in args
    args = [a.replace("mypkg.adapter:make_backend", "toy") for a in args[1:]]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = json.loads((pytester.path / "report.json").read_text())
    assert {c: r["outcome"] for c, r in report["clauses"].items()} == {"STATS-CONSISTENT": "passed", "DIST-EQUIV": "passed"}
    gtest = report["clauses"]["DIST-EQUIV"]["evidence"][0]["gtest"]
    assert {"alpha", "n", "p_value", "detectable_tv"} <= set(gtest)
    assert report["complete"]
