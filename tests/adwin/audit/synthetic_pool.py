"""Per-sample segment gradients whose truth is set: each candidate's population cosine with the full gradient, the
noise around it, and the segments' token counts (tests of adwin.audit.truth and of the window rules on it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def synthetic_vectors(n: int, cosines: Sequence[float], *, signal: float, tokens: Sequence[int], dim: int = 400,
                      seed: int = 0) -> np.ndarray:
    """(n, K+1, dim) vectors ``g_is = mu_s + e_is``.

    The K prefixes' population gradients ``m_k = sum_{s <= k} mu_s`` have cosine ``cosines[k]`` with the full
    gradient ``F = sum_s mu_s`` (``|F| = signal``, ``|m_k| = signal * sqrt(tokens up to k / all tokens)``); the
    noise ``e_is`` is isotropic with expected energy ``tokens[s]`` (one unit a token), so the pure-noise reading
    is ``sqrt(tokens up to k / all tokens)`` and the noise scale ``sum(tokens) / signal^2``. ``signal = 0``: pure
    noise."""
    k = len(cosines)
    if len(tokens) != k + 1:
        raise ValueError("tokens: one count per segment (K + 1)")
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, k + 1)))  # (dim, K+1) orthonormal: u, then v_1..v_K
    u, vs = basis[:, 0], basis[:, 1:]
    total = float(sum(tokens))
    full = signal * u
    prefix = [signal * np.sqrt(sum(tokens[: i + 1]) / total) * (c * u + np.sqrt(max(1.0 - c * c, 0.0)) * vs[:, i])
              for i, c in enumerate(cosines)]
    mus = [prefix[0]] + [prefix[i] - prefix[i - 1] for i in range(1, k)] + [full - prefix[-1]]  # (K+1) x (dim,)
    mu = np.stack(mus)  # (K+1, dim)
    noise = rng.standard_normal((n, k + 1, dim)) * np.sqrt(np.asarray(tokens, dtype=float) / dim)[None, :, None]
    return mu[None] + noise
