"""The recipe users run (``trainer_adapters/verl/gpu_recipe.sh``, for each of verl's trainers: ``TRAINER=v1``, verl's
default, and ``TRAINER=legacy``) against verl 0.9.1's own checks: its overrides on verl's Hydra config pass verl's
``validate_config`` as verl's main calls it, and adwin's own checks refuse, by field,
each setting the adapter cannot run under, where verl's processes start (the trainer before it builds workers, the
actor worker before it builds its model, the agent loop when verl builds it).

The recipe launches adwin's main (``adwin.trainer_adapters.verl.main``): verl's command line and checks, then verl's
``run_ppo`` with adwin's TaskRunner. Where this stops on CPU: ``run_ppo`` starts Ray and a ``TaskRunner`` that places
workers on GPUs; the tests run the main up to that call (``run_ppo`` replaced by a recorder), the rest runs only on a
GPU machine (the recipe itself)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl.protocol")  # not "verl": without verl, this folder is a namespace package "verl"

from verl_recipe import recipe_argv, verl_config  # noqa: E402

from adwin.trainer_adapters.verl.support import UnsupportedVerlSetting, check_verl_config  # noqa: E402

TRAINERS = ["v1", "legacy"]  # verl's two trainers, the recipe's TRAINER
REFUSED = [
    (["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"], "trainer.v1.trainer_mode"),
    (["trainer.use_v1=true", "trainer.v1.trainer_mode=separate_async"], "trainer.v1.trainer_mode"),
    (["trainer.use_v1=true", "+trainer.v1.sync.parameter_sync_step=2"], "trainer.v1.sync.parameter_sync_step"),
    (["distillation.enabled=false"], "distillation.enabled"),
    (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy"),  # FSDP1, verl's default
    (["actor_rollout_ref.actor.strategy=megatron"], "actor_rollout_ref.actor.strategy"),
    (["actor_rollout_ref.actor.strategy=veomni"], "actor_rollout_ref.actor.strategy"),
    (["actor_rollout_ref.model.use_fused_kernels=true"], "actor_rollout_ref.model.use_fused_kernels"),
    (["actor_rollout_ref.rollout.temperature=0.7"], "actor_rollout_ref.rollout.temperature"),
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
    (["actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"],
     "actor_rollout_ref.rollout.agent.default_agent_loop"),
]
WORKER_REFUSED = [(o, f) for o, f in REFUSED if f.startswith(("actor_rollout_ref.", "distillation."))]


def test_the_recipe_launches_adwins_main_without_a_ray_setup_hook():
    assert recipe_argv()[:2] == ("-m", "adwin.trainer_adapters.verl.main")
    assert not any("worker_process_setup_hook" in arg for arg in recipe_argv())


class RunPPO:
    """verl's ``run_ppo`` as adwin's main calls it, recorded instead of starting Ray."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, config, task_runner_class) -> None:
        self.calls.append((config, task_runner_class))


@pytest.fixture
def run_ppo(monkeypatch):
    import adwin.trainer_adapters.verl.main as main

    recorder = RunPPO()
    monkeypatch.setattr(main, "run_ppo", recorder)
    return recorder


@pytest.mark.parametrize("trainer", TRAINERS)
def test_adwins_main_hands_verls_run_ppo_adwins_task_runner_for_the_trainer(run_ppo, monkeypatch, tmp_path, trainer):
    """The recipe's command line through adwin's Hydra entry point, as ``python -m`` runs it."""
    import sys

    from adwin.trainer_adapters.verl.main import main
    from adwin.trainer_adapters.verl.task_runner import AdwinTaskRunner
    from adwin.trainer_adapters.verl.trainer_v1 import AdwinTaskRunnerV1

    monkeypatch.chdir(tmp_path)  # Hydra writes its run folder here
    monkeypatch.setattr(sys, "argv", ["main", *recipe_argv(trainer)[2:], f"hydra.run.dir={tmp_path}"])
    main()
    (config, runner), = run_ppo.calls
    assert runner is {"v1": AdwinTaskRunnerV1, "legacy": AdwinTaskRunner}[trainer]
    assert config.trainer.use_v1 is (trainer == "v1")
    assert config.actor_rollout_ref.rollout.response_length == 2048 and config.adwin.candidates == [256, 512, 1024]


def test_verls_agent_loop_workers_find_the_adwin_loop_through_the_mains_config(run_ppo):
    import hydra
    from omegaconf import OmegaConf
    from verl.utils.import_utils import resolve_config_path

    from adwin.trainer_adapters.verl.agent_loop import AdwinAgentLoop
    from adwin.trainer_adapters.verl.main import launch

    assert verl_config().actor_rollout_ref.rollout.agent.agent_loop_config_path is None  # verl's default
    launch(verl_config())
    (config, _), = run_ppo.calls
    path = resolve_config_path(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    registry = {entry.name: entry for entry in OmegaConf.load(path)}  # as verl's AgentLoopWorker reads it
    assert hydra.utils.get_class(registry["adwin"]["_target_"]) is AdwinAgentLoop


def test_an_agent_loop_file_without_adwin_is_refused_by_the_main(run_ppo, tmp_path):
    from adwin.trainer_adapters.verl.main import LOOPS_FIELD, launch

    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: mine\n  _target_: my.Loop\n")
    with pytest.raises(UnsupportedVerlSetting) as e:
        launch(verl_config(f"{LOOPS_FIELD}={loops}"))
    assert e.value.field == LOOPS_FIELD and run_ppo.calls == []
    loops.write_text("- name: mine\n  _target_: my.Loop\n- name: adwin\n  _target_: x.Y\n")
    launch(verl_config(f"{LOOPS_FIELD}={loops}"))
    assert len(run_ppo.calls) == 1


@pytest.mark.parametrize(("overrides", "field"), REFUSED)
def test_adwins_main_refuses_before_ray_starts(run_ppo, overrides, field):
    from adwin.trainer_adapters.verl.main import launch

    with pytest.raises(UnsupportedVerlSetting) as e:
        launch(verl_config(*overrides))
    assert e.value.field == field and run_ppo.calls == []


def test_the_recipes_default_is_verls_default_trainer():
    assert verl_config().trainer.use_v1 is True and verl_config().trainer.v1.trainer_mode == "sync"


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_recipe_passes_verls_own_validate_config(trainer):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    config = verl_config(trainer=trainer)
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
def test_the_legacy_trainer_refuses_before_verl_builds_its_workers(monkeypatch, overrides, field):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from adwin.trainer_adapters.verl.trainer import AdwinRayPPOTrainer

    built = []
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: built.append(self))
    trainer = object.__new__(AdwinRayPPOTrainer)
    trainer.config = verl_config(*overrides, trainer="legacy")
    with pytest.raises(UnsupportedVerlSetting) as e:
        trainer.init_workers()
    assert e.value.field == field and built == []


@pytest.mark.parametrize(("overrides", "field"), REFUSED)
def test_the_v1_trainer_refuses_before_verl_builds_anything(monkeypatch, overrides, field):
    from verl.trainer.ppo.v1 import PPOTrainer

    from adwin.trainer_adapters.verl.trainer_v1 import AdwinPPOTrainerSync

    built = []
    monkeypatch.setattr(PPOTrainer, "_setup", lambda self: built.append(self))
    trainer = object.__new__(AdwinPPOTrainerSync)
    trainer.config = verl_config(*overrides)
    with pytest.raises(UnsupportedVerlSetting) as e:
        trainer.init()
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


def test_the_agent_loop_refuses_an_asynchronous_v1_trainer():
    from verl_fixtures import LocalReplica, agent_loop

    from adwin.trainer_adapters.verl.agent_loop import AdwinAgentLoop

    with pytest.raises(UnsupportedVerlSetting) as e:
        agent_loop(AdwinAgentLoop, LocalReplica(), trainer={"use_v1": True, "v1": {"trainer_mode": "colocate_async"}})
    assert e.value.field == "trainer.v1.trainer_mode"
    for trainer in ({"use_v1": True, "v1": {"trainer_mode": "sync"}}, {"use_v1": False}):
        assert isinstance(agent_loop(AdwinAgentLoop, LocalReplica(), trainer=trainer), AdwinAgentLoop)

