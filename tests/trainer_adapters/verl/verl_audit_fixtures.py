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


def reshard_state(model: torch.nn.Module) -> list[list[Any]]:
    """Each FSDP2 module's resharding settings, read from FSDP's own state: per parameter group whether it
    reshards after forward (and onto how many ranks) and after backward, and the automatic root choice."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            groups = [[None if g.post_forward_mesh_info is None else g.post_forward_mesh_info.shard_mesh_size,
                       g.reshard_after_backward] for g in state._fsdp_param_groups]
            out.append([state._auto_reshard_after_forward, groups])
    return out


def fsdp2_actor_audit_worker(rank: int, port: int, out: str) -> None:
    """verl's FSDP2 actor on one gloo rank (its own ``apply_fsdp2``, ``reshard_after_forward`` as verl's engine
    passes it): the settings before and after ``audit_in_actor``, whether the root's weights stay gathered after a
    forward that follows the audit, and the audit's cosines."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.set_num_threads(1)
    import torch.distributed as dist
    from tiny_models import make_tiny_llama
    from torch.distributed.device_mesh import init_device_mesh
    from verl.utils.fsdp_utils import apply_fsdp2

    from adwin.trainer_adapters.verl.actor import audit_in_actor

    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = make_tiny_llama(seed=0)
        apply_fsdp2(model, {"mesh": init_device_mesh("cpu", (1,)), "reshard_after_forward": True}, {})
        ids = job().batch.input_ids[:1]
        model(ids)  # FSDP's lazy init, as verl's first step does
        before = reshard_state(model)
        res = audit_in_actor(model, job(), distillation_config()).result
        after = reshard_state(model)
        model(ids)
        root = model._get_fsdp_state()._fsdp_param_groups[0]
        Path(out).write_text(json.dumps({"before": before, "after": after, "cos": res.cosines,
                                         "root_gathered_after_forward": root.is_unsharded}))
    finally:
        dist.destroy_process_group()
