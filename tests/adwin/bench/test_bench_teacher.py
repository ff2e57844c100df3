"""``adwin bench teacher``: a smoke run on the tiny profile (local and served training, the server's throughput)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adwin.cli import main

pytestmark = pytest.mark.slow


def test_bench_teacher_times_local_and_served_training_and_the_servers_throughput(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    out = tmp_path / "teacher.json"
    assert main(["bench", "teacher", "--profile", "tiny", "--steps", "3", "--repeats", "1", "--clients", "1,3",
                 "--requests", "2", "--rows", "2", "--tokens", "16", "--out", str(tmp_path / "runs"),
                 "--json", str(out), "--set", "eval.n_problems=2", "--set", "rollout.prompts_per_step=2"]) == 0
    res = json.loads(out.read_text())
    train = res["train"]
    assert train["median"]["local"]["steps_per_s"] > 0 and train["median"]["served"]["steps_per_s"] > 0
    assert train["windows"]["local"] == train["windows"]["served"]  # the same run, the teacher elsewhere
    assert 0 < train["median"]["served"]["teacher_share"] < 1
    assert [r["clients"] for r in res["throughput"]] == [1, 3]
    assert all(r["tokens_per_s"] > 0 and r["rows_per_forward"] >= 2 for r in res["throughput"])


def test_bench_teacher_refuses_a_run_too_short_to_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "teacher", "--profile", "tiny", "--steps", "1"]) != 0
    assert "--steps must be at least 2" in capsys.readouterr().err
