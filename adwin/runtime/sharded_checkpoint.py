"""Checkpoints and the final export of a sharded student (``model.sharding: fsdp``).

``<run>/checkpoint-<step>/sharded/`` holds the student's weights and AdamW's state in
``torch.distributed.checkpoint`` (DCP) format: every rank writes its own shards in parallel (one file per
rank plus the metadata), keyed by parameter name. The rest of the folder is what a replicated checkpoint
holds besides the model and optimizer (scheduler, RNG states, run state, controller snapshot,
``state.json``), written by rank 0 into the same atomic folder (``adwin.runtime.checkpoint``). DCP reshards
on load, so a checkpoint written by N ranks loads into any world size (``adwin.runtime.rank_state`` says
when the run may continue with another one). All ranks must reach the same folder: one machine, or a
filesystem every node mounts.

``export_student`` writes the final student as a transformers ``save_pretrained`` folder: the whole state
dict gathered on rank 0 (in host memory), the tokenizer beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from adwin.runtime.checkpoint import staging_folder

log = logging.getLogger(__name__)

SHARDED_DIR = "sharded"
STUDENT_DIR = "student"  # the run's final student, exported as a transformers folder


def is_sharded_checkpoint(path: Path) -> bool:
    return (Path(path) / SHARDED_DIR).is_dir()


def stage_sharded(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  dist: Any) -> Path:
    """Every rank: rank 0 opens the checkpoint's staging folder, every rank writes its shards of the model
    and optimizer into it (DCP). Returns the folder; ``save_checkpoint(..., staged=folder)`` completes it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(dist.broadcast_object(str(staging_folder(run_dir, step)) if dist.is_main else None))
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _one_process_quiet():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder / SHARDED_DIR, no_dist=_one_process())
    return folder


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank: the checkpoint's weights and optimizer state into ``model`` and ``optimizer`` in place,
    resharded to this run's world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)  # an optimizer with no state yet gets empty moments
    state = {"model": model_sd, "optim": optim_sd}
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=Path(path) / SHARDED_DIR, no_dist=_one_process())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _one_process() -> bool:
    """No process group: a world of one, which reads and writes every shard itself."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _one_process_quiet() -> Iterator[None]:
    """DCP warns on every call of a world of one that it reads and writes alone: that is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def export_student(run_dir: Path, model: torch.nn.Module, tokenizer: Any, dist: Any) -> Path:
    """Every rank: gather the whole student on rank 0, which writes ``<run>/student`` (``save_pretrained``
    and the tokenizer) atomically. Returns the folder."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    dest = Path(run_dir) / STUDENT_DIR
    if dist.is_main:
        tmp = dest.with_name(f".{STUDENT_DIR}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=full)  # type: ignore[operator]
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
        log.info("student exported: %s", dest)
    del full
    dist.barrier()
    return dest
