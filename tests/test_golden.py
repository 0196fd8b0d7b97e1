"""Golden outputs (syrupy): every case of mtpcheck.machinery.golden.CASES for the
reference engine and for each real adapter that loads here, compared with
golden/<backend>/test_golden.ambr; plus the extension's own behaviour
(serializer, tolerance, token-level diff, unused entries failing the run).

Rewrite the goldens with ``mtpcheck golden update [--backend NAME]``.
Select backends with $MTPCHECK_GOLDEN_BACKENDS rather than with node ids:
the entries of a backend whose tests are skipped are left alone, while a
node-id selection makes syrupy count the other backends' entries as unused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpcheck.contracts import GenerationResult, SpeculationReport
from mtpcheck.fixture import PROMPTS
from mtpcheck.machinery import golden as G

pytest_plugins = ["pytester"]

ROOT = G.default_root()


@pytest.fixture(scope="module")
def golden_backends():
    loaded: dict[str, tuple] = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = G.load_golden_backend(name)
        return loaded[name]

    yield get
    loaded.clear()


def _golden_test(name: str):
    @pytest.mark.parametrize("case", G.CASES, ids=[c.id for c in G.CASES])
    def test(case, golden_backends, snapshot, request):
        selected = G.selected_backends()
        if selected is not None and name not in selected:
            pytest.skip(f"backend {name!r} not selected (${G.ENV_BACKENDS}={','.join(selected)})")
        backend, reason = golden_backends(name)
        if backend is None:
            pytest.skip(reason)
        stored = Path(ROOT) / name / "test_golden.ambr"
        if name not in G.REQUIRED_BACKENDS and not stored.exists() and not request.config.option.update_snapshots:
            pytest.skip(f"backend {name!r} loads but has no goldens yet: record them with "
                        f"`mtpcheck golden update --backend {name}`")
        record = G.run_case(name, backend, case, PROMPTS)
        assert record == snapshot.use_extension(G.golden_extension(name, ROOT))

    test.__name__ = test.__qualname__ = f"test_golden_{name.replace('-', '_')}"
    test.__doc__ = f"Golden outputs of backend {name!r}, one per case."
    return test


test_golden_mlx = _golden_test("mlx")
test_golden_mlx_lm = _golden_test("mlx-lm")
test_golden_mlx_vlm = _golden_test("mlx-vlm")


def test_cases_cover_the_grid():
    assert len(G.CASES) == 2 * 3 * 2 * 2
    assert {c.kind for c in G.CASES} == {"structured", "prose"}
    assert {c.sampling for c in G.CASES} == {"greedy", "t1", "topp0.9"}
    assert {c.seed for c in G.CASES} == {0, 1} and {c.depth for c in G.CASES} == {1, 3}
    assert len({c.id for c in G.CASES}) == len(G.CASES)
    req = G.GoldenCase("prose", "topp0.9", 1, 3).request([5, 6])
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.seed) == (1.0, 0.9, 1)
    assert req.speculation.num_draft_tokens == 3


# -- the extension, without a backend -----------------------------------------


def _result(tokens=(5, 6, 7, 8, 9, 10, 11, 12), logprobs=None, drafter="/abs/fixture/draft", t=(0.123, 0.456)):
    n = len(tokens)
    return GenerationResult(
        tokens=list(tokens), text="".join(chr(97 + x % 26) for x in tokens), finish_reason="length",
        logprobs=list(logprobs) if logprobs is not None else [-1.0 - i / 7 for i in range(n)],
        speculation=SpeculationReport(requested=True, used=True, mode="native_mtp", drafter=drafter,
                                      num_draft_tokens=3, runtime="fake", rounds=3, drafted=9, accepted=5,
                                      accept_lens=[3, 0, 2], draft_lens=[3, 3, 3], acceptance_rate=5 / 9,
                                      draft_time_s=t[0], verify_time_s=t[1]),
        seed=0,
    )


def _record(**kw):
    res = _result(**kw)
    return G.GoldenRecord(backend="fake", case={"prompt": "structured"}, prompt_tokens=[1, 2],
                          pieces=[chr(97 + x % 26) for x in res.tokens], result=res)


def test_serializer_keeps_declared_order_and_strips_run_dependent_fields():
    text = G.serialize(_record())
    doc = json.loads(text)
    assert list(doc) == ["backend", "case", "prompt_tokens", "pieces", "result"]
    assert list(doc["result"])[:4] == ["tokens", "text", "finish_reason", "logprobs"]
    spec = doc["result"]["speculation"]
    assert "draft_time_s" not in spec and "verify_time_s" not in spec
    assert "events" not in doc["result"] and "trace" not in doc["result"]
    assert spec["drafter"] == "<path>/draft"
    assert spec["accept_lens"] == [3, 0, 2]
    assert '"tokens": [5, 6, 7, 8, 9, 10, 11, 12]' in text  # scalars on one line
    # timings and a different checkout do not change the serialized form
    assert G.serialize(_record(t=(9.0, 8.0), drafter="/elsewhere/draft")) == text
    # a timings-only matcher keeps the events (empty here) but drops the timings
    only_timings = json.loads(G.serialize(_result(), matchers=(G.strip_timings,)))
    assert "events" in only_timings and "draft_time_s" not in only_timings["speculation"]


def test_comparator_tolerates_float_noise_but_not_token_changes():
    ext = G.golden_extension("fake", "/tmp/unused-golden-root")()
    golden = G.serialize(_record())
    lp = [-1.0 - i / 7 for i in range(8)]
    close = G.serialize(_record(logprobs=[x * (1 + 2e-5) for x in lp]))
    far = G.serialize(_record(logprobs=[x + (0.01 if i == 3 else 0.0) for i, x in enumerate(lp)]))
    assert ext.matches(serialized_data=close, snapshot_data=golden)
    assert not ext.matches(serialized_data=far, snapshot_data=golden)
    assert not ext.matches(serialized_data=G.serialize(_record(tokens=(5, 6, 7, 8, 9, 10, 11, 13))),
                           snapshot_data=golden)
    assert G.compare(1, 1.0) and G.compare([1, 2], [1, 2, 3])  # types and lengths exactly
    diff = "\n".join(ext.diff_lines(far, golden))
    assert "result.logprobs[3]" in diff and "outside" in diff


def test_diff_names_the_first_divergent_position():
    golden = G.serialize(_record())
    now = G.serialize(_record(tokens=(5, 6, 7, 8, 9, 99, 11, 12)))
    lines = G.token_diff(now, golden, name="test_golden_fake[x]")
    text = "\n".join(lines)
    assert "first divergent position 5" in text, text
    assert '>10 "k"<' in text and '>99 "v"<' in text  # the tokens at that position, with their text
    assert "text golden:" in text and "test_golden_fake[x]" in text
    shorter = "\n".join(G.token_diff(G.serialize(_record(tokens=(5, 6, 7))), golden))
    assert "first divergent position 3" in shorter and "<end>" in shorter
    rounds = G.serialize(_record()).replace('"accept_lens": [3, 0, 2]', '"accept_lens": [3, 1, 2]')
    assert "first divergent round 1" in "\n".join(G.token_diff(rounds, golden))


def test_extension_is_rooted_per_backend(tmp_path):
    ext = G.golden_extension("mlx-lm", tmp_path)
    assert ext is G.golden_extension("mlx-lm", tmp_path)
    assert ext.dirname(test_location=None) == str(tmp_path / "mlx-lm")
    assert ext.discovery_dirname(test_location=None) == str(tmp_path)


FAKE_TESTS = """
import os
import pytest
from mtpcheck.machinery import golden as G
from mtpcheck.contracts import GenerationResult, SpeculationReport

ROOT = os.environ["GOLDEN_ROOT"]
TOKENS = [int(x) for x in os.environ.get("FAKE_TOKENS", "1,2,3,4,5,6,7,8").split(",")]


@pytest.mark.parametrize("case", ["a", "b"])
def test_golden_fake(case, snapshot):
    res = GenerationResult(tokens=TOKENS, text=case, finish_reason="length",
                           speculation=SpeculationReport(requested=True, used=True, mode="native_mtp",
                                                         runtime="fake", draft_time_s=os.getpid() / 1e3))
    assert res == snapshot.use_extension(G.golden_extension("fake", ROOT))


def test_golden_other(snapshot):
    pytest.skip("backend 'other' did not load")
"""


# plugins the inner runs do not need (hypothesis's imports itself at every in-process run)
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark")


def test_syrupy_end_to_end_update_diff_and_unused(pytester, monkeypatch, tmp_path):
    """Update writes golden/<backend>/; timings do not matter; a changed token
    fails naming its position; an unused entry fails the run, except the
    entries of a skipped backend; update deletes the unused entry."""
    # subprocess runs: syrupy 7 keeps its session in a module global, so a second
    # in-process run in one interpreter reported no unused snapshot and passed; and
    # not as an xdist worker (syrupy reads PYTEST_XDIST_WORKER: under `-n 2` the inner
    # runs took themselves for workers and left unused-snapshot detection to a controller)
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "golden"
    monkeypatch.setenv("GOLDEN_ROOT", str(root))
    pytester.makepyfile(test_gold=FAKE_TESTS)
    other = root / "other" / "test_gold.ambr"  # entries of a backend whose tests are skipped
    other.parent.mkdir(parents=True)
    other.write_text("# serializer version: 1\n# name: test_golden_other\n  {}\n# ---\n")

    created = pytester.runpytest_subprocess(*QUIET, "--snapshot-update")
    assert created.ret == 0, created.stdout.str()
    stored = root / "fake" / "test_gold.ambr"
    assert "# name: test_golden_fake[a]" in stored.read_text()
    assert "draft_time_s" not in stored.read_text()

    again = pytester.runpytest_subprocess(*QUIET)
    assert again.ret == 0, again.stdout.str()  # other timings, same golden; 'other' left alone

    monkeypatch.setenv("FAKE_TOKENS", "1,2,3,4,5,9,7,8")
    changed = pytester.runpytest_subprocess(*QUIET)
    assert changed.ret == 1
    assert "first divergent position 5" in changed.stdout.str()
    monkeypatch.delenv("FAKE_TOKENS")

    text = stored.read_text()
    entry = text[text.index("# name: test_golden_fake[b]"):]
    stored.write_text(text + entry.replace("test_golden_fake[b]", "test_golden_fake[c]"))
    stale = pytester.runpytest_subprocess(*QUIET)
    assert stale.ret == 1, stale.stdout.str()
    assert "1 snapshot unused" in stale.stdout.str()

    cleaned = pytester.runpytest_subprocess(*QUIET, "--snapshot-update")
    assert cleaned.ret == 0
    assert "test_golden_fake[c]" not in stored.read_text()
    assert other.exists() and "test_golden_other" in other.read_text()


def test_cli_parser_and_missing_tests(tmp_path, monkeypatch, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    G.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["golden", "update", "--backend", "mlx", "--dir", str(tmp_path)])
    assert (args.action, args.backend, args.func) == ("update", "mlx", G.run)
    missing = parser.parse_args(["golden", "check", "--tests", str(tmp_path / "nope.py")])
    assert G.run(missing) == 2
    assert "not found" in capsys.readouterr().err


def test_golden_files_are_documents():
    """Every stored entry parses as a golden JSON document of its backend."""
    from syrupy.extensions.amber.serializer import AmberDataSerializer

    for path in sorted(Path(ROOT).glob("*/test_golden.ambr")):
        for snap in AmberDataSerializer.read_file(str(path)):
            doc = json.loads(snap.data)
            assert doc["backend"] == path.parent.name, (path, snap.name)
            assert snap.name.startswith(f"test_golden_{path.parent.name.replace('-', '_')}["), snap.name
            assert G.serialize(doc) == snap.data, (path, snap.name)
