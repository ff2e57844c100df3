"""What a data-parallel checkpoint adds: the world size it was written with and each rank's RNG states.

Rank 0 writes the checkpoint (model, optimizer, run state and controller snapshot are the same on every
rank: gradients are summed and the bookkeeping is replicated); the ranks' RNG states are gathered to it
and written as ``rng-rank<r>.pt`` inside the same atomic folder. ``state.json`` records ``world_size``;
resuming with another world size is refused (the ranks' RNG streams and shards would not line up).
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


def restore_rank_rng(checkpoint: Path, rank: int, world: int) -> None:
    """This rank's RNG states back (after ``load_checkpoint``, which restored rank 0's)."""
    if world <= 1:
        return
    path = rank_rng_file(checkpoint, rank)
    if not path.is_file():
        raise ValueError(f"{checkpoint}: no {path.name} for rank {rank} (not written by a {world}-rank run)")
    set_rng_state(torch.load(path, weights_only=False))


def check_world_size(checkpoint: Path, world: int) -> None:
    """Before any compute: a checkpoint resumes with the world size that wrote it."""
    saved = int(json.loads((checkpoint / "state.json").read_text()).get("world_size", 1))
    if saved != world:
        raise ValueError(f"--resume: {checkpoint.name} was written by a {saved}-process run and this run has "
                         f"{world} (world size); resume with --nproc {saved}")
