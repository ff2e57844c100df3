"""What a data-parallel checkpoint adds: the world size it was written with and each rank's RNG states.

Rank 0 writes the checkpoint (model, optimizer, run state and controller snapshot are the same on every
rank: gradients are summed and the bookkeeping is replicated; a sharded student's shards are written by
every rank, ``adwin.runtime.sharded_checkpoint``); the ranks' RNG states are gathered to it
and written as ``rng-rank<r>.pt`` inside the same atomic folder. ``state.json`` records ``world_size`` and ``sharding``;
``check_resumable`` says which runs may continue a checkpoint (a sharded one may change its world size).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from adwin.runtime.checkpoint import set_rng_state


def rank_rng_file(folder: Path, rank: int) -> Path:
    return folder / f"rng-rank{rank}.pt"


def write_rank_rngs(folder: Path, states: Sequence[dict[str, Any]]) -> None:
    """One file per rank (``states`` in rank order, from ``all_gather_object(rng_state())``)."""
    if len(states) <= 1:
        return  # one process: trainer_state.pt holds its RNG states
    for rank, state in enumerate(states):
        torch.save(state, rank_rng_file(folder, rank))


def saved_world(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "state.json").read_text()).get("world_size", 1))


def restore_rank_rng(checkpoint: Path, rank: int, world: int) -> None:
    """This rank's RNG states back (after ``load_checkpoint``, which restored rank 0's). A sharded run resumed
    with another world size (``check_resumable``) keeps rank 0's on every rank: under per-sample seeding no
    sample draws from them."""
    if world <= 1 or saved_world(checkpoint) != world:
        return
    path = rank_rng_file(checkpoint, rank)
    if not path.is_file():
        raise ValueError(f"{checkpoint}: no {path.name} for rank {rank} (not written by a {world}-rank run)")
    set_rng_state(torch.load(path, weights_only=False))


def check_resumable(checkpoint: Path, world: int, sharding: str = "ddp", seeding: str = "per_sample") -> None:
    """Before any compute: whether this run (``world`` ranks, ``model.sharding``, ``rollout.seeding``) can
    continue ``checkpoint``, else an error naming the field and why.

    The student's state is stored as the sharding wrote it (one transformers folder for ``ddp``, DCP shards
    for ``fsdp``), so the sharding must match. A replicated checkpoint resumes with the world size that wrote
    it (the ranks' RNG streams and shards would not line up). A sharded one reshards on load, so it resumes
    with any world size when every sample's noise is its own (``rollout.seeding: per_sample``: the run is
    then the same function of its seed at every world size); with batch seeding each rank's noise is its own
    RNG stream, which no other number of ranks continues.
    """
    state = json.loads((checkpoint / "state.json").read_text())
    saved, wrote = int(state.get("world_size", 1)), str(state.get("sharding", "ddp"))
    if wrote != sharding:
        kept = "as DCP shards" if wrote == "fsdp" else "as one transformers folder"
        raise ValueError(f"--resume: model.sharding: {checkpoint.name} was written by a model.sharding={wrote} run "
                         f"(the student's state is stored {kept}); resume with --set model.sharding={wrote}")
    if saved == world:
        return
    if sharding == "ddp":
        raise ValueError(f"--resume: {checkpoint.name} was written by a {saved}-process run and this run has "
                         f"{world} (world size); resume with --nproc {saved}")
    if seeding != "per_sample":
        raise ValueError(f"--resume: rollout.seeding: {checkpoint.name} was written by {saved} ranks and this run "
                         f"has {world}; with rollout.seeding: batch each rank samples from its own RNG stream, which "
                         f"no other number of ranks continues: resume with --nproc {saved}, or run with "
                         "rollout.seeding: per_sample")
