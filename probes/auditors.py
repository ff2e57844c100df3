"""Where a probe client's audits run (``AuditRunner``: a probe executor's workers or ``InlineAuditor`` on the
learner's model), an audit in flight (``Pending``), and how two parts of one extension ``advance`` combine."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from adwin.audit.job import AuditJob, AuditOutcome, run_audit_job
from adwin.probes.async_executor import AdvanceStats
from adwin.probes.workers import run_now

# drift/* diagnostics of an audited batch, from (input_ids, attention_mask, response_mask, routes)
Drift = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list[str]], dict[str, float]]


class AuditRunner(Protocol):
    """Where audits run: a probe executor (its workers' replicas) or ``InlineAuditor`` (the learner's model)."""

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]: ...


@dataclass
class InlineAuditor:
    """Runs an audit at once on ``model`` (the learner's live weights: call it between updates)."""

    model: torch.nn.Module
    optimizer: Any = None  # the learner's AdamW, read by metric="adam"

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        return run_now(lambda: run_audit_job(self.model, job, self.optimizer))  # a failure comes back in the future


@dataclass
class Pending:
    audit_id: int
    version: int  # the weights version the audit runs under
    staleness: list[int]
    probe_tokens: float
    future: Future[AuditOutcome]


def merged(a: AdvanceStats, b: AdvanceStats) -> AdvanceStats:
    """Two parts of one ``advance`` (the rounds collected before the plan, then the plan's) as one."""
    out = AdvanceStats(reports=a.reports + b.reports)
    for k, v in vars(b).items():
        if k not in ("reports", "staleness"):
            setattr(out, k, v if k in ("active", "in_flight") else getattr(a, k) + v)
    return out
