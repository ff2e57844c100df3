"""``adwin train`` end to end through the CLI on tiny checkpoints (2-3 steps per window policy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import tiny_overrides, write_config

from adwin.cli import build_parser, main
from adwin.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def _config_file(tmp: Path, **extra: object) -> Path:
    return write_config(tmp / "tiny.yaml", tiny_overrides(tmp, **extra))


@pytest.mark.parametrize("policy", ["adwin", "full", "fixed:4", "linear:4:4"])
def test_train_command_runs_every_window_policy_to_a_summary(tmp_path: Path, policy: str, capsys) -> None:
    cfg = _config_file(tmp_path)
    name = policy.replace(":", "-")
    rc = main(["train", "--config", str(cfg), "--window-policy", policy, "--steps", "2", "--seed", "3",
               "--name", name, "--out", str(tmp_path / "out")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "full-rollout run" in out
    run_dir = tmp_path / "out" / name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and len(summary["windows"]) == 2
    assert summary["full_equiv_tokens"] >= summary["sync_tokens"] > 0
    resolved = json.loads((run_dir / "config.json").read_text())
    assert resolved["window"]["policy"] == policy.split(":")[0] and resolved["seed"] == 3
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


def test_bad_config_fails_before_compute_naming_the_field(tmp_path: Path, capsys) -> None:
    cfg = _config_file(tmp_path)
    assert main(["train", "--config", str(cfg), "--threshold", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "window.threshold" in err and "1.5" in err
    assert not (tmp_path / "runs").exists()
    assert main(["train", "--config", str(cfg), "--window-policy", "fixed:lots"]) == 2
    assert "fixed:W" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  temprature: 0.5\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "rollout.temprature" in capsys.readouterr().err


def test_help_explains_every_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = capsys.readouterr().out
    for flag in ("--config", "--window-policy", "--threshold", "--steps", "--seed", "--out",
                 "--controller-url", "--wandb"):
        assert flag in text


def test_wandb_offline_logs_without_network(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = _config_file(tmp_path, steps=1, **{"eval.every": 0})
    assert main(["train", "--config", str(cfg), "--wandb", "offline", "--name", "wb"]) == 0
    offline_runs = list((tmp_path / "runs" / "wb").rglob("offline-run-*"))
    assert offline_runs, "wandb offline must write its run under the run folder"


def test_serves_embedded_controller_and_prints_url(tmp_path: Path, capsys) -> None:
    cfg = _config_file(tmp_path, steps=1, **{"eval.every": 0, "controller.serve": True, "controller.port": 0})
    assert main(["train", "--config", str(cfg), "--name", "served"]) == 0
    assert "http://127.0.0.1:" in capsys.readouterr().out


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_presets_validate_and_start_with_their_command(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# adwin train")
    if path.name != "default.yaml":
        assert f"--config configs/{path.name}" in first
    load_config(path)


def test_paper_preset_shards_the_student_over_8_processes_with_inline_probes_and_sketch_audits() -> None:
    from adwin.loop.sharding import check_data_parallel

    path = next(p for p in CONFIGS if p.name == "qwen3-4b-math.yaml")
    first = path.read_text().splitlines()[0]
    assert "--nproc 8" in first and "torchrun --nproc_per_node 8 -m adwin train" in first
    cfg = load_config(path, world=8)
    check_data_parallel(cfg, 8)  # what its header command launches is accepted
    assert (cfg.model.sharding, cfg.model.dtype, cfg.model.autocast) == ("fsdp", "float32", "bf16")
    assert (cfg.rollout.backend, cfg.probes.backend, cfg.audit.method) == ("hf", "inline", "sketch")
    assert (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt, cfg.rollout.max_response_len) == (128, 8, 8192)


def test_builtin_task_trains_with_the_tiny_profile(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    default = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
    rc = main(["train", "--config", str(default), "--profile", "tiny", "--steps", "2", "--no-serve", "--no-progress",
               "--out", str(tmp_path / "out"), "--set", "eval.n_problems=4", "--set", "rollout.prompts_per_step=2"])
    assert rc == 0
    summary = json.loads((tmp_path / "out" / "adwin-builtin" / "summary.json").read_text())
    assert summary["steps"] == 2 and 0.0 <= summary["accuracy_final"] <= 1.0
    resolved = json.loads((tmp_path / "out" / "adwin-builtin" / "config.json").read_text())
    assert resolved["model"]["student"] == "builtin" and resolved["data"]["task"] == "builtin"


def test_remote_controller_drives_the_run(tmp_path: Path) -> None:
    from adwin.controller import Controller, serve_in_thread

    service = Controller()
    url, stop = serve_in_thread(service, port=0)
    try:
        cfg = _config_file(tmp_path, steps=3)
        assert main(["train", "--config", str(cfg), "--controller-url", url, "--name", "remote"]) == 0
    finally:
        stop()
    (run,) = service.list_runs()
    tel = service.telemetry(run.run_id)
    assert len(tel.steps) == 3 and tel.audits  # steps and audits reached the service over HTTP
