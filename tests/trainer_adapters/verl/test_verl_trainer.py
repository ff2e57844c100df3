"""The verl glue that needs no GPU to check: adwin's ``TaskRunner`` builds adwin's actor worker and trainer, and the
actor worker's ``adwin_audit`` (registered ``ONE_TO_ALL``) audits the module its engine holds under verl's loss.

Not here: verl's Ray worker group, FSDP engine and vLLM rollout (trainer_adapters/verl/gpu_recipe.sh)."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest

pytest.importorskip("verl.protocol")  # not "verl": without verl, this folder is a namespace package "verl"

from tiny_models import make_tiny_llama  # noqa: E402
from verl_audit_fixtures import CANDIDATES, distillation_config, job  # noqa: E402

from adwin.audit.alignment import audit  # noqa: E402


def _task_runner():
    from adwin.trainer_adapters.verl.task_runner import AdwinTaskRunner

    return AdwinTaskRunner.__ray_actor_class__()  # the plain class Ray starts as the TaskRunner actor


def test_the_task_runner_gives_the_actor_role_adwins_worker():
    from verl.trainer.ppo.ray_trainer import Role
    from verl_recipe import verl_config

    from adwin.trainer_adapters.verl.actor import AdwinActorRolloutRefWorker

    runner = _task_runner()
    cls, _ = runner.add_actor_rollout_worker(verl_config(trainer="legacy"))
    assert cls is AdwinActorRolloutRefWorker
    assert runner.role_worker_mapping[Role.ActorRollout].__ray_actor_class__ is AdwinActorRolloutRefWorker


def test_the_task_runner_builds_adwins_trainer_and_leaves_verls_name_as_it_was(monkeypatch):
    import verl.trainer.main_ppo_v0 as v0
    from verl_recipe import verl_config

    from adwin.trainer_adapters.verl.trainer import AdwinRayPPOTrainer

    built = []
    monkeypatch.setattr(v0.TaskRunner.__ray_actor_class__, "run", lambda self, config: built.append(v0.RayPPOTrainer))
    verls = v0.RayPPOTrainer
    _task_runner().run(verl_config(trainer="legacy"))
    assert built == [AdwinRayPPOTrainer] and v0.RayPPOTrainer is verls


def test_the_worker_method_is_dispatched_to_every_rank():
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch

    from adwin.trainer_adapters.verl.actor import AdwinActorRolloutRefWorker

    attrs = getattr(AdwinActorRolloutRefWorker.adwin_audit, MAGIC_ATTR)
    assert attrs["dispatch_mode"] == Dispatch.ONE_TO_ALL


def _worker(module):
    from adwin.trainer_adapters.verl.actor import AdwinActorRolloutRefWorker

    w = object.__new__(AdwinActorRolloutRefWorker)  # the attributes verl's init_model leaves, without Ray
    engine = SimpleNamespace(module=module, optimizer=None, eval_mode=nullcontext,
                             get_data_parallel_rank=lambda: 0, get_data_parallel_size=lambda: 1,
                             get_data_parallel_group=lambda: None)
    w.actor, w.distillation_config = SimpleNamespace(engine=engine), distillation_config()
    return w


@pytest.mark.numerics
def test_adwin_audit_audits_the_engines_module_under_verls_loss():
    outcome = _worker(make_tiny_llama(seed=0)).adwin_audit(job())
    ours = audit(make_tiny_llama(seed=0), job().batch, CANDIDATES, macro=False)
    for c in CANDIDATES:
        assert outcome.result.cosines[c] == pytest.approx(ours.cosines[c], abs=1e-6)


def test_adwin_audit_refuses_an_fsdp1_module(monkeypatch):
    import adwin.trainer_adapters.verl.actor as actor

    monkeypatch.setattr(actor, "fsdp_version", lambda module: 1)  # what verl reports for an FSDP1-wrapped module
    with pytest.raises(actor.UnsupportedActorEngine):
        _worker(make_tiny_llama(seed=0)).adwin_audit(job())
