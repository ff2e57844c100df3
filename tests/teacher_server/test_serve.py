"""``adwin teacher serve``: startup prints the URL and the model, binds loopback unless a token is set, and
serves the checkpoint it names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from teacher_servers import stop
from trainer_fixtures import save_tiny

from adwin.cli import build_parser, main


def test_startup_prints_the_url_and_the_model_and_serves_it(tmp_path: Path) -> None:
    model = save_tiny(tmp_path / "teacher", seed=10)
    env = {k: v for k, v in os.environ.items() if k != "ADWIN_TEACHER_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "adwin.cli", "teacher", "serve", "--model", str(model), "--port",
                             "0", "--served-model-name", "tiny", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("adwin teacher serve: http://127.0.0.1:") and "model 'tiny'" in line, line
        assert str(model) in line and "vocab 64" in line
        url = line.split()[3]
        for _ in range(200):  # the socket is bound before the line: uvicorn starts serving right after
            try:
                r = httpx.get(f"{url}/models", timeout=1.0)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert r.json()["data"][0]["id"] == "tiny"
    finally:
        stop(proc)


def test_binding_beyond_loopback_needs_a_token(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("ADWIN_TEACHER_TOKEN", raising=False)
    assert main(["teacher", "serve", "--model", str(tmp_path / "none"), "--host", "0.0.0.0"]) == 2
    assert "ADWIN_TEACHER_TOKEN" in capsys.readouterr().err


def test_a_missing_checkpoint_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["teacher", "serve", "--model", str(tmp_path / "none"), "--port", "0"]) == 2
    assert "none" in capsys.readouterr().err


def test_help_lists_the_batching_and_auth_flags(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["teacher", "serve", "--help"])
    text = capsys.readouterr().out
    for flag in ("--model", "--token", "--max-batch-rows", "--max-wait-ms", "--max-logprobs", "--host"):
        assert flag in text
