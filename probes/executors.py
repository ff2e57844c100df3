"""``build_executor``: the probe executor for a backend (``inline`` | ``thread`` | ``ray``), one interface.

* ``inline``: rounds run in the trainer's thread on the trainer's model (every round blocks the step).
* ``thread``: ``workers`` background threads, each with its own replica (a deep copy of the student).
* ``rollout``: rounds ride the trainer's next rollout call (``adwin.probes.riding.RidingWorker``, built by the
  caller around its sampler and passed as ``rider``); forced rounds and audits run in the trainer's thread.
* ``ray``: ``workers`` Ray actors, each with its own replica shipped through the object store; weights
  are ``ray.put`` once per version. ``ray_address`` joins a cluster, else a local one with
  ``ray_num_cpus`` CPUs starts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from adwin.audit.job import AuditJob, AuditOutcome, run_audit_job
from adwin.decode.static_cache import CompileSetting, without_compiled
from adwin.probes.async_executor import AsyncProbeExecutor, FaultPolicy
from adwin.probes.extender import ModelExtender, snapshot_weights
from adwin.probes.pool import Extender, ProbePool
from adwin.probes.riding import RidingWorker
from adwin.probes.workers import InlineWorker, ProbeWorker, ThreadWorker

BACKENDS: tuple[str, ...] = ("inline", "thread", "ray", "rollout")


def build_executor(backend: str, pool: ProbePool, model: torch.nn.Module, *, eos: set[int], pad_id: int,
                   temperature: float = 1.0, top_p: float = 1.0, extend: Extender | None = None, workers: int = 1,
                   ray_address: str | None = None, ray_num_cpus: int = 2, fault_policy: FaultPolicy = "reissue",
                   max_reissues: int = 2, optimizer: torch.optim.Optimizer | None = None,
                   rider: RidingWorker | None = None, compile: CompileSetting = False) -> AsyncProbeExecutor:
    """An executor whose workers sample like ``ModelExtender(model, eos, pad_id, temperature, top_p)``
    and audit (``adwin.audit.job.run_audit_job``) on the same replica.

    ``extend`` overrides the inline backend's extender (the trainer's own sampler); ``model`` is the
    trainer's student, the source of every replica and weights snapshot; ``optimizer`` is the trainer's,
    which inline audits read directly (``metric="adam"``); ``rider``: the ``rollout`` backend's one worker;
    ``compile``: ``rollout.compile`` for every worker's extender (each resolves ``auto`` on its replica's device).
    """
    if backend not in BACKENDS:
        raise ValueError(f"probe backend must be one of {BACKENDS}, got {backend!r}")
    kw: dict[str, Any] = {"workers": workers, "fault_policy": fault_policy, "max_reissues": max_reissues}

    def audit_inline(job: AuditJob) -> AuditOutcome:
        return run_audit_job(model, job, optimizer)

    if backend == "inline":
        inline = extend or ModelExtender(model, eos, pad_id, temperature, top_p, compile)
        return AsyncProbeExecutor(pool, lambda: InlineWorker(inline, audit_inline), **{**kw, "workers": 1})
    if backend == "rollout":
        if rider is None:
            raise ValueError("probe backend 'rollout' rides a sampler's rollout calls: pass its RidingWorker as rider")
        return AsyncProbeExecutor(pool, lambda: rider, **{**kw, "workers": 1})  # alive() always: never respawned
    if backend == "thread":
        return AsyncProbeExecutor(pool, _thread_spawner(model, eos, pad_id, temperature, top_p, compile),
                                  snapshot=lambda: snapshot_weights(model, _param_device(model)), **kw)
    return _ray_executor(pool, model, eos, pad_id, temperature, top_p, ray_address, ray_num_cpus, kw, compile)


def _param_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _thread_spawner(model: torch.nn.Module, eos: set[int], pad_id: int, temperature: float,
                    top_p: float, compile: CompileSetting) -> Callable[[], ProbeWorker]:
    count = iter(range(1_000_000))

    def spawn() -> ProbeWorker:
        replica = without_compiled(copy.deepcopy(model)).eval()  # loads the published version before its first round
        ext = ModelExtender(replica, eos, pad_id, temperature, top_p, compile)
        return ThreadWorker(ext, ext.load, name=f"probe-worker-{next(count)}",
                            audit=lambda job: run_audit_job(replica, job))

    return spawn


def _ray_executor(pool: ProbePool, model: torch.nn.Module, eos: set[int], pad_id: int, temperature: float,
                  top_p: float, address: str | None, num_cpus: int, kw: dict[str, Any],
                  compile: CompileSetting) -> AsyncProbeExecutor:
    import ray

    from adwin.probes.ray_actor import RayWorker, ensure_ray

    ensure_ray(address, num_cpus)
    replica = without_compiled(copy.deepcopy(model)).to("cpu").eval()
    for p in replica.parameters():
        p.grad = None
    model_ref = ray.put(replica)  # shipped once; every (re)started actor starts from it

    def spawn() -> ProbeWorker:
        return RayWorker(model_ref, eos, pad_id, temperature, top_p, compile=compile)

    ex = AsyncProbeExecutor(pool, spawn, snapshot=lambda: ray.put(snapshot_weights(model)), **kw)
    # Wait for the actors to start here (seconds on a small machine), not in the first forced completion.
    ray.get([slot.worker.actor.ping.remote() for slot in ex.slots])  # type: ignore[attr-defined]
    return ex
