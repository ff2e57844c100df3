"""``adwin train`` with its teacher behind ``adwin teacher serve``, end to end through the command line: one server
serves two students at once, each gets its own answers; the built-in task trains against its served teacher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from teacher_servers import served
from trainer_fixtures import tiny_overrides, write_config

from adwin.cli import main
from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train

COMPARED = ("loss/", "window/current", "eval/")


def _rows(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k.startswith(COMPARED)} for x in lines]


def test_one_server_serves_two_students_at_once_each_its_own_answers(tmp_path: Path) -> None:
    ov = tiny_overrides(tmp_path, **{"rollout.seeding": "per_sample", "probes.backend": "inline"})
    local_teacher = ov["model.teachers"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "ADWIN_TEACHER_TOKEN": ""}
    with served(local_teacher["default"], "--max-wait-ms", "20") as url:  # type: ignore[index]
        cfg = write_config(tmp_path / "served.yaml", ov | {"model.teacher_backend": "server",
                                                           "model.teachers": {"default": url}})
        procs = {seed: subprocess.Popen(
            [sys.executable, "-m", "adwin.cli", "train", "--config", str(cfg), "--seed", str(seed), "--name",
             f"student-{seed}", "--steps", "2", "--no-progress"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE) for seed in (1, 2)}
        errors = {seed: p.communicate(timeout=300)[1].decode(errors="replace")[-2000:] for seed, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), errors
    for seed in (1, 2):  # the same seed with the teacher in process
        ref = train(load_config(None, ov | {"seed": seed, "steps": 2, "name": f"local-{seed}"}), Controller())
        got = _rows(tmp_path / "runs" / f"student-{seed}")
        want = [{k: v for k, v in row.items() if k.startswith(COMPARED)} for row in ref.history]
        assert len(got) == len(want) == 2
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys() and g == pytest.approx(w, abs=1e-6)
    assert _rows(tmp_path / "runs" / "student-1") != _rows(tmp_path / "runs" / "student-2")


@pytest.mark.slow
def test_the_builtin_task_trains_against_its_served_teacher(tmp_path: Path, monkeypatch, capsys) -> None:
    from adwin.tasks.assets import ensure_prepared

    home = tmp_path / "home"
    ensure_prepared(home, profile="tiny")
    monkeypatch.setenv("ADWIN_HOME", str(home))
    monkeypatch.delenv("ADWIN_TEACHER_TOKEN", raising=False)
    default = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
    with served("builtin", "--profile", "tiny") as url:
        rc = main(["train", "--config", str(default), "--profile", "tiny", "--steps", "2", "--no-serve",
                   "--no-progress", "--out", str(tmp_path / "out"), "--set", "eval.n_problems=4",
                   "--set", "rollout.prompts_per_step=2", "--set", "model.teacher_backend=server",
                   "--set", f"model.teachers.default={url}"])
    assert rc == 0
    summary = json.loads((tmp_path / "out" / "adwin-builtin" / "summary.json").read_text())
    assert summary["steps"] == 2
    resolved = json.loads((tmp_path / "out" / "adwin-builtin" / "config.json").read_text())
    assert resolved["model"]["teachers"] == {"default": url} and resolved["model"]["teacher_backend"] == "server"
