"""Compute precision of model forwards: ``model.autocast`` (off | bf16) as a context manager.

Math layer (the audit and the optimizer step both use it). ``bf16`` runs matmuls and the other
autocast-eligible ops in bfloat16 over float32 weights, with torch's own autocast on the device the
model lives on: CUDA, or CPU (torch supports bfloat16 autocast there too; it is slower than float32 on
CPUs without native bf16 instructions, but it lets a CPU run reproduce what a GPU run computes, and the
tests check it). Losses are computed outside the context, in float32 (``adwin.objectives.logprobs.upcast``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

AUTOCAST_MODES: tuple[str, ...] = ("off", "bf16")


@contextlib.contextmanager
def autocast(mode: str, device: torch.device | str) -> Iterator[None]:
    """bf16 autocast on ``device``'s type when ``mode == "bf16"``; nothing for ``off``."""
    if mode not in AUTOCAST_MODES:
        raise ValueError(f"model.autocast must be one of {AUTOCAST_MODES}, got {mode!r}")
    if mode == "off":
        yield
        return
    kind = torch.device(device).type
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"model.autocast: bf16 autocast runs on cuda or cpu, not on {kind!r}; set model.autocast: off")
    with torch.autocast(device_type=kind, dtype=torch.bfloat16):
        yield
