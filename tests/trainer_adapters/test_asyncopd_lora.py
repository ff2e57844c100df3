"""``adwin train --scheduler asyncopd`` with a LoRA student: the learner updates the adapters, the rollout
engines sample with them (synced as adapters only), and the checkpoint and the export are the sync trainer's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_asyncopd_cli import _config

from adwin.cli import main

pytestmark = pytest.mark.timeout(180)
peft = pytest.importorskip("peft")  # the lora extra


def test_asyncopd_trains_a_lora_student_and_saves_and_exports_its_adapter(tmp_path: Path, monkeypatch) -> None:
    from adwin.trainer_adapters.asyncopd import engine

    synced: list[list[str]] = []
    real = engine.load_trained_state

    def spy(model: torch.nn.Module, state: dict) -> None:
        synced.append(sorted(state))
        real(model, state)

    monkeypatch.setattr(engine, "load_trained_state", spy)
    cfg = _config(tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data["model"]["lora"] = {"r": 4, "alpha": 8}
    cfg.write_text(yaml.safe_dump(data))
    rc = main(["train", "--config", str(cfg), "--scheduler", "asyncopd", "--steps", "3", "--seed", "1",
               "--name", "lora"])
    assert rc == 0
    run = tmp_path / "runs" / "lora"
    ck = run / "checkpoint-3"
    assert (ck / "adapter_model.safetensors").is_file() and not (ck / "model.safetensors").exists()
    assert (run / "export" / "merged" / "model.safetensors").is_file()
    assert synced and all(names and all("lora_" in n for n in names) for names in synced)
    adapter = load_file(str(ck / "adapter_model.safetensors"))
    assert any(float(v.abs().max()) > 0 for k, v in adapter.items() if "lora_B" in k)  # the learner moved B
