"""Sharded students: `adwin train --nproc 2 --set model.sharding=fsdp` (FSDP2 over 2 gloo ranks, inline probes,
per-sample seeding) trains the 1-process run, writes sharded checkpoints and a transformers export of the
student, and resumes with the same or another number of ranks; what the precision fields map to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ddp_runs import assert_same_decisions, cut_copy, ddp_config, metrics_rows, two_ranks
from safetensors.torch import load_file

from adwin.cli import main as cli_main
from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train
from adwin.student.fsdp import precision_policy

STEPS, EVERY = 4, 2


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("fsdp")
    cfg = ddp_config(tmp, steps=STEPS, checkpoint_every=EVERY)
    two = two_ranks(tmp, "--config", str(cfg), "--name", "fsdp", "--set", "model.sharding=fsdp")
    one = train(load_config(cfg, {"name": "one"}), Controller())
    return {"tmp": tmp, "one": one, "stdout": two.stdout, "fsdp": tmp / "runs" / "fsdp"}


def test_a_sharded_run_trains_the_one_process_run(runs: dict) -> None:
    one, rows = runs["one"], metrics_rows(runs["fsdp"])
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert_same_decisions(one.history, rows, cos_abs=1e-5)
    for h, r in zip(one.history, rows, strict=True):
        assert r["loss/total"] == pytest.approx(h["loss/total"], rel=1e-4, abs=1e-6)
        assert r["optim/grad_norm"] == pytest.approx(h["optim/grad_norm"], rel=1e-5)  # over every rank's shards
        for key in ("rollout/sync_tokens", "probe/tokens", "probe/accepted"):
            assert r[key] == h[key], key
    for key in ("eval/accuracy", "eval/teacher_kl", "eval/mean_len"):
        assert rows[-1][key] == pytest.approx(one.history[-1][key], rel=1e-5, abs=1e-7), key
    exported = load_file(str(runs["fsdp"] / "student" / "model.safetensors"))
    assert _max_diff(exported, load_file(str(one.student_dir / "model.safetensors"))) <= 1e-5


def test_a_sharded_checkpoint_holds_every_ranks_shards_and_the_export_loads_with_transformers(runs: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ck = runs["fsdp"] / f"checkpoint-{STEPS}"
    assert sorted(p.name for p in (ck / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (ck / "model.safetensors").exists()
    state = json.loads((ck / "state.json").read_text())
    assert (state["world_size"], state["sharding"]) == (2, "fsdp")
    student = runs["fsdp"] / "student"
    model = AutoModelForCausalLM.from_pretrained(student)
    exported = load_file(str(student / "model.safetensors"))
    assert _max_diff({k: v for k, v in model.state_dict().items() if k in exported}, exported) == 0.0
    assert AutoTokenizer.from_pretrained(student).eos_token_id is not None
    assert runs["stdout"].count("student (transformers folder") == 1
    assert str(student) in " ".join(runs["stdout"].split())


def _cut_at(runs: dict, name: str) -> Path:
    """A copy of the sharded run as if it had crashed after its step-EVERY checkpoint."""
    return cut_copy(runs["fsdp"], runs["tmp"] / "runs" / name, STEPS, "student")


def test_a_sharded_run_resumes_on_two_ranks_as_it_ran(runs: dict) -> None:
    run = _cut_at(runs, "resumed-2")
    two_ranks(runs["tmp"], "--resume", str(run))
    assert [r["window/current"] for r in metrics_rows(run)] == [r["window/current"] for r in metrics_rows(runs["fsdp"])]
    assert [r["step"] for r in metrics_rows(run)] == list(range(STEPS))
    assert _max_diff(load_file(str(run / "student" / "model.safetensors")),
                     load_file(str(runs["fsdp"] / "student" / "model.safetensors"))) <= 1e-7


def test_a_two_rank_checkpoint_resumes_in_one_process(runs: dict) -> None:
    run = _cut_at(runs, "resumed-1")
    assert cli_main(["train", "--resume", str(run)]) == 0  # DCP reshards the 2 ranks' shards into one process
    assert [r["window/current"] for r in metrics_rows(run)] == [r["window/current"] for r in metrics_rows(runs["fsdp"])]
    assert _max_diff(load_file(str(run / "student" / "model.safetensors")),
                     load_file(str(runs["fsdp"] / "student" / "model.safetensors"))) <= 1e-6
    assert json.loads((run / f"checkpoint-{STEPS}" / "state.json").read_text())["world_size"] == 1


@pytest.mark.parametrize("overrides,param,reduce", [
    ({}, None, None),
    ({"model.autocast": "bf16"}, torch.bfloat16, torch.float32),
    ({"model.dtype": "bfloat16"}, None, torch.float32),
])
def test_precision_fields_map_to_fsdps_mixed_precision_policy(overrides: dict, param, reduce) -> None:
    policy = precision_policy(load_config(None, {"model.sharding": "fsdp", **overrides}))
    assert (policy.param_dtype, policy.reduce_dtype) == (param, reduce)
