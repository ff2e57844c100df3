"""The audit where the student's gradients are: a worker method on verl's actor.

``AdwinActorRolloutRefWorker`` is verl's ``ActorRolloutRefWorker`` plus one method, ``adwin_audit(job)``, registered
``ONE_TO_ALL``: every rank of the actor's worker group receives the whole probe batch, differentiates its contiguous
shard of the rows under verl's distillation loss (``adwin.trainer_adapters.verl.loss``) and the segment gradients
are summed over the actor's data-parallel group before the Gram, as in adwin's own data-parallel audit
(``adwin.audit.combine``). Every rank returns the same outcome; the driver takes rank 0's and reports it.

The computation is adwin's (``adwin.audit.job.run_audit_job`` → ``adwin.audit.alignment.audit``): one
implementation, with verl's loss as its per-token loss and the DP group as its combiner. An FSDP2 actor
(``actor.strategy=fsdp2``) is audited on gathered weights (``adwin.student.fsdp.full_weights``); settings it
cannot differentiate (FSDP1, other engines, fused kernels, a tempered rollout, Ulysses sequence parallelism, no
distillation) are refused by name when the worker builds its model (``adwin.trainer_adapters.verl.support``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.fsdp_utils import fsdp_version
from verl.workers.engine_workers import ActorRolloutRefWorker

from adwin.audit.combine import Combiner
from adwin.audit.job import AuditJob, AuditOutcome, run_audit_job
from adwin.loop.distributed import Dist, LocalDist
from adwin.trainer_adapters.verl.loss import verl_token_loss
from adwin.trainer_adapters.verl.support import check_actor_rollout_ref, check_distillation


class UnsupportedActorEngine(ValueError):
    """An actor module the audit cannot differentiate (FSDP1 flat parameters), found on the module itself."""


@dataclasses.dataclass(frozen=True)
class GroupDist(Dist):
    """``Dist`` over one process group (verl's actor data-parallel group), not the default one."""

    group: Any = None

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        dev = self._device()
        tmp = t if t.device == dev else t.to(dev)
        dist.all_reduce(tmp, op=dist.ReduceOp.SUM, group=self.group)
        return tmp if tmp is t else t.copy_(tmp)

    def all_max(self, value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _device(self) -> torch.device:
        return collective_device(str(dist.get_backend(self.group)))


def collective_device(backend: str) -> torch.device:
    """Where a group's collectives should run: on the GPU when the backend serves CUDA tensors with NCCL (``nccl``,
    or a per-device backend such as verl's ``cpu:gloo,cuda:nccl``), else on the CPU. The audit's segment gradients
    are (K + 1) x the parameter count: through gloo they would cross host memory."""
    entries = {part.partition(":")[0]: part.partition(":")[2] for part in backend.split(",") if ":" in part}
    cuda = backend == "nccl" or entries.get("cuda") == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def dp_combiner(rank: int, world: int, group: Any = None) -> Combiner | None:
    """The audit's combiner over a data-parallel group of ``world`` ranks (None for one rank)."""
    return None if world <= 1 else GroupDist(rank=rank, world=world, local_rank=0, group=group)


def audit_in_actor(module: torch.nn.Module, job: AuditJob, distillation_config: Any, *,
                   combine: Combiner | LocalDist | None = None, optimizer: Any = None) -> AuditOutcome:
    """adwin's audit of ``job`` on ``module`` under verl's distillation loss, summed over ``combine``'s ranks."""
    if fsdp_version(module) == 1:
        raise UnsupportedActorEngine("the audit differentiates per parameter; FSDP1 flattens them: use "
                                     "actor_rollout_ref.actor.strategy=fsdp2")
    extra = dict(job.settings.extra) | {"loss": verl_token_loss(distillation_config)}
    if combine is not None and combine.world > 1:
        extra["combine"] = combine
    job = dataclasses.replace(job, settings=dataclasses.replace(job.settings, extra=extra))
    return run_audit_job(module, job, optimizer)


class AdwinActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid actor worker with ``adwin_audit``; choose it as the actor's worker class (docs/adapters.md)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        if self._is_actor:  # refused before verl builds anything, naming the field
            check_distillation(self.distillation_config)
            check_actor_rollout_ref(self.config)
        super().init_model()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def adwin_audit(self, job: AuditJob) -> AuditOutcome:
        engine = self.actor.engine
        combine = dp_combiner(engine.get_data_parallel_rank(), engine.get_data_parallel_size(),
                              engine.get_data_parallel_group())
        config = omega_conf_to_dataclass(self.distillation_config)
        with engine.eval_mode():  # loads offloaded parameters; the audit restores the module's mode itself
            return audit_in_actor(engine.module, job, config, combine=combine, optimizer=engine.optimizer)
