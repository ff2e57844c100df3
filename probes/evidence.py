"""The audits a decision reads together (``audit.evidence_audits``): the probe client keeps the per-sample vectors of
its last audits and hands the controller the estimators of their weighted pool (``adwin.audit.evidence``).

Kept in memory only: a resumed run starts its pool afresh with its first audit. An audit older than the staleness
limit ``S`` (in weights versions) leaves the pool whatever ``evidence_audits`` says.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from adwin.audit.alignment import AuditResult
from adwin.audit.evidence import pool_evidence


@dataclass
class EvidencePool:
    audits: int  # audit.evidence_audits: this audit and up to audits - 1 earlier ones
    decay: float  # audit.evidence_decay: an earlier sample's weight per weights version of age
    max_age: int  # the staleness limit S
    estimator: str = "batch"
    level: float | None = None
    n_boot: int = 200
    seed: int = 0
    history: deque[tuple[np.ndarray, int]] = field(default_factory=deque)  # (vectors (P, K+1, D), version)

    def apply(self, result: AuditResult, version: int) -> AuditResult:
        """``result`` with its cosines, intervals, noise floor and signal z read from the pool it now closes."""
        if result.vectors is None:
            return result
        self.history.append((result.vectors, int(version)))
        while len(self.history) > self.audits or version - self.history[0][1] > self.max_age:
            self.history.popleft()
        if len(self.history) == 1:
            return result
        ev = pool_evidence([v for v, _ in self.history], [version - w for _, w in self.history], self.decay,
                           result.candidates, estimator=self.estimator, level=self.level, n_boot=self.n_boot,
                           seed=self.seed + int(version))
        extra = dict(result.extra) | {"signal_z": ev.signal_z, "evidence_samples": float(ev.samples),
                                      "evidence_audits": float(len(self.history))}
        if self.estimator == "debiased":
            extra["debiased_fallbacks"] = float(ev.fallbacks)
        return dataclasses.replace(result, cosines=ev.cosines, cosine_ci=ev.cosine_ci, noise_floor=ev.noise_floor,
                                   batch_cosines=ev.batch_cosines if self.estimator != "batch" else {}, extra=extra)
