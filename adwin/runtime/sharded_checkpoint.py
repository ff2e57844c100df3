"""Checkpoints and the final export of a sharded student (``model.sharding: fsdp``).

``<run>/checkpoint-<step>/sharded/`` holds the student's weights and AdamW's state in
``torch.distributed.checkpoint`` (DCP) format: every rank writes its own shards in parallel (one file per
rank plus the metadata), keyed by parameter name. The rest of the folder is what a replicated checkpoint
holds besides the model and optimizer (scheduler, RNG states, run state, controller snapshot,
``state.json``), written by rank 0 into the same atomic folder (``adwin.runtime.checkpoint``). DCP reshards
on load, so a checkpoint written by N ranks loads into any world size (``adwin.runtime.rank_state`` says
when the run may continue with another one). All ranks must reach the same folder: one machine, or a
filesystem every node mounts.

Only what training changes is stored (``TRAINED``): a LoRA student's checkpoint holds its adapters and their
AdamW moments, the frozen base being reloaded from the base checkpoint on resume (as an unsharded LoRA
checkpoint holds the adapter folder only, ``adwin.student.lora``).

``export_student`` writes the final student as a transformers ``save_pretrained`` folder: the whole state
dict gathered on rank 0 (in host memory), the tokenizer beside it; a LoRA student's export is its adapter
and the merged student (``adwin.student.lora.export_lora``), only the adapters gathered when the base
checkpoint is on disk.
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

from adwin.runtime.checkpoint import CheckpointMismatch, staging_folder
from adwin.student.lora import (
    LORA_EXPORT,
    MERGED_DIR,
    base_checkpoint,
    export_lora,
)
from adwin.student.structure import is_lora

log = logging.getLogger(__name__)

SHARDED_DIR = "sharded"
STUDENT_DIR = "student"  # the run's final student, exported as a transformers folder
MODEL_KEY = "model"  # the DCP state's entries: "model" and "optim", flattened to "model.<parameter name>"


def trained_options(**kw: Any) -> Any:
    """``StateDictOptions`` that leave the frozen parameters out (a LoRA student's base; nothing otherwise)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, **kw)


def is_sharded_checkpoint(path: Path) -> bool:
    return (Path(path) / SHARDED_DIR).is_dir()


def stage_sharded(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  dist: Any) -> Path:
    """Every rank: rank 0 opens the checkpoint's staging folder, every rank writes its shards of the model
    and optimizer into it (DCP). Returns the folder; ``save_checkpoint(..., staged=folder)`` completes it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(dist.broadcast_object(str(staging_folder(run_dir, step)) if dist.is_main else None))
    model_sd, optim_sd = get_state_dict(model, optimizer, options=trained_options())
    with _one_process_quiet():
        dcp.save({MODEL_KEY: model_sd, "optim": optim_sd}, checkpoint_id=folder / SHARDED_DIR,
                 no_dist=_one_process())
    return folder


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, lora: bool) -> None:
    """Every rank: the checkpoint's weights and optimizer state into ``model`` and ``optimizer`` in place,
    resharded to this run's world size. A checkpoint of the other kind (full weights for a LoRA student, or
    the reverse) is a ``CheckpointMismatch`` naming ``model.lora``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # an optimizer with no state yet gets empty moments
    model_sd, optim_sd = get_state_dict(model, optimizer, options=trained_options())
    check_sharded_kind(path, set(model_sd), lora)
    state = {MODEL_KEY: model_sd, "optim": optim_sd}
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=Path(path) / SHARDED_DIR, no_dist=_one_process())
    # not strict: the frozen base is not in the checkpoint (its keys were just checked against the model's)
    set_state_dict(model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state["optim"],
                   options=trained_options(strict=False))


def check_sharded_kind(path: Path, wanted: set[str], lora: bool) -> None:
    """The checkpoint's weights must be the ones the student trains: its adapters (``lora``) or all of it."""
    from torch.distributed.checkpoint import FileSystemReader

    prefix = f"{MODEL_KEY}."
    saved = {k[len(prefix):] for k in FileSystemReader(Path(path) / SHARDED_DIR).read_metadata().state_dict_metadata
             if k.startswith(prefix)}
    if saved == wanted:
        return
    holds = "LoRA adapters" if saved and all(".lora_" in k for k in saved) else "full weights"
    if lora == (holds == "LoRA adapters"):  # same kind, other layout: other targets, rank or model
        raise CheckpointMismatch(f"{path}: the checkpoint's {holds} do not match the student's (missing "
                                 f"{sorted(wanted - saved)[:3]}, unexpected {sorted(saved - wanted)[:3]}); resume "
                                 "with the run's own config.json (model.lora, model.student)")
    raise CheckpointMismatch(f"{path}: the checkpoint holds {holds} but the run's config "
                             f"{'sets' if lora else 'has no'} model.lora; resume with the run's own config.json")


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
    and the tokenizer) atomically; a LoRA student's adapter and merged student go to ``<run>/export``
    instead. Returns the folder of the whole (merged) student."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    lora = is_lora(model)
    gathered = StateDictOptions(full_state_dict=True, cpu_offload=True,
                                ignore_frozen_params=lora and base_checkpoint(model) is not None)
    full = get_model_state_dict(model, options=gathered)
    if lora:
        if dist.is_main:
            export_lora(model, tokenizer, Path(run_dir) / LORA_EXPORT, state=full)
        del full
        dist.barrier()
        return Path(run_dir) / LORA_EXPORT / MERGED_DIR
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
