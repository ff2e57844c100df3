"""Audit truth: what a large pool of full rollouts says about each candidate window, and what a probe batch of
``P`` of them would read (math layer, numpy only).

Everything is read from one cross Gram ``H[i, s, j, t] = <v_is, v_jt>`` of per-sample segment vectors ``v_is``
(exact or CountSketched gradients of segment ``s`` of sample ``i``; ``adwin.audit.estimators.cross_gram``), so one
per-sample pass of the model answers every question below:

- the *population cosine* of each candidate: the debiased estimator (only cross-sample pairs, ``E = N(N-1)
  <mu_w, mu_F>``) on the whole pool, with its percentile-bootstrap interval;
- the *pure-noise reading* ``sqrt(N_w / N_F)``: what the batch cosine reads when the samples share no signal
  (``N_w``, ``N_F`` the same-sample energies of the prefix and the full response; ``noise_floor``), or its
  token-count form from the samples' response lengths alone (``token_floor``);
- the *noise scale* ``tr(Sigma) / |mu|^2`` of the full gradient and its effective dimension;
- what the batch and debiased estimators read at ``P`` samples (random subsets: mean, 10-90 %, the share at or
  above the threshold, debiased fallbacks);
- the *update view*: the cosine of an ``R``-rollout update on a window with the population full gradient
  (estimated from the rest of the pool, so no sample's own noise enters both sides).

``truth_window`` is the shortest candidate whose population cosine reaches the threshold (the horizon if none);
``identifiable`` says whether the pool sees the full gradient's mean at all (its signal z over the whole pool): where
it does not, the population cosines are undefined or noise and no window is the truth's;
``rung`` places a window on the ladder (candidates, then the horizon) so decisions are compared in rungs;
``split_pool`` halves a pool so the truth and the replay that is scored against it read disjoint samples.
docs/benchmarks.md, "Audit truth", has the tables these produce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adwin.audit.estimators import cosine_array, cosine_interval, estimator_cosines, prefix_terms


@dataclass(frozen=True)
class Reading:
    """An estimator's readings of one candidate over random probe batches."""

    mean: float
    q10: float
    q90: float
    share_admissible: float  # share of batches reading >= the threshold
    fallbacks: float = 0.0  # debiased only: share of batches with no defined debiased cosine (batch used)


def per_sample_grams(h: np.ndarray) -> np.ndarray:
    """(N, S, N, S) cross Gram -> (N, S, S) each sample's own Gram."""
    return np.einsum("isit->ist", h)


def subset_gram(h: np.ndarray, idx: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(S, S) batch Gram of the samples ``idx`` (optionally weighted: ``sum_ij w_i w_j H_ij``)."""
    sub = sub_pool(h, idx)  # (p, S, p, S)
    if weights is None:
        return sub.sum(axis=(0, 2))
    return np.einsum("i,j,isjt->st", weights, weights, sub)


def subset_debiased(h: np.ndarray, idx: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(S, S) cross-sample Gram of ``idx``: the batch Gram less each sample's own (weighted by ``w_i^2``)."""
    own = per_sample_grams(h)[idx]  # (p, S, S)
    w2 = np.ones(len(idx)) if weights is None else np.asarray(weights, dtype=np.float64) ** 2
    return subset_gram(h, idx, weights) - np.einsum("i,ist->st", w2, own)


def noise_floor(sample_grams: np.ndarray | Sequence[np.ndarray], n_cands: int) -> np.ndarray:
    """(K,) pure-noise reading ``sqrt(N_w / N_F)`` per candidate from per-sample Grams (P, S, S).

    With no shared signal the batch Gram is the sum of the per-sample Grams, and a prefix's noise is part of
    the full response's, so the batch cosine reads ``sum_i <g_iw, g_iF> / sqrt(sum_i |g_iw|^2 sum_i |g_iF|^2)``:
    this, from the same per-sample Grams the audit already computes."""
    own = np.sum(np.asarray(sample_grams, dtype=np.float64), axis=0)  # (S, S)
    cos, _ = cosine_array(own, n_cands)
    return cos


def token_floor(lengths: np.ndarray | Sequence[int], candidates: Sequence[int]) -> np.ndarray:
    """(K,) the pure-noise reading from token counts alone: ``sqrt(sum_i min(L_i, c) / sum_i L_i)`` per candidate
    ``c`` over the samples' response lengths ``L_i`` (a token's noise one unit: ``N_w`` and ``N_F`` as counts). It
    reads no gradient, so a rule deciding on it decides on the response lengths only."""
    lens = np.asarray(lengths, dtype=np.float64)  # (P,)
    full = float(lens.sum())
    if full <= 0:
        raise ValueError("token_floor needs at least one response token")
    return np.sqrt(np.array([np.minimum(lens, int(c)).sum() for c in candidates]) / full)


def split_pool(n: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint halves of a pool of ``n`` samples, (truth's, replay's): a seeded permutation, the truth's half
    taking the odd sample. Scoring a replay against the truth of the samples it read would reward the same-sample
    noise both share."""
    if n < 4:
        raise ValueError(f"splitting a pool needs at least 4 samples, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    cut = (n + 1) // 2
    return np.sort(order[:cut]), np.sort(order[cut:])


def sub_pool(h: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """(m, S, m, S) the cross Gram of the samples ``idx`` only."""
    return h[np.ix_(idx, np.arange(h.shape[1]), idx, np.arange(h.shape[3]))]


def signal_z(h: np.ndarray) -> float:
    """How surely the samples share a full-gradient signal: the cross-sample sum ``D_FF = sum_{i != j} <g_iF, g_jF>``
    over its standard error under no shared signal, ``sqrt(2 sum_{i != j} <g_iF, g_jF>^2)``.

    With no signal ``D_FF`` is a sum of symmetric, uncorrelated pair terms (mean 0), so ``z`` exceeds 3 about once
    in 700 audits; a shared direction adds ``P(P-1) |mu_F|^2``. An audit below the policy's ``window.signal_z``
    carries no information about any window (``window.noise_hold``)."""
    f = np.asarray(h, dtype=np.float64).sum(axis=(1, 3))  # (P, P): <g_iF, g_jF>
    off = ~np.eye(f.shape[0], dtype=bool)
    se = float(np.sqrt(2.0 * np.sum(f[off] ** 2)))
    return float(f[off].sum()) / se if se > 0 else 0.0


def debiased_population(h: np.ndarray, candidates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(cosines (K,), defined (K,)) of the debiased estimator on the whole pool."""
    idx = np.arange(h.shape[0])
    return cosine_array(subset_debiased(h, idx), len(candidates))


def population_interval(h: np.ndarray, candidates: Sequence[int], *, level: float = 0.9, n_boot: int = 200,
                        seed: int = 0) -> dict[int, tuple[float, float, float]]:
    """Per candidate: (population cosine, low, high), the interval of the bootstrap over the pool's samples.
    A candidate with no defined debiased cosine (no signal the pool can see) reads NaN."""
    cos, ok = debiased_population(h, candidates)
    point = {int(c): float(cos[k]) for k, c in enumerate(candidates)}
    ci = cosine_interval(h, candidates, point, estimator="debiased", level=level, n_boot=n_boot, seed=seed)
    return {int(c): (point[int(c)] if ok[k] else float("nan"), *ci[int(c)]) for k, c in enumerate(candidates)}


def noise_scale(h: np.ndarray) -> tuple[float, float]:
    """(``tr(Sigma) / |mu|^2``, effective dimension ``tr(Sigma)^2 / tr(Sigma^2)``) of the full gradient.

    ``|mu|^2`` is the cross-sample mean of ``<g_iF, g_jF>``; ``tr(Sigma)`` the mean ``|g_iF|^2`` less it;
    ``tr(Sigma^2)`` from the mean squared cross inner product of centred pairs (both unbiased up to O(1/N))."""
    f = h.sum(axis=(1, 3))  # (N, N): <g_iF, g_jF>
    n = f.shape[0]
    off = ~np.eye(n, dtype=bool)
    mu2 = float(f[off].mean())
    tr = float(np.diag(f).mean()) - mu2
    if mu2 <= 0:
        return float("inf"), float("nan")
    row = (f.sum(1) - np.diag(f)) / (n - 1)  # (N,): <g_iF, mean of the others> ~ <g_iF, mu>
    centred = f - row[:, None] - row[None, :] + mu2  # <g_i - mu, g_j - mu>
    tr_sq = float((centred[off] ** 2).mean())
    return tr / mu2, (tr * tr / tr_sq) if tr_sq > 0 else float("nan")


def readings_at(h: np.ndarray, candidates: Sequence[int], p: int, *, threshold: float, draws: int,
                rng: np.random.Generator) -> dict[str, list[Reading]]:
    """What the batch and debiased estimators read at ``p`` samples: ``{"batch": [...], "debiased": [...]}``
    (one ``Reading`` per candidate) over ``draws`` random subsets drawn without replacement."""
    n, k = h.shape[0], len(candidates)
    if not 2 <= p <= n:
        raise ValueError(f"a probe batch of {p} needs 2 <= P <= the pool's {n} samples")
    bat = np.empty((draws, k))
    deb = np.empty((draws, k))
    fell = np.zeros((draws, k), dtype=bool)
    for d in range(draws):
        idx = rng.choice(n, size=p, replace=False)
        g = subset_gram(h, idx)  # (K+1, K+1)
        deb[d], bat[d], fell[d] = estimator_cosines(g, g - per_sample_grams(h)[idx].sum(0), k, "debiased")
    return {"batch": _readings(bat, threshold), "debiased": _readings(deb, threshold, fell)}


def _readings(x: np.ndarray, threshold: float, fell: np.ndarray | None = None) -> list[Reading]:
    out = []
    for c in range(x.shape[1]):
        q10, q90 = np.quantile(x[:, c], [0.1, 0.9])
        out.append(Reading(float(x[:, c].mean()), float(q10), float(q90), float((x[:, c] >= threshold).mean()),
                           0.0 if fell is None else float(fell[:, c].mean())))
    return out


def update_view(h: np.ndarray, candidates: Sequence[int], r: int, *, draws: int,
                rng: np.random.Generator) -> list[float]:
    """Mean cosine of an ``r``-rollout update on each candidate window, and on the full response (last entry),
    with the population full gradient, estimated from the pool's other samples (K + 1 values)."""
    n, k = h.shape[0], len(candidates)
    if not 1 <= r < n - 1:
        raise ValueError(f"an update of {r} rollouts needs 1 <= R < the pool's {n} samples - 1")
    _, _, full_sq = prefix_terms(subset_debiased(h, np.arange(n)), k)
    mu_f = np.sqrt(max(float(full_sq[0]), 0.0)) / np.sqrt(n * (n - 1))  # |mu_F|
    pref = np.tril(np.ones((k + 1, k + 1)))  # (K+1, S): row c selects segments 0..c; the last row is the response
    out = np.zeros(k + 1)
    for _ in range(draws):
        perm = rng.permutation(n)
        upd, rest = perm[:r], perm[r:]
        cross = h[np.ix_(upd, np.arange(k + 1), rest, np.arange(k + 1))].sum(axis=(0, 2, 3))  # (S,): <g_s^R, sum g_F>
        own = subset_gram(h, upd)  # (S, S)
        num = pref @ cross  # (K+1,)
        norm = np.sqrt(np.maximum(np.einsum("cs,st,ct->c", pref, own, pref), 1e-300))
        out += num / (norm * len(rest) * max(mu_f, 1e-300))
    return [float(v) for v in np.clip(out / draws, -1.0, 1.0)]


IDENTIFIABLE_Z = 2.0  # the pool's signal z below which it identifies no truth


def identifiable(h: np.ndarray, z: float = IDENTIFIABLE_Z) -> bool:
    """Whether the whole pool measures a full-gradient mean: its ``signal_z`` reaches ``z`` (the cross-sample
    ``|mu_F|^2`` at least ``z`` standard errors above pure noise). Not, when the noise scale is beyond the pool: the
    population cosines are then undefined or noise, and a replay has no truth to land on."""
    return signal_z(h) >= z


def truth_window(population: dict[int, float], candidates: Sequence[int], horizon: int, threshold: float) -> int:
    """The shortest candidate whose population cosine reaches ``threshold``; the horizon when none does."""
    ok = [c for c in candidates if population.get(int(c), float("-inf")) >= threshold]
    return min(ok) if ok else int(horizon)


def rung(window: int, candidates: Sequence[int], horizon: int) -> int:
    """The window's place on the ladder ``candidates + [horizon]`` (a window between rungs: the next one up)."""
    ladder = sorted(int(c) for c in candidates) + [int(horizon)]
    for i, w in enumerate(ladder):
        if window <= w:
            return i
    return len(ladder) - 1
