"""Checkpoints in the run folder, written atomically.

``<run>/checkpoint-<step>/`` holds the student (``save_pretrained``; a LoRA student: its adapter only; a sharded
student's weights and optimizer state are DCP shards instead, ``adwin.runtime.sharded_checkpoint``), its
tokenizer, ``trainer_state.pt`` (optimizer, scheduler, RNG states and whatever extra run state the caller
passes: prompt stream position, probe pool, token ledger, fault counters), optional extra files (the embedded
controller's database) and ``state.json`` (the step, the window policy's state, the run id). ``step`` counts
the loop steps done, so a resumed run continues with step ``step``.

Atomicity: everything is written into a temporary sibling folder, fsynced, then renamed to
``checkpoint-<step>`` (a rename within one folder is atomic on POSIX). A crash mid-write leaves at most a
``.checkpoint-*.tmp`` folder, which ``latest_checkpoint`` ignores and the next save removes; the previous
checkpoint is untouched.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adwin.student.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, require_peft

log = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(\d+)$")
_TMP_PREFIX = ".checkpoint-"


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNG streams (what ``rng_state`` captures)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    policy_state: dict[str, Any],
    *,
    extra: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    write_files: Callable[[Path], None] | None = None,
    staged: Path | None = None,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Atomically write ``checkpoint-<step>`` and return its path.

    ``extra`` goes into ``trainer_state.pt`` (anything ``torch.save`` pickles), ``meta`` into ``state.json``
    (JSON), ``write_files(folder)`` may add files (e.g. a database snapshot) before the folder is published.
    ``staged``: a ``staging_folder`` that already holds the model's and optimizer's state (a sharded student's,
    ``adwin.runtime.sharded_checkpoint``); the rest is written into it and it is published. ``rng``: the RNG
    streams to save (``rng_state()``'s form; None: the current ones).
    """
    run_dir = Path(run_dir)
    tmp = staged if staged is not None else staging_folder(run_dir, step)
    try:
        blob: dict[str, Any] = {"scheduler": scheduler.state_dict(), "rng": rng or rng_state(), "extra": extra or {}}
        if staged is None:
            model.save_pretrained(tmp)  # type: ignore[operator]
            blob["optimizer"] = optimizer.state_dict()
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(tmp)
        torch.save(blob, tmp / "trainer_state.pt")
        if write_files is not None:
            write_files(tmp)
        # state.json last: a folder with it (and trainer_state.pt) is complete even for pre-atomic checkpoints
        (tmp / "state.json").write_text(json.dumps({"step": step, "policy_state": policy_state, **(meta or {})},
                                                   indent=2))
        _fsync_tree(tmp)
        final = run_dir / f"checkpoint-{step}"
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.debug("checkpoint written: %s", final)
    return final


def staging_folder(run_dir: str | Path, step: int) -> Path:
    """A fresh hidden folder in ``run_dir`` that ``save_checkpoint`` publishes as ``checkpoint-<step>`` (partial
    folders of a crash removed first)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_partial_checkpoints(run_dir)
    return Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{step}.", suffix=".tmp", dir=run_dir))


def _publish(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` (a step re-run after resume) is replaced."""
    if final.exists():
        trash = final.with_name(f"{_TMP_PREFIX}{final.name}.old.tmp")
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(final.parent)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_partial_checkpoints(run_dir: str | Path) -> int:
    """Delete ``.checkpoint-*.tmp`` folders left by a crash mid-write; returns how many."""
    n = 0
    for p in Path(run_dir).glob(f"{_TMP_PREFIX}*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
        n += 1
    if n:
        log.warning("removed %d partial checkpoint folder(s) in %s", n, run_dir)
    return n


def is_complete(path: Path) -> bool:
    return (path / "state.json").is_file() and (path / "trainer_state.pt").is_file()


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete ``checkpoint-<step>`` with the highest step, or None."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    for _, path in sorted(found, reverse=True):
        if is_complete(path):
            return path
        log.warning("skipping incomplete checkpoint %s", path)
    return None


class CheckpointMismatch(ValueError):
    """A checkpoint folder's kind (full weights or LoRA adapter) is not the student's."""


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def load_adapter(path: str | Path, model: torch.nn.Module) -> None:
    """Load an adapter folder's weights into the LoRA ``model`` in place (the optimizer keeps its params)."""
    from safetensors.torch import load_file

    peft = require_peft()
    path = Path(path)
    try:
        result = peft.set_peft_model_state_dict(model, load_file(str(path / ADAPTER_WEIGHTS)))
    except RuntimeError as e:  # shapes differ: another rank or other targets
        raise CheckpointMismatch(f"{path}: adapter does not match the student's model.lora ({e})") from e
    adapters = [k for k in result.missing_keys if "lora_" in k]  # the base weights are never in an adapter
    if result.unexpected_keys or adapters:
        raise CheckpointMismatch(f"{path}: adapter does not match the student's model.lora (missing "
                                 f"{sorted(adapters)[:3]}, unexpected {sorted(result.unexpected_keys)[:3]})")


def check_checkpoint_kind(path: str | Path, lora: bool) -> None:
    """A LoRA student (``lora``) resumes from an adapter folder, a full one from a full checkpoint; else say which
    is which."""
    adapter = is_adapter_folder(path)
    if adapter and not lora:
        raise CheckpointMismatch(f"{path}: the checkpoint holds LoRA adapters but the run's config has no "
                                 "model.lora; resume with the run's own config.json")
    if lora and not adapter:
        raise CheckpointMismatch(f"{path}: the checkpoint holds full weights but the run's config sets model.lora; "
                                 "resume with the run's own config.json")


def load_weights(path: str | Path, model: torch.nn.Module, *, lora: bool) -> None:
    """Load a ``save_pretrained`` folder's weights into ``model`` in place (the optimizer keeps its params); a
    LoRA student's (``lora``: ``adwin.student.structure.is_lora``) folder holds its adapter only (``load_adapter``);
    a folder of the other kind is refused (``check_checkpoint_kind``)."""
    from safetensors.torch import load_file

    path = Path(path)
    check_checkpoint_kind(path, lora)
    if is_adapter_folder(path):
        load_adapter(path, model)
        return
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:  # shard by shard: peak memory is one shard beyond the model
        state.update(load_file(str(path / name)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k or "embed" in k}  # save_pretrained drops tied copies
    if unexpected or set(missing) - tied:
        raise ValueError(f"{path}: checkpoint does not match the student (missing {sorted(set(missing) - tied)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()


def load_checkpoint(path: str | Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG states; return ``state.json`` plus ``extra`` (see ``save_checkpoint``).

    Restores the RNG states, so call it last, right before the step loop. The model loads with
    ``load_weights(path, model)`` (in place) or ``from_pretrained(path)``.
    """
    path = Path(path)
    blob = torch.load(path / "trainer_state.pt", weights_only=False)
    if "optimizer" in blob:  # a sharded checkpoint's optimizer state is in its shards (``load_sharded``)
        optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    state = json.loads((path / "state.json").read_text())
    state["extra"] = blob.get("extra", {})
    return state
