"""The driver's side of adwin in verl: window and probe plan before generation, probes and offers after it, the
audit after the actor's update. verl-free (rows are plain records), so it is tested without verl.

One step of verl's trainer at learner version ``v`` (updates applied so far; verl's ``global_steps - 1``):

1. ``plan(v, rows)`` reads the controller's window (``BadWindow`` if it cannot cap a request; nothing is offered
   then, so nothing is lost) and, on a *probe step* (one in ``probe_every``: ``v % probe_every == 0``), asks, row by
   row, which rows get a *probe copy*: the same prompt, generated to the horizon in the same generation call, marked
   ``adwin_probe``. verl's generation call lasts as long as its longest request, so only probe steps run to the
   horizon; the others end at the window (the step-time model: docs/adapters.md, "verl"). The controller bounds them
   (``offers_per_step``, ``max_active_probes``) and the decision budget gates the asking. Rows are asked prompt by
   prompt (``spread``), so the copies cover as many prompts as they can.
2. ``collect(v, items)`` after generation: probe copies are reported complete with the teacher logprobs verl's
   teacher loop scored (they never join the training batch); training rows that ended inside their window are
   offered as already complete probes by the one offer rule.
3. ``after_update(v + 1)``: a ready probe batch is audited by the ``auditor`` (in verl: the actor's worker method,
   ``adwin.trainer_adapters.verl.actor``) and submitted; the next ``plan`` reads the decided window.

It drives the one probe client in its fresh-probe mode through ``ControllerWindowHooks`` (the AsyncOPD adapter's
hooks): the same offers, reports, schedule, decision budget and degraded mode (a dead controller: the last window).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from adwin.audit.job import AuditJob, AuditOutcome
from adwin.config import AuditConfig
from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import RunIn
from adwin.policies.registry import is_audited
from adwin.probes.settings import audit_schedule, audit_settings
from adwin.probes.workers import run_now
from adwin.trainer_adapters.asyncopd.items import StreamItem
from adwin.trainer_adapters.generic import spec_budget
from adwin.trainer_adapters.hooks import ControllerWindowHooks
from adwin.trainer_adapters.registration import check_feasible, register, resilient
from adwin.trainer_adapters.verl.fields import check_window


def verl_item(request_id: str, prompt_id: str, prompt_ids: list[int], tokens: list[int],
              teacher_logprobs: list[float] | None, window: int, max_tokens: int, is_probe: bool, version: int,
              finish: str, logprobs: list[float] | None = None) -> StreamItem:
    """One generated verl row as the hooks read it (the AsyncOPD item; ``adwin.trainer_adapters.hooks.StampedItem``).

    verl's synchronous trainer generates a row under one weights version, ``version``; ``teacher_logprobs`` are the
    log q of each response token from verl's teacher loop; ``logprobs`` the behavior ones when the rollout returned
    them (None otherwise: the audit then runs without stale-probe weights)."""
    return StreamItem(request_id, 0, prompt_id, list(prompt_ids), "default", window, max_tokens, is_probe, version,
                      tokens=list(tokens), logprobs=logprobs, token_versions=[version] * len(tokens),  # type: ignore[arg-type]
                      finish_reason=finish, teacher_logprobs=teacher_logprobs)


def finish_reason(length: int, cap: int, max_len: int) -> str:
    """A row shorter than its cap ended with EOS; one at its cap was cut there (by the window or the horizon)."""
    if length < cap:
        return "eos"
    return "horizon" if cap >= max_len else "window"


def spread(prompt_ids: Sequence[str]) -> list[int]:
    """Row indices in the order rows are asked for a probe copy: every prompt's first row, then every prompt's
    second, ... verl repeats each prompt ``rollout.n`` times in a row, so asking in row order would spend the
    step's offers on the first few prompts, and the probe batch would cover as few prompts as offers allow."""
    seen: dict[str, int] = {}
    nth = []
    for prompt in prompt_ids:
        nth.append(seen.get(prompt, 0))
        seen[prompt] = nth[-1] + 1
    return sorted(range(len(prompt_ids)), key=nth.__getitem__)  # stable: prompts in batch order within a round


@dataclass
class StepPlan:
    """What ``plan`` decided for one generation call."""

    version: int
    window: int
    probes: list[int]  # indices of the rows that get a probe copy (generated to the horizon)
    probe_ids: list[str]  # the probe id of each copy (its request id)
    metrics: dict[str, float] = field(default_factory=dict)


# The actor's audit: one job in, rank 0's outcome back (every DP rank holds the same one).
AuditCall = Callable[[AuditJob], AuditOutcome]


@dataclass
class WorkerAuditor:
    """The probe client's ``AuditRunner`` over the actor's audit call (verl: ``actor_rollout_wg.adwin_audit``)."""

    call: AuditCall

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        return run_now(lambda: self.call(job))  # a failure comes back in the future, as every runner's


class VerlWindowDriver:
    """See the module docstring. ``max_len`` is verl's ``rollout.response_length`` (the horizon) and must be the
    run's ``policy.max_len``. ``audit`` (an ``AuditConfig``; default: its defaults without a budget) and
    ``model_params`` (student and teacher parameter counts, which a budget needs) as in ``WindowClient``.
    ``probe_every``: steps per probe step (1: every step may carry probe copies)."""

    def __init__(self, controller: ControllerAPI, run: str | RunIn, *, max_len: int, auditor: Any = None,
                 audit: AuditConfig | None = None, model_params: tuple[int, int] | None = None,
                 resilient_controller: bool = True, rollouts_per_step: int | None = None,
                 probe_every: int = 1) -> None:
        if probe_every < 1:
            raise ValueError(f"probe_every must be at least 1, got {probe_every}")
        self.probe_every = probe_every
        self.controller = resilient(controller, resilient_controller)
        out = register(self.controller, run)
        policy = out.spec["policy"]
        if int(policy["max_len"]) != max_len:
            raise ValueError(f"run {out.run_id}: policy.max_len {policy['max_len']} must equal verl's "
                             f"rollout.response_length {max_len} (the horizon probes are generated to)")
        audited = is_audited(policy["name"])
        if audited:
            check_feasible(out, rollouts_per_step=rollouts_per_step)
        self.run_id, self.max_len = out.run_id, max_len
        self.audit_config = audit or AuditConfig(budget=None)
        if self.audit_config.budget is not None and model_params is None:
            raise ValueError(f"audit.budget={self.audit_config.budget} needs model_params=(student parameters, teacher "
                             f"parameters); pass them, or AuditConfig(budget=None)")
        self.hooks = ControllerWindowHooks(self.controller, self.run_id, max_len=max_len, probing=audited,
                                           resilient_controller=False)  # already wrapped above
        client = self.hooks.client
        candidates = [int(c) for c in policy.get("candidates") or []]
        client.settings = audit_settings(self.audit_config, candidates) if audited else None
        client.schedule = audit_schedule(self.audit_config, float(policy.get("threshold", 0.7)))
        client.auditor = auditor
        if model_params is not None:
            client.budget = spec_budget(self.audit_config, out.spec, model_params)
        self.last_window: int | None = None

    def plan(self, version: int, rows: Sequence[tuple[str, str]]) -> StepPlan:
        """The window for ``version`` and the rows (``(request_id, prompt_id)`` each) that get a probe copy."""
        sync = self.hooks.on_sync(version)
        window = check_window(sync.window, self.max_len, what=f"the controller's window for version {version}")
        probes, ids = [], []
        probe_step = version % self.probe_every == 0
        for i in spread([prompt for _, prompt in rows]) if probe_step else []:
            request_id, prompt_id = rows[i]
            probe_id = f"{request_id}:probe"
            if self.hooks.plan_request(probe_id, str(prompt_id), version).is_probe:
                probes.append(i)
                ids.append(probe_id)
        self.last_window = window
        return StepPlan(version, window, probes, ids, dict(sync.metrics) | {"probe/step": float(probe_step)})

    def collect(self, version: int, items: Sequence[StreamItem]) -> dict[str, float]:
        """After generation, before the update: probe copies are reported complete, training rows offered."""
        probes = [it for it in items if it.is_probe]
        for it in probes:
            self.hooks.on_probe_complete(it, version)
        accepted = self.hooks.offer_complete([it for it in items if not it.is_probe], version)
        return {"probe/copies": float(len(probes)), "probe/offered_complete": float(accepted)}

    def after_update(self, version: int, *, last: bool = False) -> dict[str, float]:
        """After the actor's update (``version`` = updates applied now): audit a ready batch, submit it."""
        return self.hooks.poll_audit(version, last=last)

    def metrics(self) -> dict[str, float]:
        c = self.hooks.client
        out = {"probe/audits": float(c.counts["audits"])}
        if self.last_window is not None:
            out["window/size"] = float(self.last_window)
        out |= {f"window/cos@{k}": float(v) for k, v in c.record.last_cosines.items()}
        return out | self.hooks.metrics()

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.hooks.on_step(step, metrics)
