"""Probe batches, verl distillation configs and the 2-rank gloo worker of the actor-audit tests (the worker must
live in an importable module for ``torch.multiprocessing.spawn``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from adwin.audit.alignment import ProbeBatch
from adwin.audit.job import AuditJob, AuditSettings

CANDIDATES = [4, 8]
PROMPT, HORIZON = 3, 16
LENGTHS = [16, 12, 9, 16]  # probe rows at the horizon and two that ended (EOS) before it


def probe_batch(seed: int = 0) -> ProbeBatch:
    """Right-padded probe rows of a tiny Llama's vocabulary, teacher logprobs on the response columns."""
    g = torch.Generator().manual_seed(seed)
    b, width = len(LENGTHS), PROMPT + HORIZON
    ids = torch.randint(3, 64, (b, width), generator=g)
    am = torch.zeros(b, width, dtype=torch.long)
    rm = torch.zeros(b, width, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        am[i, : PROMPT + n] = 1
        rm[i, PROMPT : PROMPT + n] = 1
    ids = ids * am  # pad id 0
    teacher = -torch.rand(b, width, generator=g).mul(3.0) * rm  # (B, L) log q, 0 off the response
    return ProbeBatch(ids, am, rm, teacher)


def job(method: str = "fast", seed: int = 0) -> AuditJob:
    return AuditJob(0, 0, probe_batch(seed), AuditSettings(list(CANDIDATES), method=method))


def distillation_config(loss_mode: str = "k1", policy_gradient: bool = True, clamp: float | None = 10.0) -> Any:
    """verl's ``DistillationConfig`` of an on-policy distillation run (teachers off: the loss section is what counts)."""
    from verl.workers.config import DistillationConfig, DistillationLossConfig

    loss = DistillationLossConfig(loss_mode=loss_mode, use_policy_gradient=policy_gradient, use_task_rewards=False,
                                  loss_max_clamp=clamp)
    return DistillationConfig(enabled=False, distillation_loss=loss)


def dp_audit_worker(rank: int, world: int, port: int, out: str) -> None:
    """One data-parallel rank of verl's actor: the audit of the probe batch under verl's k1 loss, the rows split
    over the ranks and the segment gradients summed over the group. Rank 0 writes its result to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from tiny_models import make_tiny_llama

    from adwin.trainer_adapters.verl.actor import audit_in_actor, dp_combiner

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        combine = dp_combiner(rank, world, dist.group.WORLD)
        res = audit_in_actor(make_tiny_llama(seed=0), job(), distillation_config(), combine=combine).result
        if rank == 0:
            Path(out).write_text(json.dumps({"cos": res.cosines, "gram": res.gram.tolist(),
                                             "tokens": res.tokens_per_segment}))
    finally:
        dist.destroy_process_group()
