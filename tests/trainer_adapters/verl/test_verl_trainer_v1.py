"""adwin inside verl's v1 trainer, as far as it runs without GPUs: adwin's TaskRunner builds adwin's trainer for the
``sync`` mode, the trainer gives the actor role adwin's worker, lays the driver's plan on the prompt batch verl
sends to its agent-loop workers, and takes the probe copies out of the batch verl's replay buffer samples.

Where this stops on CPU: verl's resource pools, worker groups, vLLM servers and TransferQueue's storage need Ray
and GPUs. Verl's sending (``PPOTrainer._submit_batch_to_rollout``) is recorded instead, and TransferQueue's
``kv_batch_get`` / ``kv_clear`` answer from a dict of rows laid out as verl's agent-loop worker stores them."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl.protocol")  # not "verl": without verl, this folder is a namespace package "verl"
pytest.importorskip("transfer_queue")  # verl's v1 trainer imports it (verl[vllm] installs it)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl_recipe import verl_config  # noqa: E402

from adwin.trainer_adapters.verl.fields import MAX_TOKENS, SESSIONS  # noqa: E402
from adwin.trainer_adapters.verl.rows_v1 import ROLLOUT_N  # noqa: E402

N, HORIZON = 2, 16


def test_the_task_runner_builds_adwins_trainer_for_the_sync_mode_and_leaves_verls_registry_as_it_was(monkeypatch):
    import verl.trainer.ppo.v1 as v1
    from verl.trainer.main_ppo import TaskRunnerV1

    from adwin.trainer_adapters.verl.trainer_v1 import AdwinPPOTrainerSync, AdwinTaskRunnerV1

    built = []
    monkeypatch.setattr(TaskRunnerV1.__ray_actor_class__, "run",
                        lambda self, config: built.append(v1.get_trainer_cls(config.trainer.v1.trainer_mode)))
    verls = v1.get_trainer_cls
    AdwinTaskRunnerV1.__ray_actor_class__().run(verl_config())
    assert built == [AdwinPPOTrainerSync] and v1.get_trainer_cls is verls
    assert verls("sync") is v1.PPOTrainerSync


def test_the_trainer_gives_the_actor_role_adwins_worker():
    from verl.trainer.ppo.utils import Role

    from adwin.trainer_adapters.verl.actor import AdwinActorRolloutRefWorker
    from adwin.trainer_adapters.verl.trainer_v1 import AdwinPPOTrainerSync

    trainer = object.__new__(AdwinPPOTrainerSync)
    trainer.config = verl_config()
    trainer._init_resource_pool_mgr()
    actor = [r for r in (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef) if r in trainer.role_worker_mapping]
    assert actor and all(trainer.role_worker_mapping[r].__ray_actor_class__ is AdwinActorRolloutRefWorker
                         for r in actor)


def _trainer(monkeypatch: Any, sent: list[Any]) -> Any:
    """adwin's v1 trainer past ``init`` (its driver on the embedded controller), verl's sending recorded."""
    from verl.trainer.ppo.v1 import PPOTrainer

    from adwin.trainer_adapters.verl.driver import WorkerAuditor
    from adwin.trainer_adapters.verl.settings import adwin_config
    from adwin.trainer_adapters.verl.trainer_v1 import AdwinPPOTrainerSync

    monkeypatch.setattr(PPOTrainer, "_submit_batch_to_rollout", lambda self, batch: sent.append(batch) or len(batch))
    trainer = object.__new__(AdwinPPOTrainerSync)
    trainer._probe_ids, trainer._plan, trainer._collected, trainer._n = {}, None, {}, N
    trainer.global_steps = 1
    cfg = adwin_config({"candidates": [4, 8], "probe_batch_size": 2, "offers_per_step": 2, "probe_every": 1})
    trainer.adwin = cfg.driver(HORIZON, WorkerAuditor(lambda job: None), rollouts_per_step=3 * N)
    return trainer


def _prompts(uids: list[str]) -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict({"uid": np.array(uids, dtype=object), "index": torch.arange(len(uids))})


def test_the_prompt_batch_carries_the_window_and_its_probe_copies_as_extra_sessions(monkeypatch):
    sent: list[Any] = []
    trainer = _trainer(monkeypatch, sent)
    trainer._submit_batch_to_rollout(_prompts(["a", "b", "c"]))
    (batch,) = sent
    sessions = [int(s) for s in batch[ROLLOUT_N]]
    window = trainer.adwin.last_window
    assert window < HORIZON and [int(w) for w in batch[MAX_TOKENS]] == [window] * 3
    assert [int(s) for s in batch[SESSIONS]] == [N] * 3
    assert sum(sessions) - 3 * N == 2 == len(trainer._probe_ids)  # offers_per_step copies, one per prompt (spread)
    assert sorted(sessions) == [N, N + 1, N + 1]
    # a refill of the same step (verl's failed groups): the window, no more copies
    trainer._submit_batch_to_rollout(_prompts(["d"]))
    assert [int(s) for s in sent[1][ROLLOUT_N]] == [N] and len(trainer._probe_ids) == 2


class StoredRows:
    """TransferQueue's ``kv_batch_get`` and ``kv_clear`` over rows stored as verl's agent-loop worker stores them:
    unpadded, variable-length columns nested."""

    def __init__(self, rows: dict[str, dict[str, torch.Tensor]]) -> None:
        self.rows, self.cleared = rows, []

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> dict[str, Any]:
        out = {}
        for name in select_fields:
            column = [self.rows[k][name] for k in keys]
            out[name] = torch.nested.as_nested_tensor(column, layout=torch.jagged) if column[0].dim() == 1 else column
        return out

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        self.cleared += list(keys)


def test_the_sampled_batch_loses_its_probe_copies_which_the_controller_receives(monkeypatch):
    from transfer_queue import KVBatchMeta

    import adwin.trainer_adapters.verl.trainer_v1 as trainer_v1

    sent: list[Any] = []
    trainer = _trainer(monkeypatch, sent)
    trainer._submit_batch_to_rollout(_prompts(["a", "b", "c"]))
    window = trainer.adwin.last_window
    copies = sorted(trainer._probe_ids)  # "{uid}_{session}" of each copy
    keys, rows = [], {}
    for uid in "abc":
        for s in range(N):
            keys.append(f"{uid}_{s}_0")
            rows[keys[-1]] = {"prompts": torch.tensor([5, 6]), "responses": torch.arange(7, 7 + window),
                              "teacher_logprobs": -torch.ones(2 + window, 1)}
    for copy in copies:
        keys.append(f"{copy}_0")
        rows[keys[-1]] = {"prompts": torch.tensor([5, 6]), "responses": torch.arange(7, 7 + HORIZON),
                          "teacher_logprobs": -torch.ones(2 + HORIZON, 1)}
    store = StoredRows(rows)
    monkeypatch.setattr(trainer_v1, "tq", store)
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{"status": "success"} for _ in keys])
    out = trainer.adwin_collect(batch)
    assert out.keys == keys[: 3 * N] and len(out.tags) == 3 * N
    assert store.cleared == [f"{c}_0" for c in copies] and trainer._probe_ids == {}
    assert trainer._collected["probe/copies"] == 2.0
    assert trainer.adwin.hooks.client.counts["completed"] >= 2
