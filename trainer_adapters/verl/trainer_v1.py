"""verl's v1 trainer with adwin: ``AdwinPPOTrainerSync`` and its TaskRunner, ``AdwinTaskRunnerV1``.

verl 0.9.1's default trainer (``trainer.use_v1=true``, ``trainer.v1.trainer_mode=sync``: ``PPOTrainerSync``) moves
rows through TransferQueue: the trainer sends a batch of prompts to the agent-loop workers, which run each prompt's
sessions and store every finished one; a replay buffer hands the trainer a finished batch. adwin's additions, each at
a method of verl's trainer:

* ``init``: the config is checked (``support.check_verl_config``) before verl builds anything; after, the driver
  (``VerlWindowDriver``), as under the legacy trainer (``trainer.py``);
* ``_init_resource_pool_mgr``: the actor's worker class is ``AdwinActorRolloutRefWorker`` (its settings refused by
  field when it builds its model, its audit the worker method ``adwin_audit``);
* ``_submit_batch_to_rollout``: the driver's plan on the prompt batch: the window on every prompt, probe copies as
  extra sessions of their prompt (``rows_v1``); a refill of the same step (verl's failed groups) gets the window and
  no copies;
* ``_build_replay_buffer``: verl's replay buffer, whose sampled batch loses its probe copies (read from
  TransferQueue, reported to the controller, cleared there) and whose training rows are offered as complete probes;
* ``_update_actor``: after verl's update, a ready probe batch is audited in the actor and submitted; the
  ``window/*``, ``probe/*``, ``audit/*``, ``controller/*`` metrics join the step's.

``AdwinTaskRunnerV1`` is verl's ``TaskRunnerV1`` with this trainer for the ``sync`` mode (verl builds the trainer by
``get_trainer_cls(trainer.v1.trainer_mode)``, bound for the run in the TaskRunner's own process, as ``task_runner.py``
binds the legacy trainer). adwin's main (``python -m adwin.trainer_adapters.verl.main``) hands it to ``run_ppo``.
Not run here: it needs GPUs (docs/adapters.md, "verl").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import ray
import transfer_queue as tq
import verl.trainer.ppo.v1 as v1
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.utils import Role
from verl.utils import tensordict_utils as tu

from adwin.trainer_adapters.verl.driver import StepPlan, WorkerAuditor
from adwin.trainer_adapters.verl.rows_v1 import items_v1, lay_plan, planned_columns, session_rows, split_keys
from adwin.trainer_adapters.verl.settings import adwin_config
from adwin.trainer_adapters.verl.support import check_verl_config

log = logging.getLogger(__name__)
ACTOR_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef)
READ = ["prompts", "responses", "teacher_logprobs"]  # what the driver reads of a stored row


class ProbeSplittingBuffer:
    """verl's replay buffer whose sampled batches come without the probe copies (``AdwinPPOTrainerSync``)."""

    def __init__(self, inner: Any, trainer: AdwinPPOTrainerSync) -> None:
        self.inner, self.trainer = inner, trainer

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        batch, metrics = self.inner.sample(global_steps=global_steps, partition_id=partition_id,
                                           batch_size=batch_size)
        return self.trainer.adwin_collect(batch), metrics

    def __getattr__(self, name: str) -> Any:  # everything else is verl's buffer's
        return getattr(self.inner, name)


class AdwinPPOTrainerSync(v1.PPOTrainerSync):
    """See the module docstring."""

    def init(self) -> None:
        check_verl_config(self.config)
        section = OmegaConf.to_container(self.config.get("adwin"), resolve=True) if "adwin" in self.config else {}
        cfg = adwin_config(section)  # type: ignore[arg-type]
        self._probe_ids: dict[str, str] = {}
        self._plan: StepPlan | None = None
        self._collected: dict[str, float] = {}
        super().init()
        horizon = int(self.config.actor_rollout_ref.rollout.response_length)
        self._n = int(self.config.actor_rollout_ref.rollout.n)
        per_step = int(self.config.data.train_batch_size) * self._n
        self.adwin = cfg.driver(horizon, WorkerAuditor(self._adwin_audit), rollouts_per_step=per_step)
        log.info("adwin (verl v1 sync): run %s, horizon %d, candidates %s, a probe step every %d, controller %s",
                 self.adwin.run_id, horizon, cfg.candidates, cfg.probe_every, cfg.controller or "embedded")

    def _init_resource_pool_mgr(self) -> None:
        from adwin.trainer_adapters.verl.actor import AdwinActorRolloutRefWorker

        super()._init_resource_pool_mgr()
        for role in ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(AdwinActorRolloutRefWorker)

    def _build_replay_buffer(self) -> Any:
        return ProbeSplittingBuffer(super()._build_replay_buffer(), self)

    def _submit_batch_to_rollout(self, batch: Any) -> int:
        version = int(self.global_steps) - 1  # verl counts steps from 1: step t generates after t - 1 updates
        uids = [str(u) for u in batch["uid"]]
        if self._plan is None or self._plan.version != version:
            self._plan = self.adwin.plan(version, session_rows(uids, self._n))
            plan = self._plan
        else:  # a refill of this step's failed groups: the window, no more copies
            plan = StepPlan(version, self._plan.window, [], [])
        laid = lay_plan(plan, uids, self._n)
        self._probe_ids |= laid.probe_ids
        for key, values in planned_columns(plan, laid, uids, self._n).items():
            tu.assign_non_tensor_stack(batch, key, values)
        return super()._submit_batch_to_rollout(batch)

    def adwin_collect(self, batch: KVBatchMeta) -> KVBatchMeta:
        """A sampled batch: its probe copies reported, its training rows offered; the training rows returned."""
        version = int(self.global_steps) - 1
        fields = tq.kv_batch_get(keys=list(batch.keys), partition_id=batch.partition_id, select_fields=READ)
        plan = self._plan if self._plan is not None and self._plan.version == version else None
        window = self.adwin.max_len if plan is None else plan.window
        items = items_v1(fields, batch.keys, self._probe_ids, window, self.adwin.max_len, version)
        self._collected = ({} if plan is None else plan.metrics) | self.adwin.collect(version, items)
        train, probes = split_keys(batch.keys, self._probe_ids)
        if not probes:
            return batch
        copies = [batch.keys[i] for i in probes]
        tq.kv_clear(keys=copies, partition_id=batch.partition_id)
        for key in copies:
            self._probe_ids.pop(key.rsplit("_", 1)[0], None)
        return KVBatchMeta(partition_id=batch.partition_id, keys=[batch.keys[i] for i in train],
                           tags=[batch.tags[i] for i in train], fields=batch.fields, extra_info=batch.extra_info)

    def _adwin_audit(self, job: Any) -> Any:
        return self.actor_rollout_wg.adwin_audit(job)[0]  # ONE_TO_ALL: every rank's outcome, all the same

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        out = super()._update_actor(batch, metrics)
        step = int(self.global_steps)
        extra = self.adwin.after_update(step, last=step >= self.total_training_steps)
        extra |= self._collected | self.adwin.metrics()
        metrics.update(extra)
        self.adwin.on_step(step - 1, extra)
        return out


@contextlib.contextmanager
def _trainer_class(cls: type) -> Iterator[None]:
    """``get_trainer_cls`` answering ``cls`` for the ``sync`` mode (verl's ``TaskRunnerV1.run`` imports it from
    ``verl.trainer.ppo.v1`` when it runs)."""
    verls = v1.get_trainer_cls

    def pick(mode: str) -> type:
        return cls if mode == "sync" else verls(mode)

    v1.get_trainer_cls = pick
    try:
        yield
    finally:
        v1.get_trainer_cls = verls


class _AdwinTaskRunnerV1(TaskRunnerV1.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """See the module docstring (the plain class; ``AdwinTaskRunnerV1`` is its Ray actor class)."""

    def trainer_class(self) -> type:
        return AdwinPPOTrainerSync

    def run(self, config: Any) -> None:
        check_verl_config(config)  # in this process too: a config may reach run_ppo by another main
        with _trainer_class(self.trainer_class()):
            super().run(config)


AdwinTaskRunnerV1 = ray.remote(_AdwinTaskRunnerV1)
