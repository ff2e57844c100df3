"""What every layer needs to know about an FSDP2-sharded student (``model.sharding: fsdp``, ``adwin.loop.fsdp``).

A sharded student holds, on each rank, a ``DTensor`` shard of every parameter; its forward all-gathers one
decoder layer at a time and its backward reduce-scatters the gradients (FSDP2, ``fully_shard``). Two kinds
of work must not run that way, because their number of forwards differs between ranks and FSDP's per-layer
collectives would then stop lining up: generation (each rank's rows stop at their own EOS) and the audit
(chunk and segment counts follow each rank's rows). Both run inside ``full_weights``: every FSDP module is
unsharded once on entry (one all-gather per module, called by every rank in the same order), forwards and
gradients inside see whole plain ``Parameter`` s and make no collective, and the shards are restored on exit
(docs/decisions.md, "Sharded students"). Outside a sharded run every helper here is the identity.

``RESHARD_LAYERS`` / ``RESHARD_ROOT`` are the ``reshard_after_forward`` values the student is sharded with
and ``full_weights`` puts back: decoder layers free their gathered weights after their forward, the root
(embeddings, final norm, head) keeps them, which its backward needs at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

RESHARD_LAYERS = True
RESHARD_ROOT = False
_DEPTH = "_adwin_full_weights_depth"  # nesting count on the FSDP root: only the outermost entry gathers
_MANAGED = "_is_fsdp_managed_module"


def fsdp_root(model: torch.nn.Module) -> Any | None:
    """The FSDP2 root of ``model`` (its first FSDP module in module order), or None when it is not sharded.

    ``model`` itself for a fully fine-tuned student; for a LoRA student, the transformers model inside the peft
    wrapper, which is what ``adwin.loop.fsdp.shard_student`` shards (peft's ``generate`` calls that model, not the
    wrapper, so the wrapper cannot be the root)."""
    from torch.distributed.fsdp import FSDPModule

    return next((m for m in model.modules() if isinstance(m, FSDPModule)), None)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds an FSDP2-sharded student (its parameters are DTensor shards)."""
    return fsdp_root(model) is not None


def fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """Every FSDP module of ``model``, root first (module order)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[None]:
    """Whole weights on every rank for the body (see the module docstring); nothing for an unsharded model.

    Every rank must enter and leave together. Re-entrant: an inner ``full_weights`` of the same model does
    nothing. Gradients taken inside (``torch.autograd.grad``) are of the whole parameters and are never
    reduce-scattered: nothing is written to ``.grad``, which FSDP would reduce.
    """
    root = fsdp_root(model)
    if root is None or getattr(root, _DEPTH, 0):
        yield
        return
    mods = fsdp_modules(root)
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
        m.set_reshard_after_backward(False, recurse=False)
    setattr(root, _DEPTH, 1)
    # transformers' generate reads this flag (set by fully_shard) on the model it runs on, the root (a LoRA
    # student's generate runs on it too), to step every rank in lock-step with an all-reduce per token
    # (synced_gpus); on whole weights no rank needs another, and a rank with no rows to decode
    # (adwin.decode.generate.generate returns before generate) would leave the others waiting
    managed = root.__dict__.get(_MANAGED)
    setattr(root, _MANAGED, False)
    try:
        yield
    finally:
        if managed is None:
            delattr(root, _MANAGED)
        else:
            setattr(root, _MANAGED, managed)
        setattr(root, _DEPTH, 0)
        for m in mods:
            m.set_reshard_after_forward(RESHARD_ROOT if m is root else RESHARD_LAYERS, recurse=False)
            m.set_reshard_after_backward(True, recurse=False)
            m.reshard()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (an all-gather: every rank calls it in the same order); else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
