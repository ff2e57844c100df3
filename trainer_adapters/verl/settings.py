"""The ``adwin`` section of a verl config (``+adwin.candidates=[...]`` on verl's command line), validated early.

verl-free. ``run_spec`` turns it into the controller's ``RunIn`` with the horizon fixed to verl's
``actor_rollout_ref.rollout.response_length``; ``build_controller`` the embedded controller or the HTTP client;
``driver`` the run's ``VerlWindowDriver``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adwin.config import AuditConfig
from adwin.controller import Controller, RemoteController
from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.trainer_adapters.verl.driver import VerlWindowDriver


class AdwinVerlConfig(BaseModel):
    """adwin's knobs inside a verl run; the audit's are ``AuditConfig``'s (docs/config.md, ``audit``)."""

    model_config = ConfigDict(extra="forbid")

    controller: str | None = Field(None, description="URL of `adwin controller serve`; None: embedded in the driver")
    run_id: str = Field("verl", description="the controller's run id")
    policy: str = Field("adwin", description="window policy (adwin, fixed, linear, full)")
    candidates: list[int] = Field(default_factory=list, description="increasing windows an audit picks from")
    threshold: float = Field(0.7, gt=0.0, le=1.0, description="cosine a candidate must reach")
    probe_batch_size: int = Field(8, ge=1, description="P: probe copies per audit")
    offers_per_step: int = Field(8, ge=0, description="probe copies a probe step may add to its generation call "
                                 "(at probe_batch_size, one probe step fills an audit's batch)")
    probe_every: int = Field(8, ge=1, description="steps per probe step: only a probe step's generation call carries "
                             "probe copies and runs to the horizon; the others end at the window (1: every step)")
    staleness_limit: int = Field(5, ge=1, description="S, in optimizer steps")
    audit: AuditConfig = Field(default_factory=lambda: AuditConfig(budget=None),
                               description="audit knobs; the decision budget only when audit.budget is given")
    model_params: tuple[int, int] | None = Field(None, description="student and teacher parameter counts, which "
                                                 "audit.budget needs to count FLOPs")

    @field_validator("audit", mode="before")
    @classmethod
    def _no_budget_unless_asked(cls, value: Any) -> Any:
        # verl's trainer cannot count the teacher's parameters: a budget is opt-in here, with model_params
        return value | {"budget": value.get("budget")} if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _one_probe_step_fills_a_batch(self) -> AdwinVerlConfig:
        # copies held for the next probe step would be more than staleness_limit updates old there, and expire
        if self.probe_every > self.staleness_limit and self.offers_per_step < self.probe_batch_size:
            raise ValueError(f"offers_per_step {self.offers_per_step} < probe_batch_size {self.probe_batch_size}: "
                             f"with probe_every {self.probe_every} > staleness_limit {self.staleness_limit} a batch "
                             f"must fill in one probe step; raise offers_per_step or lower probe_every")
        return self

    def run_spec(self, response_length: int) -> RunIn:
        policy = PolicyIn(name=self.policy, candidates=self.candidates, max_len=response_length,
                          threshold=self.threshold)
        return RunIn(run_id=self.run_id, policy=policy, probe_batch_size=self.probe_batch_size,
                     offers_per_step=self.offers_per_step, staleness_limit=self.staleness_limit)

    def build_controller(self) -> ControllerAPI:
        return Controller() if self.controller is None else RemoteController(self.controller)

    def driver(self, response_length: int, auditor: Any, rollouts_per_step: int | None = None) -> VerlWindowDriver:
        """The driver of a verl run with this section (``response_length``: verl's horizon)."""
        return VerlWindowDriver(self.build_controller(), self.run_spec(response_length), max_len=response_length,
                                auditor=auditor, audit=self.audit, model_params=self.model_params,
                                rollouts_per_step=rollouts_per_step, probe_every=self.probe_every)


def adwin_config(section: Mapping[str, Any] | None) -> AdwinVerlConfig:
    """The ``adwin`` section (a plain mapping: resolve OmegaConf first); a bad one fails naming ``adwin.<field>``."""
    try:
        return AdwinVerlConfig.model_validate(dict(section or {}))
    except ValidationError as e:
        where = ", ".join("adwin." + ".".join(map(str, err["loc"])) + f": {err['msg']}" for err in e.errors())
        raise ValueError(where) from e
