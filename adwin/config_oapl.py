"""``loss.oapl``: the OAPL section of ``TrainConfig`` and what ``loss.name: oapl`` needs from the other sections.

Part of the config layer (``adwin.config`` imports and re-exports it; it must not import ``adwin.config`` back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adwin.policies.registry import is_audited, trains_whole_response

if TYPE_CHECKING:
    from adwin.config import TrainConfig


class OAPLSection(BaseModel):
    """``loss.name: oapl`` (adwin.objectives.oapl; OAPL paper eqs. 2-3, Algorithm 1; docs/decisions.md "OAPL")."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    beta: float = Field(1.0, gt=0.0, le=1e6, description="beta of eq. 3: KL strength towards the inference policy")
    value_beta: float | None = Field(None, gt=0.0, le=1e6, description="beta of eq. 2's V; None = beta")
    lag: int = Field(1, ge=1, le=1_000_000, description="L: sync the inference policy every L learner updates and "
                     "discard what the old one generated (Algorithm 1)")
    reward: Literal["teacher", "task", "weighted"] = Field(
        "teacher", description="teacher: sum over the window of log q - log pi_inf; task: the checker (0/1); "
        "weighted: task_weight * task + teacher_weight * teacher")
    task_weight: float = Field(1.0, ge=0.0, le=1e6, description="reward: weighted only")
    teacher_weight: float = Field(1.0, ge=0.0, le=1e6, description="reward: weighted only")

    @model_validator(mode="after")
    def _weights_need_weighted(self) -> OAPLSection:
        changed = [k for k in ("task_weight", "teacher_weight") if getattr(self, k) != 1.0]
        if self.reward != "weighted" and changed:
            raise ValueError(f"loss.oapl.{changed[0]} is read only with loss.oapl.reward: weighted")
        if self.reward == "weighted" and self.task_weight == self.teacher_weight == 0:
            raise ValueError("loss.oapl.task_weight and teacher_weight are both 0: the reward would be 0")
        return self


def check_oapl(cfg: TrainConfig) -> None:
    """What ``loss.name: oapl`` needs from the rest of the run, and the lag's bound on audits
    (docs/decisions.md, "OAPL")."""
    lag, knob = lag_of(cfg), "loss.oapl.lag" if cfg.loss.name == "oapl" else "asyncopd.sync_every"
    if lag > cfg.probes.staleness_limit and is_audited(cfg.window.policy) and cfg.probes.offers_per_step > 0:
        raise ValueError(f"{knob}: probes come from weights up to {lag - 1} updates old, and probes older than "
                         f"probes.staleness_limit ({cfg.probes.staleness_limit}) never reach an audit; use {knob} "
                         f"<= {cfg.probes.staleness_limit} or a window policy that does not audit (full, fixed, linear)")
    if cfg.loss.name != "oapl":
        return
    if cfg.scheduler != "asyncopd":
        raise ValueError("loss.name: 'oapl' trains against a lagged inference policy, and the sync trainer samples "
                         "from the weights it trains at every step (no lag, no buffer to clear); set scheduler: "
                         "asyncopd (--scheduler asyncopd), where loss.oapl.lag: 1 is the on-policy case")
    if cfg.rollout.samples_per_prompt < 2:
        raise ValueError("rollout.samples_per_prompt: oapl estimates a prompt's value from its group of rollouts; "
                         "a group of 1 has advantage 0 (use >= 2; the paper uses 8)")
    if cfg.rollout.temperature != 1.0:
        raise ValueError("rollout.temperature: oapl's ln pi(y) and the sampler's ln pi_inf(y) are one distribution "
                         "only at temperature 1.0")
    if cfg.asyncopd.sync_every != 1:
        raise ValueError("asyncopd.sync_every: with loss.name oapl the lag is loss.oapl.lag; drop sync_every")
    o = cfg.loss.oapl
    if (o.reward == "task" or (o.reward == "weighted" and o.task_weight > 0)) and not trains_whole_response(
            cfg.window.policy):
        raise ValueError(f"loss.oapl.reward: the task reward checks a complete answer, which window.policy "
                         f"{cfg.window.policy!r} cuts off; use window.policy: full, or reward: teacher")


def lag_of(cfg: TrainConfig) -> int:
    """Learner updates between two syncs of the rollout workers' weights (1 = every update)."""
    return cfg.loss.oapl.lag if cfg.loss.name == "oapl" else cfg.asyncopd.sync_every
