"""``adwin train --set model.lora.r=4`` on the built-in task (tiny profile): trains, checkpoints the adapter,
resumes with ``--resume --steps``, exports; and the load-time errors of a LoRA config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import tiny_overrides, write_config

from adwin.cli import main

DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def test_builtin_task_trains_a_lora_student_resumes_it_and_exports_it(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("peft")
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    rc = main(["train", "--config", str(DEFAULT), "--profile", "tiny", "--steps", "2", "--no-serve", "--no-progress",
               "--out", str(out), "--name", "lora", "--set", "model.lora.r=4", "--set", "eval.n_problems=4",
               "--set", "rollout.prompts_per_step=2", "--set", "checkpoint_every=1"])
    assert rc == 0
    run = out / "lora"
    assert json.loads((run / "config.json").read_text())["model"]["lora"]["r"] == 4
    ck = run / "checkpoint-2"
    assert (ck / "adapter_model.safetensors").is_file() and not (ck / "model.safetensors").exists()
    assert main(["train", "--resume", str(run), "--profile", "tiny", "--steps", "3", "--no-serve", "--no-progress"]) == 0
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert (run / "checkpoint-3" / "adapter_model.safetensors").is_file()
    assert (run / "export" / "merged" / "model.safetensors").is_file()
    assert (run / "export" / "adapter" / "adapter_model.safetensors").is_file()


def test_lora_targets_that_match_nothing_fail_before_training_naming_the_field(tmp_path: Path, capsys) -> None:
    pytest.importorskip("peft")
    path = write_config(tmp_path / "run.yaml", tiny_overrides(tmp_path, **{"model.lora.target_modules": ["c_attn"]}))
    assert main(["train", "--config", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "model.lora.target_modules: ['c_attn'] match no module" in err and "q_proj" in err
    assert not (tmp_path / "runs" / "adwin-builtin" / "metrics.jsonl").exists()


def test_a_lora_config_without_peft_installed_is_refused_naming_the_field(tmp_path: Path, capsys, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)
    path = write_config(tmp_path / "run.yaml", tiny_overrides(tmp_path, **{"model.lora.r": 4}))
    assert main(["train", "--config", str(path), "--no-progress"]) == 2
    assert "model.lora: LoRA students need peft" in capsys.readouterr().err
