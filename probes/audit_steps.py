"""Two steps of ``ProbeClient``'s audit path, apart so the client reads as the conversation it is:
``build_audit_job`` (a ready group of probes -> the probe batch, the teacher's scoring, the drift sample,
the ``AuditJob``, each charged to the decision budget) and ``record_outcome`` (an audit the controller
accepted -> the client's state and the step's ``audit/*`` metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from adwin.audit.budget import DecisionBudget
from adwin.audit.job import AuditJob, AuditOutcome, lag_metrics
from adwin.controller.schemas import AuditOut
from adwin.probes.auditors import _Pending
from adwin.probes.pool import Probe, probe_batch

if TYPE_CHECKING:
    from adwin.probes.client import ProbeClient


def build_audit_job(client: ProbeClient, audit_id: int, version: int,
                    probes: Sequence[Probe]) -> tuple[AuditJob, float, dict[str, float]]:
    """The audit of ``probes`` under weights ``version``: the job, its prompt + response tokens and the drift
    diagnostics' metrics. The teacher scores every probe no teacher stage scored; the drift diagnostics read a
    sample of one batch of P of a pooled group (telemetry: the same curves at 1/k the cost)."""
    assert client.settings is not None  # the client audits only with settings
    t0 = client.clock()
    batch = probe_batch(probes, client.pad_id, client.score)
    tokens = float(batch.attention_mask.sum())  # prompt + response tokens of every probe
    seconds = client.clock() - t0
    client._spend(lambda b: b.record_decision("scoring", tokens, seconds))
    rows = client.budget.drift_rows(len(probes)) if client.budget is not None else len(probes)
    m: dict[str, float] = {}
    t0 = client.clock()
    if client.drift is not None:
        m = client.drift(batch.input_ids[:rows], batch.attention_mask[:rows], batch.response_mask[:rows],
                         [p.route for p in probes[:rows]])
    if client.budget is not None and client.budget.drift:  # charged where the drift runs on another rank too
        drift = (float(batch.attention_mask[:rows].sum()), client.clock() - t0)
        client._spend(lambda b: b.record_decision("drift", *drift))
    job = AuditJob(audit_id, version, batch, client.settings,
                   adam_moments=client.adam_moments() if client.adam_moments is not None else None)
    return job, tokens, m


def record_outcome(client: ProbeClient, p: _Pending, outcome: AuditOutcome, out: AuditOut,
                   version: int) -> dict[str, float]:
    """Count an accepted audit, feed the schedule, follow the controller's decision; the ``audit/*`` metrics."""
    res = outcome.result
    client.counts["audits"] += 1
    client.last_out = out
    client.audit_s += res.elapsed_s
    client._spend(lambda b: b.record_seconds("audit", res.elapsed_s))
    client.last_cosines = dict(out.cosines or res.cosines)
    m = {"audit/submitted": 1.0, "audit/id": float(p.audit_id), "audit/time": res.elapsed_s,
         "audit/staleness_max": float(max(p.staleness)), "audit/staleness_mean": float(np.mean(p.staleness)),
         "audit/probe_tokens": p.probe_tokens}
    m |= outcome.is_metrics | lag_metrics(outcome, version)
    m |= {f"audit/micro_cos_{c}": v for c, v in res.cosines.items()}
    m |= {f"audit/macro_cos_{c}": v for c, v in res.macro_cosines.items()}
    m |= res.metrics()
    if client.schedule is not None:
        client.schedule.record(res.cosines)
    if "signal_z" in res.extra:  # the audit measured its evidence: size the next decision's to it
        client._spend(lambda b: _size_evidence(b, res.extra))
    if out.decision is not None:
        m["audit/next_window"] = float(out.decision.window)
        m["audit/unresolved"] = float(out.decision.reason == "unresolved")
        client.decisions += 1
        client.changes += int(out.decision.window != client.window)
        client.window = out.decision.window  # a later audit collected in this step compares with it
        m["window/changes_per_audit"] = client.changes / client.decisions
    return m


def _size_evidence(budget: DecisionBudget, extra: dict[str, float]) -> None:
    if budget.sizer is not None:
        budget.sizer.observe(extra.get("noise_scale"), extra.get("effective_dim"))
