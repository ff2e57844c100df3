"""Evidence pooled across audits (``audit.evidence_audits``, ``audit.evidence_decay``; math layer, numpy only).

One probe batch of ``P`` samples can carry too little evidence to decide on (at ``P = 2`` the full-gradient signal z
of ``adwin.audit.truth.signal_z`` is +-1 whatever the gradients, so ``window.noise_hold`` never moves the window).
A decision may therefore read the samples of the last ``n`` audits together: each earlier sample's segment vectors
are weighted by ``decay ** age`` (``age``: optimizer steps between its audit's weights and the newest), and every
estimator is computed on the weighted pool exactly as on one batch. Weighting a vector by ``w_i`` weights its
pairs by ``w_i w_j`` and its own Gram by ``w_i^2``, so the debiased estimator still drops each sample's own
terms. The vectors are the audit's per-sample CountSketches (``audit.ci_level``'s), so pooled cosines carry the
sketch's error (``1 / sqrt(sketch_dim)``, 0.008 at the default 16,384) where one batch's come from its exact Gram.
docs/decisions.md, "The shortest admissible window".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adwin.audit.estimators import cosine_interval, cross_gram, estimator_cosines
from adwin.audit.truth import noise_floor, noise_scale, per_sample_grams, signal_z


@dataclass(frozen=True)
class PooledEvidence:
    cosines: dict[int, float]
    batch_cosines: dict[int, float]
    cosine_ci: dict[int, tuple[float, float]]
    noise_floor: dict[int, float]
    signal_z: float
    fallbacks: int
    samples: int
    measures: dict[str, float]  # signal_measures: what the policy judges resolution on


def signal_measures(h: np.ndarray) -> dict[str, float]:
    """What decides whether samples resolve the full gradient's signal (``adwin.policies.resolution``), from their
    (N, K+1, N, K+1) cross Gram: ``signal_z``, ``evidence_samples`` N, and, where finite, the ``noise_scale`` B
    and ``effective_dim`` (``adwin.audit.truth.noise_scale``; B is infinite where the samples show no mean, and
    their z is then <= 0)."""
    scale, dim = noise_scale(h) if h.shape[0] >= 2 else (float("inf"), float("nan"))
    out = {"signal_z": signal_z(h), "evidence_samples": float(h.shape[0])}
    return out | {k: v for k, v in (("noise_scale", scale), ("effective_dim", dim)) if np.isfinite(v)}


def pool_evidence(vectors: Sequence[np.ndarray], ages: Sequence[int], decay: float, candidates: Sequence[int], *,
                  estimator: str, level: float | None, n_boot: int = 200, seed: int = 0) -> PooledEvidence:
    """Every estimator of the audit on the pooled samples: ``vectors[a]`` is audit ``a``'s (P_a, K+1, D) per-sample
    vectors, ``ages[a]`` its age in optimizer steps (0: the newest)."""
    if len(vectors) != len(ages) or not vectors:
        raise ValueError("pool_evidence needs one age per audit's vectors, and at least one audit")
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"audit.evidence_decay must be in (0, 1], got {decay}")
    v = np.concatenate([np.asarray(x, dtype=np.float64) * decay ** max(int(a), 0)
                        for x, a in zip(vectors, ages, strict=True)])  # (N, K+1, D)
    return evidence_of_gram(cross_gram(v), candidates, estimator=estimator, level=level, n_boot=n_boot, seed=seed)


def evidence_of_gram(h: np.ndarray, candidates: Sequence[int], *, estimator: str, level: float | None,
                     n_boot: int = 200, seed: int = 0) -> PooledEvidence:
    """The estimators of one (weighted) pool from its (N, K+1, N, K+1) cross Gram: cosines (the debiased ones
    falling back to the batch's where undefined), the batch cosines, the bootstrap interval at ``level`` (None:
    none), the noise floor (0 for the debiased estimator) and the signal z."""
    cands = [int(c) for c in candidates]
    k = len(cands)
    gram = h.sum(axis=(0, 2))  # (K+1, K+1)
    own = per_sample_grams(h)  # (N, K+1, K+1)
    cos, bat, fell = estimator_cosines(gram, gram - own.sum(0), k, estimator)
    fallbacks = int(fell.sum())
    cosines = {c: float(x) for c, x in zip(cands, cos, strict=True)}
    ci = cosine_interval(h, cands, cosines, estimator=estimator, level=level, n_boot=n_boot, seed=seed) \
        if level is not None else {}
    floor = noise_floor(own, k) if estimator == "batch" else np.zeros(k)
    return PooledEvidence(cosines, {c: float(x) for c, x in zip(cands, bat, strict=True)}, ci,
                          {c: float(x) for c, x in zip(cands, floor, strict=True)}, signal_z(h), fallbacks,
                          int(h.shape[0]), signal_measures(h))
