"""A LoRA student through the synchronous trainer (tiny checkpoints on disk): it trains and audits on the
adapters, its probe replicas get the adapters, checkpoints hold the adapter only, ``--resume`` continues the
straight run, and the run ends with the adapter and the merged student exported."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.parts import load_parts
from adwin.loop.trainer import train
from adwin.probes.extender import ModelExtender, snapshot_weights
from adwin.runtime.checkpoint import latest_checkpoint
from adwin.runtime.resume import open_resumed_controller
from adwin.student.lora import LORA_EXPORT, trainable_named_parameters
from adwin.student.structure import is_lora

peft = pytest.importorskip("peft")  # the lora extra

N = 6
LORA = {"model.lora.r": 4, "model.lora.alpha": 8, "optim.lr": 1e-2, "steps": N, "name": "run",
        "checkpoint_every": N // 2, "eval.every": 0}


def _cfg(tmp: Path, out: str, **extra: object):
    return load_config(None, tiny_overrides(tmp, **LORA, out_dir=str(tmp / out)) | extra)


def _adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainable_named_parameters(model)}


def test_a_lora_run_trains_and_audits_the_adapters_and_saves_and_exports_them_only(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "runs")  # probes.backend: thread (the default): audits on a replica synced by snapshots
    parts = load_parts(cfg)
    assert is_lora(parts.student) and not any(is_lora(t) for t in parts.teachers.models.values())
    base = load_file(str(Path(cfg.model.student) / "model.safetensors"))
    start = _adapters(parts.student)
    res = train(cfg, Controller(), parts)
    assert any("audit/id" in h for h in res.history), "the run must audit for the check to mean much"
    for name, p in parts.student.named_parameters():
        if "lora_" not in name:  # the frozen base: bit-identical to the checkpoint it was loaded from
            key = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(p.detach(), base[key]), name
    end = _adapters(parts.student)
    assert all(not torch.equal(end[n], start[n]) for n in end if ".lora_B." in n)
    ck = latest_checkpoint(res.run_dir)
    assert ck is not None and (ck / "adapter_model.safetensors").is_file() and not (ck / "model.safetensors").exists()
    optimizer = torch.load(ck / "trainer_state.pt", weights_only=False)["optimizer"]
    assert len(optimizer["state"]) == len(end)  # Adam moments of the adapters, nothing of the base
    saved = load_file(str(ck / "adapter_model.safetensors"))
    assert sum(v.numel() for v in saved.values()) == sum(v.numel() for v in end.values())
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(res.run_dir / LORA_EXPORT / "merged")
    ids = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, parts.student(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-5)
    assert (res.run_dir / LORA_EXPORT / "adapter" / "adapter_config.json").is_file()


def test_a_probe_replica_takes_the_adapters_from_the_snapshot_and_samples_as_the_student(tmp_path: Path) -> None:
    parts = load_parts(_cfg(tmp_path, "runs"))
    replica = copy.deepcopy(parts.student).eval()  # how the thread and Ray workers start
    with torch.no_grad():
        for _, p in trainable_named_parameters(parts.student):
            p.add_(0.05)  # the trainer moves on
    weights = snapshot_weights(parts.student)
    assert sorted(weights) == sorted(n for n, _ in trainable_named_parameters(parts.student))  # adapters only
    extender = ModelExtender(replica, {2}, 0)
    extender.load(weights)
    torch.manual_seed(0)
    got = extender([[1, 5, 9]], [6])
    torch.manual_seed(0)
    want = ModelExtender(parts.student, {2}, 0)([[1, 5, 9]], [6])
    assert got.tokens == want.tokens and got.logprobs[0] == pytest.approx(want.logprobs[0], abs=1e-6)


def test_a_resumed_lora_run_matches_the_straight_run(tmp_path: Path) -> None:
    # inline probe rounds: a run that is a pure function of its seed (tests/adwin/runtime/test_resume.py)
    straight = train(_cfg(tmp_path, "straight", **{"probes.backend": "inline"}), Controller())
    cfg = _cfg(tmp_path, "split", **{"probes.backend": "inline"})
    seen: list[dict] = []

    def crash(t: int, m: dict) -> None:
        seen.append(m)
        if t == N // 2:
            raise RuntimeError("simulated crash after the checkpoint")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, Controller(), on_step=crash)
    ck = latest_checkpoint(tmp_path / "split" / "run")
    assert ck is not None and ck.name == f"checkpoint-{N // 2}"
    parts = load_parts(cfg)
    res = train(cfg, open_resumed_controller(ck), parts, resume=ck)
    windows = [int(h["window/current"]) for h in straight.history]
    assert [int(m["window/current"]) for m in seen[: N // 2]] + [int(h["window/current"]) for h in res.history] == windows
    assert any("audit/id" in h for h in straight.history)
    ends = [load_file(str(d / f"checkpoint-{N}" / "adapter_model.safetensors"))
            for d in (tmp_path / "straight" / "run", tmp_path / "split" / "run")]
    assert max(float((ends[0][k] - ends[1][k]).abs().max()) for k in ends[0]) <= 1e-6
    states = [json.loads((d / f"checkpoint-{N}" / "state.json").read_text())["policy_state"]
              for d in (tmp_path / "straight" / "run", tmp_path / "split" / "run")]
    assert states[0] == states[1]
