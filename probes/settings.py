"""The audit's settings from the config: one mapping for every loop.

``AuditConfig`` (``audit.*``) and the probe IS fields of ``ProbeConfig`` are what a user declares;
``AuditSettings`` (``adwin.audit.job``) is what an audit job carries to wherever it runs, and
``adwin.audit.job.run_audit_job`` is the one place that turns it into ``adwin.audit.alignment.audit``'s
arguments. ``audit_settings`` and ``audit_schedule`` are the only ways the loops build them: the sync trainer
and the AsyncOPD run from their ``TrainConfig`` (``run_audit_settings``), the generic client and the TRL
callback from an ``AuditConfig`` they are given or build from their arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from adwin.audit.drift import teacher_drift
from adwin.audit.job import AuditSettings
from adwin.audit.schedule import AuditSchedule
from adwin.config import AuditConfig, ProbeConfig, TrainConfig
from adwin.probes.client import ProbeClient


def audit_settings(audit: AuditConfig, candidates: Sequence[int], *, seed: int = 0, probes: ProbeConfig | None = None,
                   micro_batch: int | None = None, autocast: str = "off") -> AuditSettings:
    """The job settings of ``audit`` over the run's ``candidates``; IS weights from ``probes`` (default: none)."""
    p = probes or ProbeConfig()
    return AuditSettings(candidates=[int(c) for c in candidates], method=audit.method, metric=audit.metric,
                         sketch_dim=audit.sketch_dim, seed=seed, macro=audit.macro, params=audit.params,
                         estimator=audit.estimator, ci_level=audit.ci_level, ci_samples=audit.ci_samples,
                         is_method=p.is_method, is_low=p.is_low, is_high=p.is_high, is_level=p.is_level,
                         micro_batch=micro_batch, autocast=autocast)


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


def configure_audits(client: ProbeClient, cfg: TrainConfig, teachers: Any, *, pad_id: int, drift: bool = True) -> None:
    """Give ``client`` the run's audit: settings, schedule, the teacher (``adwin.sampling.teacher.Teachers``) for
    probes no teacher stage scored, and the drift diagnostics when the teacher has full logits and ``drift``
    (one process logs them). The same for the sync trainer and the AsyncOPD run."""
    client.settings = run_audit_settings(cfg)
    client.schedule = audit_schedule(cfg.audit, cfg.window.threshold)
    client.score = teachers.score
    client.pad_id = pad_id
    if drift and teachers.dense:  # drift/*: needs the teacher's full logits (not vLLM's)
        client.drift = partial(teacher_drift, teachers.logits, candidates=tuple(cfg.window.candidates))
