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

Confidence (:func:`cosine_ci`), from per-sample segment vectors ``v_is`` (exact flattened gradients for
``reference``, CountSketches for ``fast``/``sketch``) through their cross Gram ``H[i, s, j, t] = <v_is, v_jt>``,
which gives any statistic of the batch without touching the model again:

- ``debiased``: a U-statistic interval. The cosine is a smooth function of three U-statistics of degree 2 (the
  cross term and the two squared norms), so to first order it moves as one U-statistic whose kernel
  ``L_ij = sum_st M[s, t] H[i, s, j, t]`` is their gradient-weighted sum. Its variance
  ``4 (N-2) / (N (N-1)) zeta_1 + 2 / (N (N-1)) zeta_2`` is estimated without bias from the pairs, triples and
  quadruples of distinct samples, and the interval is the reported cosine ``+- t_{N-1} * se``. A bootstrap over
  samples cannot get the second term right: keeping the pairs of a sample with its own copies
  (``w_i (w_i - 1) H_ii``) puts same-sample noise back into every replicate, which then reads nearly the batch Gram
  and under-covers; dropping them (``w_i^2 H_ii``) counts ``zeta_2`` three times and over-covers.
- ``batch``: the percentile bootstrap over probe samples, multinomial counts ``w`` (``sum w = P``) giving
  ``G* = sum_{ij} w_i w_j H_ij``; the interval is the reported cosine plus the quantiles of
  ``cos* - median(cos*)``. The batch Gram is a V-statistic, for which the plain bootstrap is the right one.

Either interval always contains the reported cosine, so neither a sketch's projection error nor a resampling
shift can move it off (docs/decisions.md, "Audit cosine confidence").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from scipy import stats

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


def cosine_interval(
    h: np.ndarray,
    candidates: Sequence[int],
    cosines: dict[int, float],
    *,
    estimator: str = "batch",
    level: float = 0.9,
    n_boot: int = 200,
    seed: int = 0,
) -> dict[int, tuple[float, float]]:
    """Two-sided ``level`` interval per candidate cosine (the module docstring says which for each estimator).

    h: the (P, K+1, P, K+1) cross Gram (:func:`cross_gram`) of the per-sample segment vectors. ``cosines`` are the
    reported point estimates, which the interval is placed on. ``n_boot`` and ``seed``: the batch estimator's
    bootstrap (the debiased interval draws nothing).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"audit.estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"audit.ci_level must be in (0, 1), got {level}")
    if n_boot < 10:
        raise ValueError(f"audit.ci_samples must be >= 10, got {n_boot}")
    k = len(candidates)
    if h.shape[1] != k + 1:
        raise ValueError(f"per-sample vectors have {h.shape[1]} segments, {k} candidates need {k + 1}")
    h = np.asarray(h, dtype=np.float64)
    if estimator == "debiased":
        half = _debiased_half_widths(h, k, level)  # (K,): inf where the pool cannot bound the cosine
        lows, highs = -half, half
    else:
        lows, highs = _bootstrap_offsets(h, k, level, n_boot, seed)
    out: dict[int, tuple[float, float]] = {}
    for i, c in enumerate(candidates):
        base = float(cosines[int(c)])
        out[int(c)] = (float(np.clip(base + lows[i], -1.0, 1.0)), float(np.clip(base + highs[i], -1.0, 1.0)))
    return out


def _debiased_half_widths(h: np.ndarray, k: int, level: float) -> np.ndarray:
    """(K,) ``t_{N-1, (1+level)/2} * se`` of each debiased cosine (delta method on the U-statistics, unbiased
    variance); inf where there is none: fewer than 4 samples, no defined cosine, or a variance estimate <= 0."""
    n = h.shape[0]
    if n < 4:  # the unbiased variance needs quadruples of distinct samples
        return np.full(k, np.inf)
    own = np.einsum("isit->ist", h)  # (N, S, S): per-sample Grams
    pairs = n * (n - 1)
    cross, a, f = prefix_terms((h.sum(axis=(0, 2)) - own.sum(0)) / pairs, k)  # each (K,): per-pair means
    ok = (a > 0) & (f > 0)
    a_, f_ = np.where(ok, a, 1.0), np.where(ok, f, 1.0)
    cos = cross / np.sqrt(a_ * f_)  # (K,)
    pref = np.tril(np.ones((k, k + 1)), k=0)  # (K, S): row c selects segments 0..c
    one = np.ones(k + 1)  # (S,)
    # d cos = dC / sqrt(AF) - cos/2 (dA / A + dF / F): the gradient as a weighting of the Gram's entries
    m = ((pref[:, :, None] * one + one[:, None] * pref[:, None, :]) / (2.0 * np.sqrt(a_ * f_))[:, None, None]
         - (cos / 2.0)[:, None, None] * (pref[:, :, None] * pref[:, None, :] / a_[:, None, None]
                                         + 1.0 / f_[:, None, None]))  # (K, S, S)
    kern = np.einsum("kst,isjt->kij", m, h)  # (K, N, N): the linearised cosine's pair kernel
    kern[:, np.arange(n), np.arange(n)] = 0.0
    var = ustat_variance(kern)  # (K,)
    q = float(stats.t.ppf(0.5 + level / 2.0, n - 1))
    return np.where(ok & (var > 0), q * np.sqrt(np.where(var > 0, var, 0.0)), np.inf)


def ustat_variance(kern: np.ndarray) -> np.ndarray:
    """Unbiased variance of ``U = mean_{i != j} kern_ij`` from (..., N, N) symmetric kernels with a zero diagonal
    (N >= 4): ``4 (N-2) / (N (N-1)) (T - Q) + 2 / (N (N-1)) (P - Q)`` with ``P``, ``T``, ``Q`` the means of
    ``kern_ij^2``, ``kern_ij kern_ik`` and ``kern_ij kern_kl`` over distinct indices."""
    n = kern.shape[-1]
    total = kern.sum(axis=(-1, -2))
    rows = kern.sum(axis=-1)  # (..., N)
    sq_rows = (rows * rows).sum(axis=-1)
    sq = (kern * kern).sum(axis=(-1, -2))
    p = sq / (n * (n - 1))
    t = (sq_rows - sq) / (n * (n - 1) * (n - 2))
    q = (total * total - 4.0 * sq_rows + 2.0 * sq) / (n * (n - 1) * (n - 2) * (n - 3))
    return 4.0 * (n - 2) / (n * (n - 1)) * (t - q) + 2.0 / (n * (n - 1)) * (p - q)


def _bootstrap_offsets(h: np.ndarray, k: int, level: float, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) offsets, each (K,), of the batch cosine's percentile bootstrap: the quantiles of
    ``cos* - median(cos*)``; (-inf, inf) where more than the tail share of replicates has no defined cosine."""
    p = h.shape[0]
    rng = np.random.default_rng(seed)
    w = rng.multinomial(p, np.full(p, 1.0 / p), size=n_boot).astype(np.float64)  # (B, P)
    cos_star, ok_star = cosine_array(np.einsum("bi,bj,isjt->bst", w, w, h), k)  # (B, K)
    alpha = (1.0 - level) / 2.0
    lows, highs = np.full(k, -np.inf), np.full(k, np.inf)
    for i in range(k):
        # A replicate without a defined cosine is as uncertain as it gets: it widens the interval to [-1, 1].
        if (~ok_star[:, i]).mean() > alpha:
            continue
        d = cos_star[ok_star[:, i], i]
        lows[i], highs[i] = np.quantile(d - np.median(d), [alpha, 1.0 - alpha])
    return lows, highs
