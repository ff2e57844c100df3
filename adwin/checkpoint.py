"""Checkpoints in the run folder: ``<run>/checkpoint-<step>/`` holds the student (``save_pretrained``),
its tokenizer, the optimizer and scheduler, the step, the RNG states and the window policy's state as the
controller holds it (so a resumed run continues with the same window)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


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
) -> Path:
    """Write ``checkpoint-<step>`` (``step`` = optimizer steps applied) and return its path."""
    path = Path(run_dir) / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)  # type: ignore[operator]
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(path)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
               path / "trainer_state.pt")
    (path / "state.json").write_text(json.dumps({"step": step, "policy_state": policy_state}, indent=2))
    return path


def load_checkpoint(path: str | Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG states (the model loads with ``from_pretrained(path)``)."""
    path = Path(path)
    blob = torch.load(path / "trainer_state.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return json.loads((path / "state.json").read_text())
