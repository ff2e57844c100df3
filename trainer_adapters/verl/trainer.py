"""verl's synchronous PPO trainer with adwin: ``AdwinRayPPOTrainer``.

verl 0.9.1's DataProto trainer (``verl.trainer.ppo.ray_trainer.RayPPOTrainer``, ``trainer.use_v1=false``) with two
additions, each at a method verl's own recipes override:

* ``init_workers``: before verl builds its workers, the config is checked (``support.check_verl_config``: an
  unsupported setting is refused by name); after verl built them, the driver (``VerlWindowDriver``: the controller named by the
  config's ``adwin`` section, embedded or remote) and the rollout wrapper (``AdwinRolloutManager``) around verl's
  agent-loop manager; the actor's audit call is the worker method ``adwin_audit`` (``actor.py``);
* ``_update_actor``: after verl's update, a ready probe batch is audited in the actor and submitted, and the
  ``window/*``, ``probe/*``, ``audit/*``, ``controller/*`` metrics join the step's.

``AdwinTaskRunner`` (``task_runner.py``) builds it, under adwin's main (``python -m
adwin.trainer_adapters.verl.main``, docs/adapters.md). Not run here: it needs GPUs
(``trainer_adapters/verl/gpu_recipe.sh``, not yet run).
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from adwin.trainer_adapters.verl.driver import WorkerAuditor
from adwin.trainer_adapters.verl.rollout import AdwinRolloutManager
from adwin.trainer_adapters.verl.settings import adwin_config
from adwin.trainer_adapters.verl.support import check_verl_config

log = logging.getLogger(__name__)


class AdwinRayPPOTrainer(RayPPOTrainer):
    """See the module docstring."""

    def init_workers(self) -> None:
        check_verl_config(self.config)
        section = OmegaConf.to_container(self.config.get("adwin"), resolve=True) if "adwin" in self.config else {}
        cfg = adwin_config(section)  # type: ignore[arg-type]
        super().init_workers()
        horizon = int(self.config.actor_rollout_ref.rollout.response_length)
        per_step = int(self.config.data.train_batch_size) * int(self.config.actor_rollout_ref.rollout.n)
        self.adwin = cfg.driver(horizon, WorkerAuditor(self._adwin_audit), rollouts_per_step=per_step)
        log.info("adwin: run %s, horizon %d, candidates %s, a probe step every %d, controller %s", self.adwin.run_id,
                 horizon, cfg.candidates, cfg.probe_every, cfg.controller or "embedded")
        # verl counts steps from 1; the learner version of step t's generation is t - 1 updates
        self.async_rollout_manager = AdwinRolloutManager(self.async_rollout_manager, self.adwin,
                                                         lambda: self.global_steps - 1)

    def _adwin_audit(self, job: Any) -> Any:
        return self.actor_rollout_wg.adwin_audit(job)[0]  # ONE_TO_ALL: every rank's outcome, all the same

    def _update_actor(self, batch: Any) -> Any:
        out = super()._update_actor(batch)
        metrics = self.adwin.after_update(self.global_steps, last=self.global_steps >= self.total_training_steps)
        metrics |= self.async_rollout_manager.last_metrics | self.adwin.metrics()
        out.meta_info["metrics"].update(metrics)
        self.adwin.on_step(self.global_steps - 1, metrics)
        return out

