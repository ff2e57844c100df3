"""Sharded students (``model.sharding: fsdp``): the trainer's student under FSDP2 across the ranks of the run.

``shard_student`` applies ``torch.distributed.fsdp.fully_shard`` to each decoder layer and then to the whole
model, before the optimizer is built, so parameters, gradients and AdamW's moments are all ``DTensor`` shards
(each rank holds ``1/N`` of them). What the rest of the trainer does with such a student:

* training step (``adwin.loop.step.optimize``): FSDP gathers each layer for its forward and reduce-scatters
  the gradients in the backward, summing them across ranks (no division by the world size: the loss is
  already normalised by the whole batch's count), so the DDP gradient all-reduce does not run;
  ``clip_grad_norm_`` reads the norm over every rank's shard;
* generation, evaluation and the audit run on the gathered weights (``adwin.backends.fsdp.full_weights``),
  the audit combining its shards of the probe batch exactly as under DDP (``adwin.audit.combine``);
* the teacher stays whole on every rank (docs/decisions.md, "Sharded students").

Which parameters train is not decided here: ``fully_shard`` shards whatever the model holds, and the
optimizer takes the parameters that require grad (``adwin.loop.parts.build_optimizer``). A LoRA student
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
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from adwin.audit.params import transformer_blocks
from adwin.backends.fsdp import RESHARD_LAYERS, RESHARD_ROOT, fsdp_modules, is_sharded
from adwin.config import TrainConfig
from adwin.loop.distributed import LocalDist
from adwin.sampling.lora import is_lora

log = logging.getLogger(__name__)


def precision_policy(cfg: TrainConfig) -> Any:
    """The ``MixedPrecisionPolicy`` that ``model.dtype`` and ``model.autocast`` ask for (module docstring)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.model.autocast == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.model.dtype != "float32":
        return MixedPrecisionPolicy(reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_student(model: torch.nn.Module, cfg: TrainConfig, dist: LocalDist) -> torch.nn.Module:
    """Shard ``model`` in place over the run's ranks when ``model.sharding`` is ``fsdp``; returns it.

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
