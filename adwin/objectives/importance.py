"""Importance-ratio treatment for stale or off-policy tokens: weights and ratio diagnostics.

Math layer. Methods follow the async-RL corrections (``none``, ``clip``, ``cap``, ``icepop``) described in
*Stabilizing and Scaling Async RL Training* (docs/design.md, references); ``ratio_percentiles`` gives the
train-rollout gap diagnostics (p50/p90/p99/max).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

ISMethod = Literal["none", "clip", "cap", "icepop"]
IS_METHODS: tuple[str, ...] = ("none", "clip", "cap", "icepop")


def importance_weights(
    log_ratio: torch.Tensor | None = None,
    method: str = "none",
    low: float = 0.5,
    high: float = 2.0,
    *,
    ratio: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Treat an importance ratio; returns ``(weights, fraction of masked entries affected)``.

    Give ``log_ratio`` (preferred: no overflow before the method applies) or ``ratio``, any shape.
    ``none``: the raw ratio. ``clip``: clamp to ``[low, high]`` (TIS; every token still counts).
    ``cap``: zero where ratio > ``high`` (one-sided rejection). ``icepop``: zero outside ``[low, high]``.
    Bounds are inclusive. Weights carry autograd from the input; detach it to use them as constants.
    ``mask`` (broadcastable to the ratio) only restricts the fraction's denominator.
    """
    if (log_ratio is None) == (ratio is None):
        raise ValueError("give exactly one of log_ratio or ratio")
    if method not in IS_METHODS:
        raise ValueError(f"method must be one of {IS_METHODS}, got {method!r}")
    if method != "none" and not (0.0 <= low <= high):
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    r = torch.exp(log_ratio) if ratio is None else ratio
    if method == "none":
        weights, affected = r, torch.zeros_like(r, dtype=torch.bool)
    elif method == "clip":
        weights, affected = r.clamp(low, high), (r < low) | (r > high)
    elif method == "cap":
        affected = r > high
        weights = torch.where(affected, torch.zeros_like(r), r)
    else:  # icepop
        affected = (r < low) | (r > high)
        weights = torch.where(affected, torch.zeros_like(r), r)
    if mask is None:
        frac = affected.float().mean()
    else:
        m = torch.broadcast_to(mask > 0, affected.shape)
        frac = (affected & m).float().sum() / m.float().sum().clamp_min(1.0)
    return weights, float(frac)


def ratio_percentiles(ratio: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """p50/p90/p99/max of ``ratio`` over masked entries (numpy's linear interpolation); NaN if empty."""
    vals = ratio.detach()
    vals = vals if vals.dtype == torch.float64 else vals.float()
    if mask is not None:
        vals = vals[torch.broadcast_to(mask > 0, vals.shape)]
    vals = vals.flatten()
    if vals.numel() == 0:
        return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
    # sort + interpolate rather than torch.quantile, which refuses inputs beyond 2**24 elements
    s, n = vals.sort().values, vals.numel()

    def pct(p: float) -> float:
        x = p / 100.0 * (n - 1)
        lo = int(math.floor(x))
        hi = min(lo + 1, n - 1)
        return float(s[lo] + (s[hi] - s[lo]) * (x - lo))

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": float(s[-1])}
