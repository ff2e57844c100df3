"""A LoRA student under `adwin train --nproc 2` (2 gloo ranks, inline probes, per-sample seeding): every rank
builds the same adapters, the gradient all-reduce carries the adapters, and the run's windows, audit cosines
and adapters equal the 1-process run's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ddp_runs import assert_same_decisions, child_env, ddp_config
from safetensors.torch import load_file

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train

peft = pytest.importorskip("peft")  # the lora extra

ADAPTER = Path("checkpoint-3") / "adapter_model.safetensors"


def test_two_ranks_of_a_lora_student_match_one_process(tmp_path: Path) -> None:
    cfg_path = ddp_config(tmp_path, **{"model.lora.r": 4, "model.lora.alpha": 8, "optim.lr": 1e-2})
    launch = [sys.executable, "-m", "adwin", "train", "--nproc", "2", "--config", str(cfg_path), "--name", "two"]
    done = subprocess.run(launch, cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one = train(load_config(cfg_path, {"name": "one"}), Controller())
    two = [json.loads(x) for x in (tmp_path / "runs" / "two" / "metrics.jsonl").read_text().splitlines()]
    assert_same_decisions(one.history, two, cos_abs=1e-4)
    a, b = load_file(str(one.run_dir / ADAPTER)), load_file(str(tmp_path / "runs" / "two" / ADAPTER))
    assert a.keys() == b.keys() and all("lora_" in k for k in a)
    num = sum(float((a[k] - b[k]).norm() ** 2) for k in a) ** 0.5
    assert num / sum(float(a[k].norm() ** 2) for k in a) ** 0.5 <= 1e-5
