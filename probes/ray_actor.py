"""Ray probe workers: one actor per worker, each holding its own student replica.

``ray.init()`` starts a local cluster (``num_cpus`` CPUs, 2 by default) unless an address is given
(``--ray-address``). The model is shipped once through the object store when an actor starts; at step
boundaries the executor ``ray.put``s the new weights once and passes the reference with the next round
of each actor that is behind, so every actor loads each version at most once and only when it works.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from functools import cache
from typing import Any

import torch

from adwin.audit.job import AuditJob, AuditOutcome
from adwin.probes.pool import Extension
from adwin.probes.workers import RoundJob

log = logging.getLogger(__name__)


_started: dict[str, object] = {}  # how this process's Ray was started: a later run asking otherwise is told


def ensure_ray(address: str | None = None, num_cpus: int = 2) -> None:
    """Connect to ``address`` or start a local cluster, once per process. Ray cannot be restarted under a
    running process's actors, so a later call asking for another address or CPU count gets a warning naming
    the fields it cannot honour (a new process can)."""
    import ray

    if ray.is_initialized():
        asked = {"probes.ray_address": address, "probes.ray_num_cpus": None if address else num_cpus}
        differ = {k: v for k, v in asked.items() if k in _started and v is not None and _started[k] != v}
        if differ:
            log.warning("Ray is already running in this process (%s); %s not applied: start a new process to use "
                        "them", ", ".join(f"{k}={v}" for k, v in _started.items()),
                        ", ".join(f"{k}={v}" for k, v in differ.items()))
        return
    _started.clear()
    _started.update({"probes.ray_address": address} if address else {"probes.ray_num_cpus": num_cpus})
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)


@cache
def _actor_class() -> Any:
    import ray

    @ray.remote
    class ProbeActor:
        def __init__(self, model: torch.nn.Module, eos: list[int], pad_id: int, temperature: float,
                     top_p: float, compile: bool | str = False) -> None:
            from adwin.probes.extender import ModelExtender

            torch.set_num_threads(1)  # small models: one intra-op thread; the trainer needs the other core
            self.extender = ModelExtender(model.eval(), set(eos), pad_id, temperature, top_p, compile)  # type: ignore[arg-type]

        def extend(self, contexts: list[list[int]], budgets: list[int],
                   weights: dict[str, torch.Tensor] | None) -> Extension:
            if weights is not None:
                self.extender.load(weights)
            return self.extender(contexts, budgets)

        def audit(self, job: Any, weights: dict[str, torch.Tensor] | None) -> Any:
            from adwin.audit.job import run_audit_job

            if weights is not None:
                self.extender.load(weights)
            return run_audit_job(self.extender.model, job)

        def ping(self) -> bool:
            return True

    return ProbeActor


class RayWorker:
    """A ``ProbeWorker`` backed by one Ray actor; ``model_ref`` is the replica in the object store."""

    synchronous = False

    def __init__(self, model_ref: Any, eos: set[int], pad_id: int, temperature: float = 1.0,
                 top_p: float = 1.0, num_cpus: float = 1.0, compile: bool | str = False) -> None:
        self.actor = _actor_class().options(num_cpus=num_cpus, max_restarts=0).remote(
            model_ref, sorted(eos), pad_id, temperature, top_p, compile)

    def submit(self, job: RoundJob) -> Future[Extension]:
        return self.actor.extend.remote(job.contexts, job.budgets, job.weights).future()

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        # the weights travel as a top-level argument: Ray resolves an object reference only there
        return self.actor.audit.remote(dataclasses.replace(job, weights=None), job.weights).future()

    def alive(self) -> bool:
        import ray

        try:
            return bool(ray.get(self.actor.ping.remote(), timeout=30))
        except Exception:  # noqa: BLE001 - any failure to answer means the actor is gone for us
            return False

    def close(self) -> None:
        import ray

        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - already dead
            log.debug("ray actor already gone", exc_info=True)
