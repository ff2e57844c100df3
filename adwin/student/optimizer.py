"""The optimizer over what trains: AdamW on ``trainable_parameters`` (a LoRA student: its adapters; a sharded
student: this rank's shards, so it is built after ``shard_student``) and its learning-rate schedule."""

from __future__ import annotations

import math
from typing import Any

import torch

from adwin.student.lora import trainable_parameters


def build_optimizer(cfg: Any, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with linear warmup, then a constant, cosine or linear decay to zero at ``cfg.steps``.

    ``cfg``: the run's ``TrainConfig``, read by what it holds (``cfg.optim``, ``cfg.steps``): this room sits below
    the config's layer, as ``adwin.student.fsdp`` does."""
    o = cfg.optim
    params = trainable_parameters(model)  # a LoRA student: its adapters
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / (o.warmup_steps + 1)
        frac = (step - o.warmup_steps) / max(1, cfg.steps - o.warmup_steps)
        if o.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))
        if o.schedule == "linear":
            return max(0.0, 1.0 - frac)
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
