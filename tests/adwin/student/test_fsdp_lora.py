"""A LoRA student sharded: `adwin train --nproc 2 --set model.sharding=fsdp --set model.lora.r=4` (FSDP2 over 2 gloo
ranks, adapters and frozen base in the same units, inline probes, per-sample seeding, gradients clipped) trains
the 1-process LoRA run, its sharded checkpoints hold the adapters and their AdamW state only, it exports the
adapter and the merged student, and it resumes with the same or another number of ranks; a sharded checkpoint
of the other kind is refused naming model.lora."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp_runs import cut_copy, ddp_config, metrics_rows, two_ranks
from safetensors.torch import load_file
from tiny_models import make_tiny_llama
from torch.distributed.checkpoint import FileSystemReader

from adwin.cli import main as cli_main
from adwin.config import LoraSection, load_config
from adwin.controller import Controller
from adwin.loop.distributed import LocalDist
from adwin.loop.trainer import train
from adwin.runtime.checkpoint import CheckpointMismatch
from adwin.runtime.sharded_checkpoint import SHARDED_DIR, load_sharded, stage_sharded
from adwin.student.lora import LORA_EXPORT, apply_lora
from adwin.student.optimizer import build_optimizer
from adwin.student.structure import is_lora

pytest.importorskip("peft")  # the lora extra

STEPS, EVERY, CLIP = 4, 2, 0.03  # the clip engages on some steps (norms ~0.02-0.05): it must see every shard
LORA = ["--set", "model.lora.r=4", "--set", "model.lora.alpha=8"]
ADAPTER = Path(LORA_EXPORT) / "adapter" / "adapter_model.safetensors"


def _rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    num = sum(float((a[k] - b[k]).norm() ** 2) for k in a) ** 0.5
    return num / sum(float(a[k].norm() ** 2) for k in a) ** 0.5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("fsdp-lora")
    cfg = ddp_config(tmp, steps=STEPS, checkpoint_every=EVERY, **{"optim.lr": 1e-2, "optim.grad_clip": CLIP})
    two = two_ranks(tmp, "--config", str(cfg), "--name", "sharded", "--set", "model.sharding=fsdp", *LORA)
    one = train(load_config(cfg, {"name": "one", "model.lora.r": 4, "model.lora.alpha": 8}), Controller())
    return {"tmp": tmp, "one": one, "stdout": two.stdout, "sharded": tmp / "runs" / "sharded"}


def test_a_sharded_lora_run_trains_the_one_process_lora_run(runs: dict) -> None:
    one, rows = runs["one"], metrics_rows(runs["sharded"])
    assert [h["window/current"] for h in one.history] == [r["window/current"] for r in rows]
    assert sum("audit/id" in h for h in one.history) >= 2
    assert any(h["optim/grad_norm"] > CLIP for h in one.history)
    for h, r in zip(one.history, rows, strict=True):
        assert ("audit/id" in h) == ("audit/id" in r)
        for key in (k for k in h if k.startswith("audit/micro_cos_")):
            assert r[key] == pytest.approx(h[key], abs=1e-5), key
        assert r["loss/total"] == pytest.approx(h["loss/total"], rel=1e-4, abs=1e-6)
        assert r["optim/grad_norm"] == pytest.approx(h["optim/grad_norm"], rel=1e-5)  # the adapters' shards
    assert _rel_diff(load_file(str(one.run_dir / ADAPTER)), load_file(str(runs["sharded"] / ADAPTER))) <= 1e-5
    merged = load_file(str(runs["sharded"] / LORA_EXPORT / "merged" / "model.safetensors"))
    reference = load_file(str(one.run_dir / LORA_EXPORT / "merged" / "model.safetensors"))
    assert _rel_diff(reference, merged) <= 1e-6


def test_a_sharded_lora_checkpoint_holds_the_adapters_and_their_optimizer_state_only(runs: dict) -> None:
    ck = runs["sharded"] / f"checkpoint-{STEPS}"
    keys = FileSystemReader(ck / SHARDED_DIR).read_metadata().state_dict_metadata
    weights = [k for k in keys if k.startswith("model.")]
    moments = {k.split(".exp_avg_sq")[0].removeprefix("optim.state.") for k in keys if k.endswith(".exp_avg_sq")}
    assert weights and all(".lora_A." in k or ".lora_B." in k for k in weights)
    assert moments == {k.removeprefix("model.") for k in weights}
    assert not (ck / "model.safetensors").exists() and not (ck / "adapter_model.safetensors").exists()
    assert not (runs["sharded"] / "student").exists()  # the whole student is the merged export
    assert str(runs["sharded"] / LORA_EXPORT / "merged") in " ".join(runs["stdout"].split())


def test_the_merged_export_loads_with_transformers_and_the_adapter_with_peft(runs: dict) -> None:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    export = runs["sharded"] / LORA_EXPORT
    ids = torch.tensor([[1, 5, 9, 17, 33, 8, 4]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(export / "merged")(input_ids=ids).logits
        adapted = AutoPeftModelForCausalLM.from_pretrained(export / "adapter")(input_ids=ids).logits
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=1e-5)


def _cut_at(runs: dict, name: str) -> Path:
    """A copy of the sharded run as if it had crashed after its step-EVERY checkpoint."""
    return cut_copy(runs["sharded"], runs["tmp"] / "runs" / name, STEPS, LORA_EXPORT)


def test_a_sharded_lora_run_resumes_on_two_ranks_as_it_ran(runs: dict) -> None:
    run = _cut_at(runs, "resumed-2")
    two_ranks(runs["tmp"], "--resume", str(run))
    assert [r["window/current"] for r in metrics_rows(run)] == [r["window/current"] for r in metrics_rows(runs["sharded"])]
    assert [r["step"] for r in metrics_rows(run)] == list(range(STEPS))
    assert _rel_diff(load_file(str(runs["sharded"] / ADAPTER)), load_file(str(run / ADAPTER))) <= 1e-7


def test_a_two_rank_lora_checkpoint_resumes_in_one_process(runs: dict) -> None:
    run = _cut_at(runs, "resumed-1")
    assert cli_main(["train", "--resume", str(run)]) == 0  # DCP reshards the 2 ranks' adapter shards
    assert [r["window/current"] for r in metrics_rows(run)] == [r["window/current"] for r in metrics_rows(runs["sharded"])]
    assert _rel_diff(load_file(str(runs["sharded"] / ADAPTER)), load_file(str(run / ADAPTER))) <= 1e-5


def test_a_sharded_checkpoint_of_the_other_kind_is_refused_naming_model_lora(runs: dict, tmp_path: Path) -> None:
    cfg = load_config(None, {"model.sharding": "fsdp"})
    lora_ck = runs["sharded"] / f"checkpoint-{STEPS}"
    full = make_tiny_llama()
    with pytest.raises(CheckpointMismatch, match="holds LoRA adapters but the run's config has no model.lora"):
        load_sharded(lora_ck, full, build_optimizer(cfg, full)[0], lora=is_lora(full))
    other = apply_lora(make_tiny_llama(), LoraSection(r=4, target_modules=["q_proj"]))  # other targets
    with pytest.raises(CheckpointMismatch, match="LoRA adapters do not match the student's"):
        load_sharded(lora_ck, other, build_optimizer(cfg, other)[0], lora=is_lora(other))
    full_ck = stage_sharded(tmp_path, 1, full, build_optimizer(cfg, full)[0], LocalDist())  # a world of one
    lora = apply_lora(make_tiny_llama(), LoraSection(r=4))
    with pytest.raises(CheckpointMismatch, match="holds full weights but the run's config sets model.lora"):
        load_sharded(full_ck, lora, build_optimizer(cfg, lora)[0], lora=is_lora(lora))
