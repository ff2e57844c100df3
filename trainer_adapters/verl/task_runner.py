"""``AdwinTaskRunner``: verl's ``TaskRunner`` building adwin's trainer and actor worker.

verl 0.9.1's route for a recipe that changes what the TaskRunner builds is a TaskRunner class handed to
``verl.trainer.main_ppo.run_ppo(config, task_runner_class=...)`` (its one-step-off and fully-async recipes launch
this way); adwin's main does that (``adwin.trainer_adapters.verl.main``). Two overrides:

* ``add_actor_rollout_worker``, the method verl's own recipes override: the actor role is
  ``AdwinActorRolloutRefWorker`` (verl's worker plus ``adwin_audit``);
* ``run``: verl's ``TaskRunner.run`` builds the trainer by its module-level name, ``main_ppo_v0.RayPPOTrainer``,
  and takes no trainer class, so that name is bound to ``AdwinRayPPOTrainer`` for the run. The TaskRunner is its own
  Ray actor process, started for this run: the binding is seen by nothing else.

Nothing is installed in other processes: the actor worker class travels to its Ray workers as verl's own does (Ray
imports it where the worker starts), and the agent loop reaches verl's agent-loop workers through verl's
``agent_loop_config_path``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ray
import verl.trainer.main_ppo_v0 as v0

from adwin.trainer_adapters.verl.support import check_verl_config


@contextlib.contextmanager
def _trainer_class(cls: type) -> Iterator[None]:
    verls = v0.RayPPOTrainer
    v0.RayPPOTrainer = cls
    try:
        yield
    finally:
        v0.RayPPOTrainer = verls


class _AdwinTaskRunner(v0.TaskRunner.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """See the module docstring (the plain class; ``AdwinTaskRunner`` is its Ray actor class)."""

    def add_actor_rollout_worker(self, config: Any) -> tuple[type, type]:
        from adwin.trainer_adapters.verl.actor import AdwinActorRolloutRefWorker

        verls, group_cls = super().add_actor_rollout_worker(config)
        roles = [role for role, remote in self.role_worker_mapping.items() if remote.__ray_actor_class__ is verls]
        for role in roles:
            self.role_worker_mapping[role] = ray.remote(AdwinActorRolloutRefWorker)
        return AdwinActorRolloutRefWorker, group_cls

    def trainer_class(self) -> type:
        from adwin.trainer_adapters.verl.trainer import AdwinRayPPOTrainer

        return AdwinRayPPOTrainer

    def run(self, config: Any) -> None:
        check_verl_config(config)  # in this process too: a config may reach run_ppo by another main
        with _trainer_class(self.trainer_class()):
            super().run(config)


AdwinTaskRunner = ray.remote(_AdwinTaskRunner)
