"""Cosine estimators (``batch`` | ``debiased``) and their bootstrap confidence intervals.

Math layer (numpy only). Notation: probe samples ``i = 1..P``, segment ``s``, per-sample segment gradient
``g_is``; the batch gradient of segment ``s`` is ``g_s = sum_i g_is``; ``mu_s = E[g_is]``.

- ``batch``: the cosine of the batch Gram ``G = sum_{i,j} <g_is, g_jt>``. Its expectation is
  ``P(P-1) <mu_s, mu_t> + P E<g_is, g_it>``: the same-sample term is sampling noise that does not shrink
  relative to the signal until ``P`` is large, so the batch cosine is biased (low, for a prefix and a full
  gradient whose noise is not shared) and its meaning changes with the probe batch size.
- ``debiased``: ``D = G - sum_i G_i`` with ``G_i = <g_is, g_it>`` the per-sample Gram keeps only the
  cross-sample pairs, a U-statistic: ``E[D] = P(P-1) <mu_s, mu_t>`` exactly. Its cosine is a ratio of
  unbiased estimates (consistent, not unbiased). ``D`` need not be positive semi-definite: at small P a
  prefix's squared norm estimate can be <= 0, where no cosine exists. There the candidate falls back to the
  batch cosine and is counted (``AuditResult.extra["debiased_fallbacks"]``); a ratio outside [-1, 1] is
  clipped. See docs/decisions.md ("Debiased audit cosine").

Confidence: the percentile bootstrap over probe samples. From per-sample segment vectors ``v_is`` (exact
flattened gradients for ``reference``, CountSketches for ``fast``/``sketch``) the cross Gram
``H[i, s, j, t] = <v_is, v_jt>`` gives any resampled batch's Gram without touching the model again: with
multinomial counts ``w`` (``sum w = P``), ``G* = sum_{ij} w_i w_j H_ij`` and ``D* = G* - sum_i w_i H_ii``.
The interval is the reported cosine plus the quantiles of ``cos* - median(cos*)``: the bootstrap's shape
around its own centre. Centring on the bootstrap median rather than on ``cos(H)`` drops the resampling
shift (duplicated samples add same-sample terms to ``G*``, so ``cos*`` is biased against the estimate), and
neither a sketch's projection error nor that shift can move the interval off the reported cosine, which
always lies inside it (docs/decisions.md, "Audit cosine confidence").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

log = logging.getLogger(__name__)

ESTIMATORS: tuple[str, ...] = ("batch", "debiased")


def prefix_terms(gram: np.ndarray, n_cands: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(<g_w, g_full>, |g_w|^2, |g_full|^2)`` per candidate from a (..., K+1, K+1) Gram; each (..., K)."""
    g = np.asarray(gram, dtype=np.float64)
    k = n_cands
    pref = np.tril(np.ones((k, k + 1)), k=0)  # (K, K+1): row c selects segments 0..c
    cross = np.einsum("cs,...st->...c", pref, g)  # (..., K): P_c^T G 1
    pref_sq = np.einsum("cs,...st,ct->...c", pref, g, pref)  # (..., K)
    full_sq = g.sum(axis=(-1, -2))[..., None] * np.ones(k)  # (..., K)
    return cross, pref_sq, full_sq


def cosine_array(gram: np.ndarray, n_cands: int) -> tuple[np.ndarray, np.ndarray]:
    """(cosines, defined) per candidate, each (..., K): a cosine is defined where both squared norms are > 0."""
    cross, pref_sq, full_sq = prefix_terms(gram, n_cands)
    defined = (pref_sq > 0) & (full_sq > 0)
    denom = np.sqrt(np.where(defined, pref_sq * full_sq, 1.0))
    return np.where(defined, np.clip(cross / denom, -1.0, 1.0), 0.0), defined


def debiased_gram(gram: np.ndarray, sample_grams: Sequence[np.ndarray]) -> np.ndarray:
    """Batch Gram minus the per-sample Grams: only cross-sample pairs, ``E = P(P-1) <mu_s, mu_t>``."""
    if len(sample_grams) < 2:
        raise ValueError(f"audit.estimator=debiased needs >= 2 probe samples, got {len(sample_grams)}")
    return np.asarray(gram, dtype=np.float64) - np.sum(np.asarray(sample_grams, dtype=np.float64), axis=0)


def estimator_cosines(gram: np.ndarray, debiased: np.ndarray | None, n_cands: int,
                      estimator: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cosines, batch cosines, fell back) per candidate, each (K,), from the batch Gram and the cross-sample Gram
    (:func:`debiased_gram`; unused for ``batch``): the debiased estimator falls back to the batch cosine where it
    has no defined cosine."""
    bat, _ = cosine_array(np.asarray(gram, dtype=np.float64), n_cands)
    if estimator != "debiased":
        return bat, bat, np.zeros(n_cands, dtype=bool)
    deb, ok = cosine_array(debiased, n_cands)
    return np.where(ok, deb, bat), bat, ~ok


def debiased_cosines(
    gram: np.ndarray, sample_grams: Sequence[np.ndarray], candidates: Sequence[int]
) -> tuple[dict[int, float], int]:
    """Debiased cosine per candidate and how many fell back to the batch cosine (no defined debiased one)."""
    k = len(candidates)
    cos, _, fell = estimator_cosines(gram, debiased_gram(gram, sample_grams), k, "debiased")
    out = {int(c): float(cos[i]) for i, c in enumerate(candidates)}
    fallbacks = int(fell.sum())
    if fallbacks:
        log.warning(
            "debiased audit: %d of %d candidates have a non-positive cross-sample norm estimate (probe batch "
            "of %d too small for the noise); they use the batch cosine. Raise probes.batch_size to avoid it",
            fallbacks, k, len(sample_grams),
        )
    return out, fallbacks


def cross_gram(vectors: np.ndarray) -> np.ndarray:
    """(P, K+1, D) per-sample segment vectors -> (P, K+1, P, K+1) ``H[i, s, j, t] = <v_is, v_jt>``."""
    v = np.asarray(vectors, dtype=np.float64)
    if v.ndim != 3:
        raise ValueError(f"per-sample vectors must be (P, K+1, D), got shape {v.shape}")
    p, s, d = v.shape
    flat = v.reshape(p * s, d)
    return (flat @ flat.T).reshape(p, s, p, s)


def bootstrap_ci(
    h: np.ndarray,
    candidates: Sequence[int],
    cosines: dict[int, float],
    *,
    estimator: str = "batch",
    level: float = 0.9,
    n_boot: int = 200,
    seed: int = 0,
) -> dict[int, tuple[float, float]]:
    """Two-sided ``level`` interval per candidate cosine from a bootstrap over probe samples.

    h: the (P, K+1, P, K+1) cross Gram (:func:`cross_gram`) of the per-sample segment vectors. ``cosines`` are the
    reported point estimates (the interval is placed on them: ``cos + quantiles(cos* - median(cos*))``).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"audit.estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"audit.ci_level must be in (0, 1), got {level}")
    if n_boot < 10:
        raise ValueError(f"audit.ci_samples must be >= 10, got {n_boot}")
    p = h.shape[0]
    k = len(candidates)
    if h.shape[1] != k + 1:
        raise ValueError(f"per-sample vectors have {h.shape[1]} segments, {k} candidates need {k + 1}")
    rng = np.random.default_rng(seed)
    w = rng.multinomial(p, np.full(p, 1.0 / p), size=n_boot).astype(np.float64)  # (B, P)
    g_star = np.einsum("bi,bj,isjt->bst", w, w, h)  # (B, S, S)
    diag = np.einsum("isit->ist", h)  # (P, S, S): per-sample Grams
    if estimator == "debiased":
        g_star = g_star - np.einsum("bi,ist->bst", w, diag)
    cos_star, ok_star = cosine_array(g_star, k)  # (B, K)
    alpha = (1.0 - level) / 2.0
    out: dict[int, tuple[float, float]] = {}
    for i, c in enumerate(candidates):
        # A replicate without a defined cosine is as uncertain as it gets: it widens the interval to [-1, 1].
        if (~ok_star[:, i]).mean() > alpha:
            out[int(c)] = (-1.0, 1.0)
            continue
        d = cos_star[ok_star[:, i], i]
        lo, hi = np.quantile(d - np.median(d), [alpha, 1.0 - alpha])
        base = float(cosines[int(c)])
        out[int(c)] = (float(np.clip(base + lo, -1.0, 1.0)), float(np.clip(base + hi, -1.0, 1.0)))
    return out
