"""audit.evidence_audits: a decision reads the weighted pool of the last audits' per-sample vectors
(adwin.audit.evidence, probes/evidence.py)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from synthetic_pool import synthetic_vectors

from adwin.audit.alignment import AuditResult
from adwin.audit.estimators import cosine_array
from adwin.audit.evidence import pool_evidence
from adwin.audit.truth import signal_z
from adwin.config import load_config
from adwin.probes.evidence import EvidencePool

CANDS = [64, 128, 256, 512, 1024]
TOKENS = [64, 64, 128, 256, 512, 1024]


def _vectors(n: int, seed: int) -> np.ndarray:
    return synthetic_vectors(n, [0.9, 0.95, 0.97, 0.98, 0.99], signal=np.sqrt(2048 / 6), tokens=TOKENS, seed=seed)


def test_one_audit_reads_what_its_own_batch_reads() -> None:
    v = _vectors(8, 0)
    ev = pool_evidence([v], [0], 0.5, CANDS, estimator="batch", level=None)
    gram = np.einsum("isd,jtd->st", v, v)
    want, _ = cosine_array(gram, len(CANDS))
    np.testing.assert_allclose([ev.cosines[c] for c in CANDS], want, atol=1e-12)
    assert ev.samples == 8 and ev.cosine_ci == {}


def test_pooling_equals_one_batch_of_the_weighted_samples() -> None:
    v = _vectors(8, 1)
    a, b = v[:4], v[4:]
    ev = pool_evidence([a, b], [2, 0], 0.5, CANDS, estimator="debiased", level=0.9, n_boot=50)
    one = pool_evidence([np.concatenate([a * 0.25, b])], [0], 1.0, CANDS, estimator="debiased", level=0.9, n_boot=50)
    assert ev.cosines == pytest.approx(one.cosines) and ev.signal_z == pytest.approx(one.signal_z)
    assert ev.samples == 8


def test_more_samples_give_a_surer_signal() -> None:
    v = _vectors(12, 0)  # one population: six audits of two samples each
    vs = [v[2 * a:2 * a + 2] for a in range(6)]
    z_one = signal_z(np.einsum("isd,jtd->isjt", vs[-1], vs[-1]))
    assert abs(z_one) == pytest.approx(1.0)  # two samples: z is +-1 whatever they hold
    assert pool_evidence(vs, [5, 4, 3, 2, 1, 0], 1.0, CANDS, estimator="debiased", level=None).signal_z > 3


def _result(v: np.ndarray) -> AuditResult:
    gram = np.einsum("isd,jtd->st", v, v)
    cos, _ = cosine_array(gram, len(CANDS))
    return AuditResult(candidates=CANDS, cosines=dict(zip(CANDS, cos.tolist(), strict=True)), gram=gram,
                       vectors=v.astype(np.float32), extra={"samples": float(len(v))})


def test_the_pool_keeps_the_last_audits_within_the_staleness_limit() -> None:
    v = _vectors(10, 0)
    pool = EvidencePool(audits=3, decay=0.7, max_age=5, estimator="debiased", level=0.9, n_boot=50)
    first = pool.apply(_result(v[0:2]), version=1)
    assert "evidence_audits" not in first.extra  # alone: the audit as it was
    pool.apply(_result(v[2:4]), version=2)
    third = pool.apply(_result(v[4:6]), version=3)
    assert third.extra["evidence_audits"] == 3 and third.extra["evidence_samples"] == 6
    assert set(third.cosine_ci) == set(CANDS) and "signal_z" in third.extra
    fourth = pool.apply(_result(v[6:8]), version=4)
    assert fourth.extra["evidence_audits"] == 3  # the oldest left
    late = pool.apply(_result(v[8:10]), version=10)  # every earlier audit is older than S = 5
    assert "evidence_audits" not in late.extra


def test_the_config_refuses_evidence_settings_that_would_be_ignored() -> None:
    with pytest.raises(ValidationError, match="audit.evidence_audits"):
        load_config(None, {"audit.evidence_audits": 3, "audit.ci_level": None, "window.confidence": False})
    with pytest.raises(ValidationError, match="audit.evidence_decay"):
        load_config(None, {"audit.evidence_decay": 0.5})
    cfg = load_config(None, {"audit.evidence_audits": 3, "audit.ci_level": 0.9})
    assert cfg.audit.evidence_audits == 3


def test_an_audit_config_alone_refuses_pooling_it_could_not_do() -> None:
    """The generic recipe and the TRL callback validate an AuditConfig without a TrainConfig around it."""
    from adwin.config.sections import AuditConfig

    with pytest.raises(ValidationError, match="audit.ci_level"):
        AuditConfig(evidence_audits=3)
    with pytest.raises(ValidationError, match="audit.evidence_audits"):
        AuditConfig(evidence_decay=0.5)
    assert AuditConfig(evidence_audits=3, ci_level=0.9).evidence_audits == 3
