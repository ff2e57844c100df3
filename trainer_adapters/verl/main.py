"""``python -m adwin.trainer_adapters.verl.main``: verl's PPO main with adwin's TaskRunner.

The command line is verl's own (``verl.trainer.main_ppo``'s): verl 0.9.1's Hydra config (``ppo_trainer``, from the
installed verl) with the same overrides, plus an ``adwin`` section. ``launch`` refuses what adwin cannot run under by
field (``support.check_verl_config``), does what verl's ``main`` does (``auto_set_device``, ``validate_config``),
both before Ray starts, points verl's agent-loop workers at the ``adwin`` loop
(``actor_rollout_ref.rollout.agent.agent_loop_config_path``: ``agent_loops.yaml`` beside this file, unless the config
names a file, which must then register ``adwin``) and calls verl's ``run_ppo`` with adwin's TaskRunner for the trainer
the config names, as verl's main does: ``AdwinTaskRunnerV1`` for verl's v1 trainer (``trainer.use_v1=true``, verl's
default; ``trainer_v1.py``), ``AdwinTaskRunner`` for the legacy DataProto trainer (``task_runner.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import verl
from omegaconf import OmegaConf
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from adwin.trainer_adapters.verl.agent_loop import AGENT_NAME
from adwin.trainer_adapters.verl.support import UnsupportedVerlSetting, check_verl_config, uses_v1

VERL_CONFIG = str(Path(verl.__file__).parent / "trainer" / "config")
AGENT_LOOPS = Path(__file__).with_name("agent_loops.yaml")
LOOPS_FIELD = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


def prepare(config: Any) -> None:
    """adwin's checks, then verl's, then the agent-loop file (module docstring); changes ``config`` in place."""
    check_verl_config(config)  # first: a setting adwin refuses may also be one verl's checks cannot read
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    agent = config.actor_rollout_ref.rollout.agent
    if agent.get("agent_loop_config_path") is None:
        agent.agent_loop_config_path = str(AGENT_LOOPS)
        return
    from verl.utils.import_utils import resolve_config_path

    path = agent.agent_loop_config_path
    names = [entry.get("name") for entry in OmegaConf.load(resolve_config_path(path))]
    if AGENT_NAME not in names:
        raise UnsupportedVerlSetting(LOOPS_FIELD, path, f"verl's agent-loop workers find the {AGENT_NAME!r} loop "
                                     f"through this file: add its entry ({AGENT_LOOPS}), or leave the field unset")


def task_runner(config: Any) -> Any:
    """adwin's TaskRunner (a Ray actor class) for the trainer ``config`` names (module docstring)."""
    if uses_v1(config):  # imported only for the trainer that runs: v1's needs verl's TransferQueue
        from adwin.trainer_adapters.verl.trainer_v1 import AdwinTaskRunnerV1

        return AdwinTaskRunnerV1
    from adwin.trainer_adapters.verl.task_runner import AdwinTaskRunner

    return AdwinTaskRunner


def launch(config: Any) -> None:
    """``prepare``, then verl's ``run_ppo`` with adwin's TaskRunner."""
    prepare(config)
    run_ppo(config, task_runner_class=task_runner(config))


@hydra.main(config_path=VERL_CONFIG, config_name="ppo_trainer", version_base=None)
def main(config: Any) -> None:
    launch(config)


if __name__ == "__main__":
    main()
