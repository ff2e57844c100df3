"""``loss.oapl``: the OAPL section of ``TrainConfig``.

The rules across sections (scheduler, probes, rollout) are ``check_oapl`` in ``adwin.config.run``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from adwin.config.base import _Strict


class OAPLSection(_Strict):
    """``loss.name: oapl`` (adwin.objectives.oapl; OAPL paper eqs. 2-3, Algorithm 1; docs/decisions.md "OAPL")."""

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
