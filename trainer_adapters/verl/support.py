"""The verl settings adwin's adapter runs under, checked where verl's processes start; anything else is refused by
name (``UnsupportedVerlSetting``) before the first step, not at the first audit.

verl-free: the checks read a verl config (an OmegaConf ``DictConfig`` or a plain mapping) by dotted path.

* ``check_verl_config`` (the whole trainer config): called by adwin's main before Ray starts, by adwin's TaskRunners
  and trainers (both of verl's: ``trainer.use_v1``) before verl builds its workers, and by the ``adwin`` agent loop.
* ``check_actor_rollout_ref`` (the ``actor_rollout_ref`` section a worker is given): called by adwin's actor worker
  before verl builds its model.

Why each is refused: the audit differentiates every parameter of the actor's module through its own Hugging Face
forward at temperature 1 (``adwin.audit``), so the actor must be an FSDP2 module whose forward returns logits,
whole sequences per rank, a rollout sampling at T = 1, and verl's distillation loss; the window reaches requests only
through the ``adwin`` agent loop. Of verl's v1 trainer only the synchronous mode is wired (``trainer.v1.trainer_mode``
``sync``, one weight sync per step): the asynchronous modes generate under weights several updates old and sync
them on their own schedule, which the driver's one-version-per-step bookkeeping does not model.
"""

from __future__ import annotations

from typing import Any


class UnsupportedVerlSetting(ValueError):
    """A verl setting the adapter cannot run under; ``field`` is its dotted path in verl's config."""

    def __init__(self, field: str, value: Any, why: str) -> None:
        super().__init__(f"{field}={value!r}: {why}")
        self.field, self.value = field, value


def _get(config: Any, path: str, default: Any = None) -> Any:
    node = config
    for key in path.split("."):
        if node is None:
            return default
        node = node.get(key) if hasattr(node, "get") else None
    return default if node is None else node


def check_actor_rollout_ref(section: Any, prefix: str = "actor_rollout_ref") -> None:
    """Refuse what the audit cannot differentiate in verl's ``actor_rollout_ref`` section, naming the field."""
    def field(path: str) -> str:
        return f"{prefix}.{path}"

    strategy = _get(section, "actor.strategy", "fsdp")
    if strategy == "fsdp":
        raise UnsupportedVerlSetting(field("actor.strategy"), strategy, "FSDP1 flattens the parameters the audit "
                                     "differentiates one by one: use fsdp2")
    if strategy != "fsdp2":
        raise UnsupportedVerlSetting(field("actor.strategy"), strategy, "the audit differentiates an FSDP2 module; "
                                     "other engines (megatron, veomni, torchtitan, ...) are not wired: use fsdp2")
    if bool(_get(section, "model.use_fused_kernels", False)):
        raise UnsupportedVerlSetting(field("model.use_fused_kernels"), True, "verl's fused kernels replace the "
                                     "model's logits, which the audit's forward reads: set it false")
    temperature = float(_get(section, "rollout.temperature", 1.0))
    if temperature != 1.0:
        raise UnsupportedVerlSetting(field("rollout.temperature"), temperature, "the audit scores the student's "
                                     "tokens at temperature 1; a tempered rollout is not the policy it audits")
    loop = _get(section, "rollout.agent.default_agent_loop", "single_turn_agent")
    if loop != "adwin":
        raise UnsupportedVerlSetting(field("rollout.agent.default_agent_loop"), loop, "the adwin agent loop caps "
                                     "each request at the window; under another, requests run to the horizon: set "
                                     "it to adwin")
    sp = int(_get(section, "actor.ulysses_sequence_parallel_size", 1))
    if sp != 1:
        raise UnsupportedVerlSetting(field("actor.ulysses_sequence_parallel_size"), sp,
                                     "the audit needs whole sequences per rank: set it to 1")


def check_distillation(distillation: Any, field: str = "distillation.enabled") -> None:
    """adwin audits verl's distillation loss: without it there is nothing to audit."""
    if not bool(_get(distillation, "enabled", False)):
        raise UnsupportedVerlSetting(field, _get(distillation, "enabled", False),
                                     "adwin audits verl's distillation loss: set it true")


def uses_v1(config: Any) -> bool:
    """Whether ``config`` runs verl's v1 (TransferQueue) trainer: verl 0.9.1's default, ``trainer.use_v1``."""
    return bool(_get(config, "trainer.use_v1", True))


def check_v1_trainer(v1: Any, prefix: str = "trainer.v1") -> None:
    """Refuse a v1 trainer mode the driver cannot follow (module docstring), naming the field."""
    mode = _get(v1, "trainer_mode", "sync")
    if mode != "sync":
        raise UnsupportedVerlSetting(f"{prefix}.trainer_mode", mode, "adwin wires the v1 trainer's synchronous mode "
                                     "(one weights version per step); the asynchronous ones are not wired: use sync")
    steps = int(_get(v1, "sync.parameter_sync_step", 1))
    if steps != 1:
        raise UnsupportedVerlSetting(f"{prefix}.sync.parameter_sync_step", steps, "adwin audits after each update "
                                     "and plans each generation at one weights version: set it to 1")


def check_verl_config(config: Any) -> None:
    """Refuse a verl trainer config the adapter cannot run under, naming the first unsupported field."""
    if uses_v1(config):
        check_v1_trainer(_get(config, "trainer.v1"))
    check_distillation(_get(config, "distillation"))
    check_actor_rollout_ref(_get(config, "actor_rollout_ref"))
