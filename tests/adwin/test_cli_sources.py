"""``adwin train`` reads the same config from any working folder, says which, and ``--nproc 2`` runs as typed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ddp_runs import child_env

from adwin.cli import main
from adwin.config import preset_path
from adwin.train import CONFIG_SOURCE_FILE

ROOT = Path(__file__).resolve().parents[2]
# the tiny profile on the default preset, small enough for the suite
SMALL = ["--profile", "tiny", "--no-serve", "--no-progress", "--set", "eval.n_problems=4"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from adwin.tasks.assets import ensure_prepared

    home = tmp_path_factory.mktemp("home")
    ensure_prepared(home, profile="tiny")
    return home


def test_the_same_command_in_the_repository_and_elsewhere_trains_the_same_config(
        home: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(home))
    configs = []
    for i, cwd in enumerate([ROOT, tmp_path]):
        monkeypatch.chdir(cwd)
        out = tmp_path / f"out-{i}"
        assert main(["train", "--steps", "1", *SMALL, "--set", "rollout.prompts_per_step=2", "--out", str(out)]) == 0
        run_dir = out / "adwin-builtin"
        configs.append(json.loads((run_dir / "config.json").read_text()))
        source = (run_dir / CONFIG_SOURCE_FILE).read_text()
        assert "'default'" in source and str(preset_path("default")) in source
    for c in configs:
        c.pop("out_dir")
        c.pop("name")
    assert configs[0] == configs[1]
    assert configs[0]["probes"]["offer_finished"] == "always"  # the preset's, not the pydantic default


def test_two_processes_run_as_typed_with_inline_probes_chosen_and_said(home: Path, tmp_path: Path) -> None:
    env = child_env(ADWIN_HOME=str(home))
    done = subprocess.run([sys.executable, "-m", "adwin", "train", "--nproc", "2", "--steps", "2", *SMALL,
                           "--out", str(tmp_path / "runs")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("probes.backend: inline (none named") == 1  # said once, not again by each rank
    run_dir = tmp_path / "runs" / "adwin-builtin"
    assert json.loads((run_dir / "config.json").read_text())["probes"]["backend"] == "inline"
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1]


def test_an_unknown_preset_stops_the_command_before_compute_listing_the_presets(tmp_path: Path, monkeypatch,
                                                                                capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "no-such-preset", "--no-serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-such-preset" in err
    assert all(name in err for name in ("default", "fixed", "qwen3-4b-math"))
    assert not (tmp_path / "runs").exists()


def test_the_default_task_trains_sharded_on_two_processes_and_resumes(home: Path, tmp_path: Path) -> None:
    env = child_env(ADWIN_HOME=str(home))
    run_dir = tmp_path / "runs" / "adwin-builtin"
    for args in (["--steps", "2", *SMALL, "--set", "model.sharding=fsdp", "--out", str(tmp_path / "runs")],
                 ["--resume", str(run_dir), "--steps", "3", "--profile", "tiny", "--no-progress"]):  # one step more
        done = subprocess.run([sys.executable, "-m", "adwin", "train", "--nproc", "2", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert (run_dir / "checkpoint-2" / "sharded").is_dir() and (run_dir / "checkpoint-3" / "sharded").is_dir()
    assert json.loads((run_dir / "summary.json").read_text())["student_dir"] == str(run_dir / "student")
    assert (run_dir / "student" / "model.safetensors").is_file()
