"""Sharded students (``model.sharding: fsdp``): the student under FSDP2 across the ranks of the run, and what
every layer needs to know about one.

``shard_student`` applies ``torch.distributed.fsdp.fully_shard`` to each decoder layer and then to the whole
model, before the optimizer is built, so parameters, gradients and AdamW's moments are all ``DTensor`` shards
(each rank holds ``1/N`` of them). Its forward all-gathers one decoder layer at a time and its backward
reduce-scatters the gradients. What the rest of the trainer does with such a student:

* training step (``adwin.loop.step.optimize``): FSDP gathers each layer for its forward and reduce-scatters
  the gradients in the backward, summing them across ranks (no division by the world size: the loss is
  already normalised by the whole batch's count), so the DDP gradient all-reduce does not run;
  ``clip_grad_norm_`` reads the norm over every rank's shard;
* generation, evaluation and the audit run on the gathered weights (``full_weights``), the audit combining its
  shards of the probe batch exactly as under DDP (``adwin.audit.combine``);
* the teacher stays whole on every rank (docs/decisions.md, "Sharded students").

Why ``full_weights``: two kinds of work must not run sharded, because their number of forwards differs between
ranks and FSDP's per-layer collectives would then stop lining up: generation (each rank's rows stop at their
own EOS) and the audit (chunk and segment counts follow each rank's rows). Both run inside ``full_weights``:
every FSDP module is unsharded once on entry (one all-gather per module, called by every rank in the same
order), forwards and gradients inside see whole plain ``Parameter`` s and make no collective, and the shards
are restored on exit. Outside a sharded run every helper here is the identity.

Which parameters train is not decided here: ``fully_shard`` shards whatever the model holds, and the
optimizer takes the parameters that require grad (``adwin.student.optimizer.build_optimizer``). A LoRA student
(``model.lora``) is sharded the same way, adapters and frozen base weights together in each layer's unit:
FSDP2 shards every parameter on its own (a ``DTensor`` each, no flat buffer), all-gathers them all and
reduce-scatters only those that received a gradient, so a unit mixing frozen and trainable parameters needs
nothing uniform but the trainable ones' dtype (peft keeps the adapters in one dtype). Its root is the
transformers model inside the peft wrapper, not the wrapper: peft's ``generate`` calls that model directly,
and a forward that does not enter through the root would make a decoder layer FSDP's root instead
(docs/decisions.md, "Sharded students").

Precision (``MixedPrecisionPolicy``): ``model.autocast: bf16`` gathers the layers' weights in bfloat16
(``param_dtype``) and reduces gradients in float32 over float32 shards; ``model.dtype`` bfloat16/float16
keeps the weights in that dtype and reduces in float32; float32 without autocast casts nothing.

``RESHARD_LAYERS`` / ``RESHARD_ROOT`` are the ``reshard_after_forward`` values ``shard_student`` shards with:
decoder layers free their gathered weights after their forward, the root (embeddings, final norm, head) keeps
them, which its backward needs at once. ``full_weights`` puts back whatever settings it found, so a model
sharded by someone else (verl's FSDP2 actor, whose root reshards after forward) leaves as it came.

This module sits in the bottom layer, beside the engines, because the audit and the sampler need
``full_weights``; so it reads the run's config and ranks by what they hold (``cfg.model``, ``dist.world``)
without importing them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from adwin.student.structure import is_lora, transformer_blocks

log = logging.getLogger(__name__)

RESHARD_LAYERS = True
RESHARD_ROOT = False
_DEPTH = "_adwin_full_weights_depth"  # nesting count on the FSDP root: only the outermost entry gathers
_MANAGED = "_is_fsdp_managed_module"


def fsdp_root(model: torch.nn.Module) -> Any | None:
    """The FSDP2 root of ``model`` (its first FSDP module in module order), or None when it is not sharded.

    ``model`` itself for a fully fine-tuned student; for a LoRA student, the transformers model inside the peft
    wrapper, which is what ``shard_student`` shards (peft's ``generate`` calls that model, not the
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


def precision_policy(cfg: Any) -> Any:
    """The ``MixedPrecisionPolicy`` that ``model.dtype`` and ``model.autocast`` of ``cfg`` (a ``TrainConfig``) ask
    for (module docstring)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.model.autocast == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.model.dtype != "float32":
        return MixedPrecisionPolicy(reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_student(model: torch.nn.Module, cfg: Any, dist: Any) -> torch.nn.Module:
    """Shard ``model`` in place over the run's ranks (``dist.world``, a ``LocalDist`` or ``TorchDist``) when
    ``model.sharding`` of ``cfg`` (a ``TrainConfig``) is ``fsdp``; returns it.

    A world of one has nothing to shard: the student stays whole (its checkpoints still use the sharded
    format, ``adwin.runtime.sharded_checkpoint``). Sharding twice is a no-op.
    """
    if cfg.model.sharding != "fsdp" or dist.world == 1 or is_sharded(model):
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.world,))
    policy = precision_policy(cfg)
    root = model.get_base_model() if is_lora(model) else model  # type: ignore[operator]
    blocks = transformer_blocks(root)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=RESHARD_LAYERS)
    fully_shard(root, mesh=mesh, mp_policy=policy, reshard_after_forward=RESHARD_ROOT)
    for m in fsdp_modules(root):  # a plain sum across ranks: the loss carries the whole batch's normaliser
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    log.info("student sharded over %d ranks (FSDP2: %d decoder layers + the root%s)", dist.world, len(blocks),
             ", LoRA adapters with their frozen base" if root is not model else "")
    return model


@contextlib.contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[None]:
    """Whole weights on every rank for the body (see the module docstring); nothing for an unsharded model.

    Every rank must enter and leave together. Re-entrant: an inner ``full_weights`` of the same model does
    nothing. Gradients taken inside (``torch.autograd.grad``) are of the whole parameters and are never
    reduce-scattered: nothing is written to ``.grad``, which FSDP would reduce. Every FSDP module leaves with the
    resharding settings it came with (module docstring).
    """
    root = fsdp_root(model)
    if root is None or getattr(root, _DEPTH, 0):
        yield
        return
    mods = fsdp_modules(root)
    found = [_reshard_settings(m) for m in mods]  # put back on exit, whoever sharded the model and how
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
        for m, settings in zip(mods, found, strict=True):
            _restore_reshard_settings(m, settings)
            m.reshard()


def _reshard_settings(module: Any) -> tuple[Any, list[tuple[Any, bool]]]:
    """What ``full_weights`` changes on one FSDP module: per parameter group, where it reshards after forward
    (``post_forward_mesh_info``: None for no resharding, else the mesh, which an integer ``reshard_after_forward``
    makes a smaller one) and whether after backward, and the root's automatic choice, which
    ``set_reshard_after_forward`` switches off. FSDP2 has no public getter for them."""
    state = module._get_fsdp_state()
    groups = [(g.post_forward_mesh_info, g.reshard_after_backward) for g in state._fsdp_param_groups]
    return state._auto_reshard_after_forward, groups


def _restore_reshard_settings(module: Any, settings: tuple[Any, list[tuple[Any, bool]]]) -> None:
    auto, groups = settings
    state = module._get_fsdp_state()
    state._auto_reshard_after_forward = auto
    for g, (post_forward, after_backward) in zip(state._fsdp_param_groups, groups, strict=True):
        g.post_forward_mesh_info, g.reshard_after_backward = post_forward, after_backward


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (an all-gather: every rank calls it in the same order); else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
