"""The audits a decision reads together (``audit.evidence_audits``): the probe client keeps the per-sample vectors of
its last audits and hands the controller the estimators of their weighted pool (``adwin.audit.evidence``).

Kept in memory only: a resumed run starts its pool afresh with its first audit. An audit whose weights are more than
the staleness limit ``S`` versions behind the learner's current weights leaves the pool whatever
``evidence_audits`` says, so no pooled sample rests on weights older than a probe may be.

A pool holds vectors of one kind only: an audit whose settings make different vectors (candidates, method, metric,
sketch width or seed, parameters, IS weights) empties the pool first, with a warning, since the vectors of two hash
seeds have no inner product worth reading and two sketch widths none at all. A change in how the pool is read
(audits, decay, estimator, interval level or resamples) applies to the vectors already kept.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adwin.audit.alignment import AuditResult
from adwin.audit.evidence import pool_evidence
from adwin.audit.job import AuditSettings

log = logging.getLogger(__name__)

# The AuditSettings fields that decide what an audit's per-sample vectors are.
VECTOR_FIELDS: tuple[str, ...] = ("candidates", "method", "metric", "sketch_dim", "seed", "params", "is_method",
                                  "is_low", "is_high", "is_level")


@dataclass
class EvidencePool:
    audits: int  # audit.evidence_audits: this audit and up to audits - 1 earlier ones
    decay: float  # audit.evidence_decay: an earlier sample's weight per weights version of age
    max_age: int  # the staleness limit S, against the learner's current version
    estimator: str = "batch"
    level: float | None = None
    n_boot: int = 200
    seed: int = 0
    vectors_of: dict[str, Any] = field(default_factory=dict)  # VECTOR_FIELDS of the audits it holds
    history: deque[tuple[np.ndarray, int]] = field(default_factory=deque, compare=False)  # (vectors (P, K+1, D),
    # the audit's weights version)

    @classmethod
    def of(cls, s: AuditSettings, max_age: int) -> EvidencePool:
        return cls(s.evidence_audits, s.evidence_decay, max_age, s.estimator, s.ci_level, s.ci_samples, s.seed,
                   {f: _frozen(getattr(s, f)) for f in VECTOR_FIELDS})

    def apply(self, result: AuditResult, version: int, learner_version: int | None = None) -> AuditResult:
        """``result`` (an audit under weights ``version``) with its cosines, intervals, noise floor and signal z read
        from the pool it now closes; earlier audits more than S versions behind ``learner_version`` (default:
        ``version``) leave it first."""
        if result.vectors is None:
            return result
        now = int(version if learner_version is None else learner_version)
        if self.history and self.history[-1][0].shape[1:] != result.vectors.shape[1:]:
            log.warning("evidence pool: audit vectors of shape %s after %s; the %d earlier audits are dropped",
                        result.vectors.shape[1:], self.history[-1][0].shape[1:], len(self.history))
            self.history.clear()
        self.history.append((result.vectors, int(version)))
        while len(self.history) > self.audits or (len(self.history) > 1 and now - self.history[0][1] > self.max_age):
            self.history.popleft()
        if len(self.history) == 1:
            return result
        ev = pool_evidence([v for v, _ in self.history], [version - w for _, w in self.history], self.decay,
                           result.candidates, estimator=self.estimator, level=self.level, n_boot=self.n_boot,
                           seed=self.seed + int(version))
        stale = ("noise_scale", "effective_dim")  # this audit's alone: the pool's replace them, or are infinite
        extra = {k: v for k, v in result.extra.items() if k not in stale} | ev.measures \
            | {"evidence_audits": float(len(self.history))}
        if self.estimator == "debiased":
            extra["debiased_fallbacks"] = float(ev.fallbacks)
        return dataclasses.replace(result, cosines=ev.cosines, cosine_ci=ev.cosine_ci, noise_floor=ev.noise_floor,
                                   batch_cosines=ev.batch_cosines if self.estimator != "batch" else {}, extra=extra)


def evidence_pool(pool: EvidencePool | None, s: AuditSettings | None, max_age: int) -> EvidencePool | None:
    """The pool an audit run with ``s`` closes: ``pool`` itself while ``s`` reads it as it does; one reading the kept
    vectors the new way when only how they are read changed; an empty one (the old evidence dropped, with a
    warning) when ``s`` makes other vectors. None when ``s`` pools nothing (``evidence_audits`` 1)."""
    if s is None or s.evidence_audits <= 1:
        return None
    new = EvidencePool.of(s, max_age)
    if pool is None or pool == new:
        return pool or new
    changed = sorted(f for f in VECTOR_FIELDS if pool.vectors_of.get(f) != new.vectors_of[f])
    if changed:
        if pool.history:
            log.warning("evidence pool: the audit settings %s changed, so its vectors are another kind; the %d "
                        "earlier audits are dropped", ", ".join(changed), len(pool.history))
        return new
    log.info("evidence pool: read with new settings (%s)", ", ".join(
        f.name for f in dataclasses.fields(EvidencePool) if f.compare and getattr(pool, f.name) != getattr(new, f.name)))
    new.history = pool.history
    return new


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
