"""A 2-rank data-parallel run (gloo, CPU) crashed after its checkpoint and resumed equals the uninterrupted
2-rank run: parameters, windows, one metrics row per step, each rank's RNG file; another world size is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from ddp_runs import ddp_config, resume_worker
from safetensors.torch import load_file

from adwin.loop.distributed import free_port
from adwin.runtime.rank_state import check_resumable

STEPS, EVERY, CRASH = 4, 2, 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("ddp-resume")
    cfg = ddp_config(tmp, steps=STEPS, checkpoint_every=EVERY)
    out = tmp / "windows.json"
    mp.spawn(resume_worker, args=(2, free_port(), str(cfg), CRASH, str(out)), nprocs=2, join=True)
    return tmp / "runs", json.loads(out.read_text())


def test_resumed_two_rank_run_matches_the_uninterrupted_one(runs: tuple[Path, dict]) -> None:
    root, seen = runs
    assert seen["checkpoint"] == f"checkpoint-{EVERY}"
    assert seen["audits"] >= 2, "the run must audit for the window check to mean much"
    assert seen["resumed"] == seen["straight"]
    a = load_file(str(root / "straight" / f"checkpoint-{STEPS}" / "model.safetensors"))
    b = load_file(str(root / "split" / f"checkpoint-{STEPS}" / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    rows = [json.loads(x)["step"] for x in (root / "split" / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(STEPS))
    ck = root / "split" / f"checkpoint-{STEPS}"
    assert (ck / "rng-rank0.pt").is_file() and (ck / "rng-rank1.pt").is_file()
    assert json.loads((ck / "state.json").read_text())["world_size"] == 2


def test_resuming_with_another_world_size_is_refused(runs: tuple[Path, dict]) -> None:
    root, _ = runs
    with pytest.raises(ValueError, match="written by a 2-process run .* resume with --nproc 2"):
        check_resumable(root / "split" / f"checkpoint-{EVERY}", 1)


def _written_by(tmp: Path, world: int, sharding: str | None) -> Path:
    ck = tmp / "checkpoint-2"
    ck.mkdir()
    state = {"step": 2, "run_id": "r", "world_size": world} | ({"sharding": sharding} if sharding else {})
    (ck / "state.json").write_text(json.dumps(state))
    return ck


def test_a_sharded_checkpoint_resumes_with_another_world_size_only_under_per_sample_seeding(tmp_path: Path) -> None:
    ck = _written_by(tmp_path, 2, "fsdp")
    for world in (1, 2, 4):
        check_resumable(ck, world, "fsdp", "per_sample")  # DCP reshards; every sample's noise is its own
    check_resumable(ck, 2, "fsdp", "batch")
    with pytest.raises(ValueError, match=r"rollout\.seeding: .* its own RNG stream.* --nproc 2"):
        check_resumable(ck, 4, "fsdp", "batch")


def test_a_checkpoint_resumes_only_with_the_sharding_that_wrote_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model\.sharding: .* model\.sharding=fsdp run .* --set model\.sharding=fsdp"):
        check_resumable(_written_by(tmp_path, 2, "fsdp"), 2, "ddp")
    other = tmp_path / "old"
    other.mkdir()
    with pytest.raises(ValueError, match=r"model\.sharding=ddp run .* one transformers folder"):
        check_resumable(_written_by(other, 2, None), 2, "fsdp")  # written before the field existed: ddp
