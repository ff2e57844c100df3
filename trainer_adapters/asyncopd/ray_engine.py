"""Rollout engines in Ray actors: ``asyncopd.workers: ray``.

The scheduler's ``RolloutWorker`` threads stay on the driver (they own continuous batching, keep-mode
and the sync acknowledgement); each worker's ``StreamingEngine`` is a proxy whose model snapshot lives in
its own Ray actor. ``step`` ships the active requests (prompt + generated tokens; the per-token caches
stay on the driver) and returns the actor's ``TokenOut`` list; ``load_weights`` puts the learner's
weights into the object store once per sync and every actor loads them from there. A Ray actor runs
one method at a time, so a weight load never interleaves with a decoding step (keep-mode holds).

Ray is imported lazily: the CPU install never needs it. ``address=None`` starts a local Ray instance
(``num_cpus`` = number of workers) unless one is already running in this process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("asyncopd.workers: ray needs Ray: pip install 'adwin[ray]'") from e
    return ray


class _EngineHost:
    """Actor body: one engine (its own student snapshot) per actor."""

    def __init__(self, engine_cls: type, model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
        torch.set_num_threads(1)  # one actor per CPU: intra-op threads would oversubscribe
        self.engine = engine_cls(model, **kwargs)

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> int:
        self.engine.load_weights(weights, version)
        return version

    def step(self, items: Sequence[StreamItem]) -> list[TokenOut | None]:
        return self.engine.step(items)

    def fingerprint(self) -> tuple[int, float]:
        """(version, sum of all parameters): lets a driver check which weights an actor holds."""
        with torch.no_grad():
            return self.engine.version, float(sum(p.double().sum() for p in self.engine.model.parameters()))


def _light(item: StreamItem) -> StreamItem:
    """The request without its per-token caches: what decoding needs is the prompt and the tokens."""
    return dataclasses.replace(item, logprobs=[], token_versions=[], mc_actions=[], mc_logprobs=[],
                               teacher_logprobs=None, teacher_mc_logprobs=None, extra={})


class RayRolloutEngine:
    """``StreamingEngine`` proxy for an engine running in a Ray actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.version = 0

    def load_weights(self, weights: Any, version: int) -> None:
        ray = _import_ray()
        ray.get(self.actor.load_weights.remote(weights, version))  # weights: an ObjectRef or a dict
        self.version = version

    def step(self, items: Sequence[StreamItem]) -> list[TokenOut | None]:
        ray = _import_ray()
        return ray.get(self.actor.step.remote([_light(it) for it in items]))


class _SharedWeights:
    """Puts one weights dict into the object store once, whichever proxy asks first."""

    def __init__(self) -> None:
        self._weights: Any = None
        self._ref: Any = None

    def ref(self, weights: Any) -> Any:
        # identity of the object itself, held alive: an ``id()`` key is reused once the previous sync's dict
        # is freed, and the actors were then handed the previous weights under the new version
        ray = _import_ray()
        if self._weights is not weights:
            self._weights, self._ref = weights, ray.put(weights)
        return self._ref


class _SharingEngine(RayRolloutEngine):
    def __init__(self, actor: Any, shared: _SharedWeights) -> None:
        super().__init__(actor)
        self.shared = shared

    def load_weights(self, weights: Any, version: int) -> None:
        super().load_weights(self.shared.ref(weights), version)


def ray_engines(student: torch.nn.Module, n: int, engine_kw: dict[str, Any], *, seed: int,
                address: str | None = None, engine_cls: type | None = None,
                num_cpus_per_actor: float = 1.0) -> tuple[list[RayRolloutEngine], Callable[[], None]]:
    """``n`` engine proxies, each backed by an actor holding a copy of ``student``; and a close callback
    that kills the actors (and shuts down Ray when this call started it)."""
    from adwin.trainer_adapters.asyncopd.engine import HFRolloutEngine

    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=max(1, int(n * num_cpus_per_actor)), include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False)
        started = True
    host = ray.remote(num_cpus=num_cpus_per_actor)(_EngineHost)
    cls = engine_cls or HFRolloutEngine
    model_ref = ray.put(student)
    actors = [host.remote(cls, model_ref, {**engine_kw, "seed": seed + 1000 * i}) for i in range(n)]
    shared = _SharedWeights()
    engines: list[RayRolloutEngine] = [_SharingEngine(a, shared) for a in actors]

    def close() -> None:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()

    return engines, close
