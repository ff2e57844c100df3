"""The audit's settings from the config: one mapping for every loop.

``AuditConfig`` (``audit.*``) and the probe IS fields of ``ProbeConfig`` are what a user declares;
``AuditSettings`` (``adwin.audit.job``) is what an audit job carries to wherever it runs, and
``adwin.audit.job.run_audit_job`` is the one place that turns it into ``adwin.audit.alignment.audit``'s
arguments. ``audit_settings`` and ``audit_schedule`` are the only ways the loops build them: the sync trainer
and the AsyncOPD run from their ``TrainConfig`` (``run_audit_settings``), the generic client and the TRL
callback from an ``AuditConfig`` they are given or build from their arguments.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from adwin.audit.budget import DecisionBudget, FlopsModel
from adwin.audit.drift import teacher_drift
from adwin.audit.job import AuditSettings
from adwin.audit.schedule import AuditSchedule
from adwin.audit.sizing import EvidenceSizer
from adwin.config import AuditConfig, ProbeConfig, TrainConfig
from adwin.probes.client import ProbeClient
from adwin.student.lora import trainable_parameters

log = logging.getLogger(__name__)


def audit_settings(audit: AuditConfig, candidates: Sequence[int], *, seed: int = 0, probes: ProbeConfig | None = None,
                   micro_batch: int | None = None, autocast: str = "off") -> AuditSettings:
    """The job settings of ``audit`` over the run's ``candidates``; IS weights from ``probes`` (default: none)."""
    p = probes or ProbeConfig()
    return AuditSettings(candidates=[int(c) for c in candidates], method=audit.method, metric=audit.metric,
                         sketch_dim=audit.sketch_dim, seed=seed, macro=audit.macro, params=audit.params,
                         estimator=audit.estimator, ci_level=audit.ci_level, ci_samples=audit.ci_samples,
                         is_method=p.is_method, is_low=p.is_low, is_high=p.is_high, is_level=p.is_level,
                         micro_batch=micro_batch, autocast=autocast, evidence_audits=audit.evidence_audits,
                         evidence_decay=audit.evidence_decay)


def audit_schedule(audit: AuditConfig, threshold: float) -> AuditSchedule | None:
    """``audit.every`` / ``audit.skip_*`` as a schedule, or None when every ready batch is audited."""
    if audit.every == 1 and audit.skip_margin == 0:
        return None
    return AuditSchedule(threshold=threshold, every=audit.every, skip_margin=audit.skip_margin,
                         skip_history=audit.skip_history, max_skips=audit.max_skips)


def run_audit_settings(cfg: TrainConfig) -> AuditSettings:
    """``audit_settings`` of a whole run config (candidates, seed, probe IS, micro-batch, autocast)."""
    return audit_settings(cfg.audit, cfg.window.candidates, seed=cfg.seed, probes=cfg.probes,
                          micro_batch=cfg.optim.micro_batch_size, autocast=cfg.model.autocast)


def param_count(model: Any) -> int | None:
    """All parameters of a torch module (tied weights once: ``parameters()`` yields a shared tensor once);
    None for what has none to count (an engine behind vLLM)."""
    params = getattr(model, "parameters", None)
    return sum(p.numel() for p in params()) if callable(params) else None


def trainable_count(model: Any) -> int | None:
    """The trainable parameters of a student with frozen ones (a LoRA student's adapters); None when every
    parameter trains (or there are none to count)."""
    n_all = param_count(model)
    if n_all is None:
        return None
    n = sum(p.numel() for p in trainable_parameters(model))
    return n if 0 < n < n_all else None


def decision_budget(audit: AuditConfig, *, probe_batch: int, staleness_limit: int, offers_per_step: int, n_student: int,
                    n_teacher: int, max_prompt_len: int, max_response_len: int, min_window: int,
                    drift: bool, n_trainable: int | None = None, sizer: EvidenceSizer | None = None) -> DecisionBudget:
    """``audit.budget`` / ``audit.pool_max`` as the probe client's ``DecisionBudget`` (with ``audit.budget: null``
    one that only counts: ``decision/*`` is reported, offers and audits are as without it).

    The priors are upper bounds (an underestimate lets the rounds before the first audit overspend): a probe
    is at most the longest prompt plus the horizon, and its extension adds at most the horizon minus the
    smallest window. ``sizer``: the evidence a decision needs to resolve (``adwin.audit.sizing``), which sizes the
    rounds once an audit has measured its noise scale."""
    return DecisionBudget(audit.budget, FlopsModel(n_student, n_teacher, n_trainable), probe_batch=probe_batch,
                          staleness_limit=staleness_limit, offer_cap=max(1, offers_per_step),
                          prior_probe_tokens=float(max_prompt_len + max_response_len),
                          prior_extension_tokens=float(max(0, max_response_len - min_window)),
                          pool_max=audit.pool_max, drift=drift, gate_seconds=audit.budget_seconds, sizer=sizer)


def evidence_sizer(cfg: TrainConfig) -> EvidenceSizer | None:
    """The run's evidence target: ``window.signal_z`` and ``window.resolve_samples`` over ``audit.evidence_audits``
    audits of ``P``; None for the paper's rule (``window.unresolved: decide``: one batch of P a decision)."""
    if cfg.window.unresolved == "decide" or cfg.audit.budget is None:
        return None
    return EvidenceSizer(cfg.probes.batch_size, cfg.window.signal_z, cfg.window.resolve_samples,
                         cfg.audit.evidence_audits)


def run_decision_budget(cfg: TrainConfig, student: Any, teachers: Any, *, drift: bool) -> DecisionBudget:
    """``decision_budget`` of a whole run: parameter counts from the student and the teachers (the largest
    teacher: every probe may route to it); a teacher with nothing to count (vLLM) is charged the student's."""
    n_s = param_count(student) or 1
    counts = [c for c in (param_count(m) for m in getattr(teachers, "models", {}).values()) if c]
    if not counts:
        log.warning("audit.budget: the teachers' parameters cannot be counted (an engine); charging the "
                    "student's count (%d) for the teacher's forward", n_s)
    p = cfg.probes
    return decision_budget(cfg.audit, probe_batch=p.batch_size, staleness_limit=p.staleness_limit,
                           offers_per_step=p.offers_per_step, n_student=n_s, n_teacher=max(counts, default=n_s),
                           max_prompt_len=cfg.data.max_prompt_len, max_response_len=cfg.rollout.max_response_len,
                           min_window=min(cfg.window.candidates), drift=drift, n_trainable=trainable_count(student),
                           sizer=evidence_sizer(cfg))


def configure_audits(client: ProbeClient, cfg: TrainConfig, teachers: Any, *, pad_id: int, student: Any,
                     drift: bool = True) -> None:
    """Give ``client`` the run's audit: settings, schedule, the teacher (``adwin.teacher.local.Teachers``) for
    probes no teacher stage scored, the drift diagnostics when the teacher has full logits and ``drift``
    (one process logs them), and the decision budget (``audit.budget``; FLOPs from ``student``'s and the
    teachers' parameter counts). The same for the sync trainer and the AsyncOPD run."""
    client.settings = run_audit_settings(cfg)
    client.schedule = audit_schedule(cfg.audit, cfg.window.threshold)
    client.score = teachers.score
    client.pad_id = pad_id
    if drift and teachers.dense:  # drift/*: needs the teacher's full logits (not vLLM's)
        client.drift = partial(teacher_drift, teachers.logits, candidates=tuple(cfg.window.candidates))
    # charged on every rank alike (only one computes drift/*): ranks must offer and pool identically
    client.budget = run_decision_budget(cfg, student, teachers, drift=bool(teachers.dense))
