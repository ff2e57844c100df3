"""Wrong flags, paths and inputs on the command line: one error line, a non-zero exit, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from trainer_fixtures import tiny_overrides

from adwin.cli import main


def _errors(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [x for x in err.splitlines() if x.startswith("adwin")]


def test_unknown_flag_through_the_real_entry_point_is_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "adwin.cli", "train", "--bogus"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["adwin: error: unrecognized arguments: --bogus (see adwin --help)"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["nope"], "invalid choice: 'nope'"),
    (["train", "--steps", "abc"], "--steps: invalid int value: 'abc'"),
    (["train", "--wandb", "maybe"], "--wandb: invalid choice"),
    (["controller", "serve", "--port", "x"], "--port: invalid int value"),
])
def test_usage_mistakes_exit_2_with_one_line(argv: list[str], needle: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    lines = _errors(capsys.readouterr().err)
    assert len(lines) == 1 and needle in lines[0] and "--help" in lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_paths_and_inputs_exit_non_zero_with_one_line(tmp_path: Path, capsys) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("steps: [1, 2\n")
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    good = tmp_path / "tiny.yaml"
    ov = tiny_overrides(tmp_path)
    nested: dict = {}
    for dotted, v in ov.items():
        node = nested
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    good.write_text(yaml.safe_dump(nested))
    cases = [
        (["train", "--config", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (["train", "--config", str(bad_yaml)], "bad.yaml"),
        (["train", "--config", str(listy)], "must be a mapping"),
        (["train", "--config", str(good), "--set", "steps"], "KEY=VALUE"),
        (["train", "--config", str(good), "--set", "rollout.nope=1"], "rollout.nope"),
        (["train", "--config", str(good), "--set", f"data.path={tmp_path / 'gone.jsonl'}"], "gone.jsonl"),
        (["train", "--config", str(good), "--set", f"model.student={tmp_path / 'no-model'}"], "no-model"),
        (["train", "--config", str(good), "--set", "model.device=cuda:99"], "model.device: 'cuda:99'"),  # no GPU 99
        (["train", "--config", str(good), "--set", "model.device=gpu0"], "model.device: 'gpu0' is not a torch device"),
        (["train", "--resume", str(tmp_path)], "not a run folder"),
        (["train", "--config", str(good), "--controller-url", f"http://127.0.0.1:{_free_port()}"], "unavailable"),
    ]
    for argv, needle in cases:
        capsys.readouterr()
        code = main(argv)
        lines = _errors(capsys.readouterr().err)
        assert code == 2, (argv, code)
        assert len(lines) == 1 and needle in lines[0], (argv, lines)


def test_a_command_whose_module_is_missing_fails_loudly_instead_of_vanishing_from_help(monkeypatch) -> None:
    from adwin import cli

    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, (("ghost",), "adwin.ghost_command", "not there")])
    with pytest.raises(ModuleNotFoundError, match="adwin.ghost_command"):
        cli.build_parser()
