"""Data-parallel training: `adwin train --nproc 2` (2 gloo ranks on CPU, inline probes, per-sample seeding)
matches the 1-process run with the same global batch, and what N ranks cannot do is refused up front."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from ddp_runs import child_env, ddp_config
from safetensors.torch import load_file

from adwin.cli import main as cli_main
from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.distributed import LocalDist, init_distributed
from adwin.loop.sharding import check_data_parallel
from adwin.loop.trainer import train


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ddp")
    cfg_path = ddp_config(tmp)
    env = child_env()
    two = subprocess.run([sys.executable, "-m", "adwin", "train", "--nproc", "2", "--config", str(cfg_path),
                          "--name", "two"], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one = train(load_config(cfg_path, {"name": "one"}), Controller())
    rows = [json.loads(x) for x in (tmp / "runs" / "two" / "metrics.jsonl").read_text().splitlines()]
    return {"one": one, "two": rows, "two_weights": load_file(str(tmp / "runs" / "two" / "checkpoint-3" /
                                                                     "model.safetensors")), "stdout": two.stdout}


def test_two_ranks_match_one_process_after_three_steps(runs: dict) -> None:
    one, two = runs["one"], runs["two"]
    assert [r["step"] for r in two] == [0, 1, 2]  # rank 0 alone logs
    assert [h["window/current"] for h in one.history] == [r["window/current"] for r in two]
    audits = [h for h in one.history if "audit/id" in h]
    assert len(audits) >= 2 and sum(h.get("probe/tokens", 0.0) for h in one.history) > 0  # probes were extended
    for h, r in zip(one.history, two, strict=True):
        assert ("audit/id" in h) == ("audit/id" in r)
        for key in (k for k in h if k.startswith(("audit/micro_cos_", "audit/macro_cos_"))):
            assert r[key] == pytest.approx(h[key], abs=1e-4), key
        for key in ("rollout/sync_tokens", "probe/tokens", "probe/accepted"):
            assert r[key] == h[key], key
        assert r["loss/total"] == pytest.approx(h["loss/total"], rel=1e-4, abs=1e-6)
    for key in ("eval/accuracy", "eval/teacher_kl", "eval/mean_len"):
        assert two[-1][key] == pytest.approx(one.history[-1][key], rel=1e-5, abs=1e-7), key
    weights = runs["two_weights"]
    state = {k: v for k, v in one_student_state(one).items() if k in weights}
    num = sum(float((state[k] - weights[k]).norm() ** 2) for k in state) ** 0.5
    den = sum(float(state[k].norm() ** 2) for k in state) ** 0.5
    assert num / den <= 1e-5
    assert "run folder" in runs["stdout"]  # rank 0's summary, printed once
    assert runs["stdout"].count("run folder") == 1


def one_student_state(one) -> dict[str, torch.Tensor]:
    return load_file(str(one.run_dir / "checkpoint-3" / "model.safetensors"))


@pytest.mark.parametrize("override,field", [
    ({"rollout.prompts_per_step": 3}, "rollout.prompts_per_step"),
    ({"probes.backend": "thread"}, "probes.backend"),
    ({"probes.batch_size": 1}, "probes.batch_size"),
    ({"rollout.backend": "vllm"}, "rollout.backend"),
])
def test_what_two_ranks_cannot_do_is_refused_naming_the_field(override: dict, field: str) -> None:
    cfg = load_config(None, {"probes.backend": "inline", **override})
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        check_data_parallel(cfg, 2)
    check_data_parallel(cfg, 1)  # one process: nothing to refuse


def test_nproc_refuses_before_launching_anything(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["train", "--nproc", "2", "--set", "rollout.prompts_per_step=3", "--no-serve"])
    assert code == 2
    assert "rollout.prompts_per_step=3 must be divisible by the world size 2" in capsys.readouterr().err


def test_one_process_is_a_world_of_one_and_other_devices_are_refused() -> None:
    dist, device = init_distributed("cpu", env={})
    assert isinstance(dist, LocalDist) and (dist.rank, dist.world, device) == (0, 1, "cpu")
    assert [LocalDist(rank=r, world=3).shard(8) for r in range(3)] == [slice(0, 3), slice(3, 6), slice(6, 8)]
    with pytest.raises(ValueError, match="model.device"):
        init_distributed("cuda:1", env={"WORLD_SIZE": "2", "RANK": "0"})
