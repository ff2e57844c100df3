"""Two steps of ``ProbeClient``'s audit path, apart so the client reads as the conversation it is:
``build_audit_job`` (a ready group of probes -> the probe batch, the teacher's scoring, the drift sample,
the ``AuditJob``, each charged to the decision budget), from the ``AuditInputs`` the client hands it, and
``DecisionRecord`` (the audits the controller accepted: the window they decided, how often it changed, the last
answer and cosines, and the step's ``audit/*`` metrics)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from adwin.audit.budget import DecisionBudget
from adwin.audit.job import AuditJob, AuditOutcome, AuditSettings, lag_metrics
from adwin.audit.schedule import AuditSchedule
from adwin.controller.schemas import AuditOut
from adwin.probes.auditors import Drift, Pending
from adwin.probes.pool import Probe, Score, probe_batch

T = TypeVar("T")
Spend = Callable[[Callable[[DecisionBudget], T]], T | None]  # a call on the decision budget, one thread at a time


@dataclass(frozen=True)
class AuditInputs:
    """What an audit job is built from: the client's settings and its teacher, drift and optimizer hooks."""

    settings: AuditSettings
    pad_id: int
    score: Score | None
    drift: Drift | None
    adam_moments: Callable[[], dict[str, Any]] | None
    budget: DecisionBudget | None
    clock: Callable[[], float]


def build_audit_job(inputs: AuditInputs, spend: Spend, audit_id: int, version: int,
                    probes: Sequence[Probe]) -> tuple[AuditJob, float, dict[str, float]]:
    """The audit of ``probes`` under weights ``version``: the job, its prompt + response tokens and the drift
    diagnostics' metrics. The teacher scores every probe no teacher stage scored; the drift diagnostics read a
    sample of one batch of P of a pooled group (telemetry: the same curves at 1/k the cost)."""
    clock, budget = inputs.clock, inputs.budget
    t0 = clock()
    batch = probe_batch(probes, inputs.pad_id, inputs.score)
    tokens = float(batch.attention_mask.sum())  # prompt + response tokens of every probe
    seconds = clock() - t0
    spend(lambda b: b.record_decision("scoring", tokens, seconds))
    rows = budget.drift_rows(len(probes)) if budget is not None else len(probes)
    m: dict[str, float] = {}
    t0 = clock()
    if inputs.drift is not None:
        m = inputs.drift(batch.input_ids[:rows], batch.attention_mask[:rows], batch.response_mask[:rows],
                         [p.route for p in probes[:rows]])
    if budget is not None and budget.drift:  # charged where the drift runs on another rank too
        drift = (float(batch.attention_mask[:rows].sum()), clock() - t0)
        spend(lambda b: b.record_decision("drift", *drift))
    job = AuditJob(audit_id, version, batch, inputs.settings,
                   adam_moments=inputs.adam_moments() if inputs.adam_moments is not None else None)
    return job, tokens, m


@dataclass
class DecisionRecord:
    """The accepted audits' bookkeeping. ``window``: the window in use (the loops set it each step), against which
    ``window/changes_per_audit`` counts the audits whose decision differed, over all decisions."""

    counts: dict[str, int]  # the client's counters: ``audits`` grows here
    window: int | None = None
    decisions: int = 0
    changes: int = 0
    audit_s: float = 0.0
    last_cosines: dict[int, float] = field(default_factory=dict)
    last_out: AuditOut | None = None  # the controller's answer to the last audit submitted

    def record(self, p: Pending, outcome: AuditOutcome, out: AuditOut, version: int, *,
               schedule: AuditSchedule | None, spend: Spend) -> dict[str, float]:
        """Count an accepted audit, feed the schedule, follow the controller's decision; the ``audit/*`` metrics."""
        res = outcome.result
        self.counts["audits"] += 1
        self.counts["audited"] += len(p.staleness)  # one staleness per probe the audit read
        self.last_out = out
        self.audit_s += res.elapsed_s
        spend(lambda b: b.record_seconds("audit", res.elapsed_s))
        self.last_cosines = dict(out.cosines or res.cosines)
        m = {"audit/submitted": 1.0, "audit/id": float(p.audit_id), "audit/time": res.elapsed_s,
             "audit/staleness_max": float(max(p.staleness)), "audit/staleness_mean": float(np.mean(p.staleness)),
             "audit/probe_tokens": p.probe_tokens}
        m |= outcome.is_metrics | lag_metrics(outcome, version)
        m |= {f"audit/micro_cos_{c}": v for c, v in res.cosines.items()}
        m |= {f"audit/macro_cos_{c}": v for c, v in res.macro_cosines.items()}
        m |= res.metrics()
        if schedule is not None:
            schedule.record(res.cosines)
        if "signal_z" in res.extra:  # the audit measured its evidence: size the next decision's to it
            spend(lambda b: _size_evidence(b, res.extra))
        if out.decision is not None:
            m["audit/next_window"] = float(out.decision.window)
            m["audit/unresolved"] = float(out.decision.reason == "unresolved")
            self.decisions += 1
            self.changes += int(out.decision.window != self.window)
            self.window = out.decision.window  # a later audit collected in this step compares with it
            m["window/changes_per_audit"] = self.changes / self.decisions
        return m


def _size_evidence(budget: DecisionBudget, extra: dict[str, float]) -> None:
    if budget.sizer is not None:
        budget.sizer.observe(extra.get("noise_scale"), extra.get("effective_dim"))
