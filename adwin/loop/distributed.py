"""Data-parallel plumbing for the synchronous trainer: ``Dist`` (rank, world, collectives) and its setup.

A run started by ``torchrun`` (``adwin train --nproc N`` launches one) finds ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK`` in its environment and joins the process group: gloo when ``model.device`` is ``cpu``,
NCCL on CUDA (each rank on ``cuda:LOCAL_RANK``). Anything else runs as one process with ``LocalDist``,
whose collectives are identities, so the single-process path does exactly what it did before.

``Dist`` implements the gradient ``Reducer`` of ``adwin.loop.learner.learner_step`` (``all_sum``) and what the
audit's cross-rank combine needs (``adwin.audit.combine.Combiner``: ``shard``, ``all_sum``,
``all_gather_object``). Every collective must be called by every rank in the same order: the trainer's
bookkeeping is replicated (docs/decisions.md, "Data-parallel training").
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class LocalDist:
    """One process: rank 0 of a world of 1; every collective is the identity."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` rows (the first ``n % world`` ranks get one more)."""
        base, extra = divmod(n, self.world)
        lo = self.rank * base + min(self.rank, extra)
        return slice(lo, lo + base + int(self.rank < extra))

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_max(self, value: float) -> float:
        return value

    def broadcast_object(self, obj: T) -> T:
        return obj

    def all_gather_object(self, obj: T) -> list[T]:
        return [obj]

    def barrier(self) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Dist(LocalDist):
    """A rank of a ``torch.distributed`` process group (initialised by ``init_distributed``)."""

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (and returned): every rank ends with the same tensor. A tensor off the
        backend's device (a CPU count under NCCL) travels through a copy on it."""
        import torch.distributed as dist

        dev = self._device()
        if t.device == dev:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            return t
        tmp = t.to(dev)
        dist.all_reduce(tmp, op=dist.ReduceOp.SUM)
        return t.copy_(tmp)

    def all_max(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (other ranks' argument is ignored)."""
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, device=self._device())
        return box[0]  # type: ignore[return-value]

    def all_gather_object(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
            # FSDP's device mesh and gloo's pending work objects keep the group alive through reference cycles;
            # freed at interpreter exit, gloo's threads can abort the process (SIGABRT) after a clean run
            gc.collect()

    def _device(self) -> torch.device:
        import torch.distributed as dist

        return torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def launched_world(env: Mapping[str, str] | None = None) -> int:
    """The world size ``torchrun`` gave this process (1 when not launched by it)."""
    env = os.environ if env is None else env
    return int(env.get("WORLD_SIZE", "1"))


def init_distributed(device: str, env: Mapping[str, str] | None = None) -> tuple[LocalDist, str]:
    """Join the process group ``torchrun`` set up, if any; returns the ``Dist`` and the rank's device.

    gloo for ``cpu``, NCCL for ``cuda`` (the rank's device becomes ``cuda:LOCAL_RANK``; a config naming a
    CUDA index is refused: each rank picks its own).
    """
    env = os.environ if env is None else env
    world = launched_world(env)
    if world <= 1:
        return LocalDist(), device
    import torch.distributed as dist

    rank, local = int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"]))
    if device == "cpu":
        backend = "gloo"
    elif device == "cuda":
        backend, device = "nccl", f"cuda:{local}"
        torch.cuda.set_device(local)
    else:
        raise ValueError(f"model.device: data-parallel runs take 'cpu' (gloo) or 'cuda' (NCCL, each rank on "
                         f"cuda:LOCAL_RANK), got {device!r}")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    log.info("data-parallel rank %d of %d (%s, %s)", rank, world, backend, device)
    return Dist(rank=rank, world=world, local_rank=local), device


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a local rendezvous."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
