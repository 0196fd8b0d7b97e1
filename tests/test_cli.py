import json

import pytest

from mtpcheck.cli import main


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--backend", "nosuch"], "unknown backend 'nosuch'; known:"),
    (["generate", "--prompt", "x", "--max-tokens", "-1"], "--max-tokens: '-1' must be >= 0"),
    (["generate", "--prompt", "x", "--max-tokens", "0"], "max_tokens: Input should be greater than or equal to 1"),
    (["generate", "--prompt", "x", "--temperature", "hot"], "'hot' is not a valid float"),
    (["generate", "--prompt", "x", "--speculation", "turbo"], "invalid choice: 'turbo'"),
    (["generate", "--prompt", "x", "--backend", "toy"], "backend 'toy' has no tokenizer"),
    (["run", "--backend", "nosuch"], "unknown backend 'nosuch'"),
    (["run", "--jobs", "0"], "--jobs: expected a positive integer or 'auto', got '0'"),
    (["run", "--jobs", "many"], "--jobs: expected a positive integer or 'auto', got 'many'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_arguments_give_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_run_jobs_become_xdist_workers_by_module(monkeypatch):
    import importlib.util

    from mtpcheck.cli import _xdist_args
    from mtpcheck.machinery.settings import SettingsError

    assert _xdist_args("1") == []
    assert _xdist_args("3") == ["-n", "3", "--dist", "loadscope"]
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert _xdist_args("auto") == ["-n", "2", "--dist", "loadscope"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xdist" else real(name, *a))
    with pytest.raises(SettingsError, match="needs pytest-xdist"):
        _xdist_args("2")
    assert _xdist_args("1") == []  # one worker needs nothing


def test_contracts_check_and_list(capsys):
    code, out, _ = run(capsys, "contracts", "check")
    assert code == 0 and "every one tested" in out
    code, out, _ = run(capsys, "contracts", "list")
    assert code == 0 and "DIST-EQUIV" in out


def test_contracts_check_fails_on_a_drifted_export(capsys, tmp_path):
    assert run(capsys, "contracts", "export", "--dir", str(tmp_path))[0] == 0
    assert run(capsys, "contracts", "check", "--dir", str(tmp_path))[0] == 0
    (tmp_path / "clauses.json").write_text("{}")
    code, out, _ = run(capsys, "contracts", "check", "--dir", str(tmp_path))
    assert code == 1 and "clauses.json: drifted" in out


def test_generate_on_the_fixture(capsys):
    code, out, err = run(capsys, "generate", "--prompt", "id,name,city\n1,", "--max-tokens", "24",
                         "--num-draft-tokens", "3", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert len(res["tokens"]) == 24 or res["finish_reason"] == "stop"
    assert res["speculation"]["used"] and res["speculation"]["num_draft_tokens"] == 3
    code, out, _ = run(capsys, "generate", "--prompt", "id,name", "--max-tokens", "8", "--speculation", "off")
    assert code == 0 and "speculation: not used (not_requested)" in out


def test_generate_require_acceleration_with_a_penalty_exits_2(capsys):
    code, _, err = run(capsys, "generate", "--prompt", "id,", "--repetition-penalty", "1.3", "--require-acceleration")
    assert code == 2 and "sampling_control_unsupported" in err


def test_the_command_line_does_not_import_syrupy_before_pytest():
    """`mtpcheck run` builds its parser (golden's subcommand among them) before
    pytest.main: a syrupy imported then drew a PytestAssertRewriteWarning in every
    main-job output."""
    import subprocess
    import sys

    code = "import sys, mtpcheck.cli as c; c.build_parser(); print('syrupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
