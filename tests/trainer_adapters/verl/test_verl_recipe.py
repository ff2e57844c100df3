"""The recipe users run (``trainer_adapters/verl/gpu_recipe.sh``) against verl 0.9.1's own checks: its overrides on
verl's Hydra config pass verl's ``validate_config`` as verl's main calls it, and adwin's own checks refuse, by field,
each setting the adapter cannot run under, where verl's processes start (the trainer before it builds workers, the
actor worker before it builds its model, the agent loop when verl builds it).

Where this stops on CPU: after ``validate_config`` verl's main starts Ray and a ``TaskRunner`` that places workers on
GPUs; that part runs only on a GPU machine (the recipe itself)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl.protocol")  # not "verl": without verl, this folder is a namespace package "verl"

from verl_recipe import recipe_argv, verl_config  # noqa: E402

from adwin.trainer_adapters.verl.support import UnsupportedVerlSetting, check_verl_config  # noqa: E402

REFUSED = [
    (["trainer.use_v1=true"], "trainer.use_v1"),
    (["distillation.enabled=false"], "distillation.enabled"),
    (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy"),  # FSDP1, verl's default
    (["actor_rollout_ref.actor.strategy=megatron"], "actor_rollout_ref.actor.strategy"),
    (["actor_rollout_ref.actor.strategy=veomni"], "actor_rollout_ref.actor.strategy"),
    (["actor_rollout_ref.model.use_fused_kernels=true"], "actor_rollout_ref.model.use_fused_kernels"),
    (["actor_rollout_ref.rollout.temperature=0.7"], "actor_rollout_ref.rollout.temperature"),
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
]
WORKER_REFUSED = [(o, f) for o, f in REFUSED if f.startswith(("actor_rollout_ref.", "distillation."))]


def test_the_recipe_launches_verls_main():
    assert recipe_argv()[:2] == ("-m", "verl.trainer.main_ppo")


def test_the_recipe_passes_verls_own_validate_config():
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    config = verl_config()
    auto_set_device(config)  # as verl's main, before its checks
    assert not need_critic(config)  # distillation trains no critic: verl's default estimator (gae) would build one
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    check_verl_config(config)  # and adwin's own


@pytest.mark.parametrize(("overrides", "field"), REFUSED)
def test_an_unsupported_setting_is_refused_naming_its_field(overrides, field):
    with pytest.raises(UnsupportedVerlSetting) as e:
        check_verl_config(verl_config(*overrides))
    assert e.value.field == field


@pytest.mark.parametrize(("overrides", "field"), REFUSED)
def test_the_trainer_refuses_before_verl_builds_its_workers(monkeypatch, overrides, field):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from adwin.trainer_adapters.verl.trainer import AdwinRayPPOTrainer

    built = []
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: built.append(self))
    trainer = object.__new__(AdwinRayPPOTrainer)
    trainer.config = verl_config(*overrides)
    with pytest.raises(UnsupportedVerlSetting) as e:
        trainer.init_workers()
    assert e.value.field == field and built == []


def _actor_worker(config):
    from adwin.trainer_adapters.verl.actor import AdwinActorRolloutRefWorker

    w = object.__new__(AdwinActorRolloutRefWorker)  # the attributes verl's __init__ sets, without Ray
    w.config, w.distillation_config, w.role, w._is_actor = (config.actor_rollout_ref, config.distillation,
                                                            "actor_rollout", True)
    return w


@pytest.mark.parametrize(("overrides", "field"), WORKER_REFUSED)
def test_the_actor_worker_refuses_before_verl_builds_its_model(monkeypatch, overrides, field):
    from verl.workers.engine_workers import ActorRolloutRefWorker

    built = []
    monkeypatch.setattr(ActorRolloutRefWorker, "init_model", lambda self: built.append(self))
    with pytest.raises(UnsupportedVerlSetting) as e:
        _actor_worker(verl_config(*overrides)).init_model()
    assert e.value.field == field and built == []
    worker = _actor_worker(verl_config())
    worker.init_model()  # the recipe's settings: verl builds its model
    assert built == [worker]


def test_the_agent_loop_refuses_verls_v1_trainer():
    from verl_fixtures import LocalReplica, agent_loop

    from adwin.trainer_adapters.verl.agent_loop import AdwinAgentLoop

    with pytest.raises(UnsupportedVerlSetting) as e:
        agent_loop(AdwinAgentLoop, LocalReplica(), trainer={"use_v1": True})
    assert e.value.field == "trainer.use_v1"
    assert isinstance(agent_loop(AdwinAgentLoop, LocalReplica()), AdwinAgentLoop)

