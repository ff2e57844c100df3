"""Train-rollout logprob gap: ``|log p_train(y_t) - log p_rollout(y_t)|`` over response tokens.

The rollout engine (vLLM) and the training engine (transformers) compute the same policy with different
kernels; under asynchrony the rollout weights are also older. The per-token absolute gap catches both
(*Stabilizing and Scaling Async RL Training*: flat around its baseline when healthy, diverging when an IS correction or the
weight sync is broken). Report its tails, not only the mean: heavy-tailed gaps hide behind a benign mean.

Metrics (``rollout/`` namespace): ``logprob_gap_mean``, ``logprob_gap_p50``, ``logprob_gap_p90``,
``logprob_gap_p99``, ``logprob_gap_max`` and ``logprob_gap_tokens`` (how many tokens were compared).
Pure torch; no engine is imported here.
"""

from __future__ import annotations

import torch

QUANTILES = (0.5, 0.9, 0.99)


def logprob_gap(train_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                prefix: str = "rollout/logprob_gap") -> dict[str, float]:
    """Summary of ``|train - rollout|`` over positions where ``mask`` is true.

    train_logprobs, rollout_logprobs, mask: same shape, e.g. (B, L) aligned with ``input_ids``. The
    train side is detached. No masked token: an empty dict (nothing to report, never a fake zero).
    Non-finite rollout logprobs (an engine that returned none for a token) are left out and counted in
    ``<prefix>_nonfinite``.
    """
    if train_logprobs.shape != rollout_logprobs.shape or train_logprobs.shape != mask.shape:
        raise ValueError(f"shapes differ: train {tuple(train_logprobs.shape)}, rollout "
                         f"{tuple(rollout_logprobs.shape)}, mask {tuple(mask.shape)}")
    m = mask.bool()
    gap = (train_logprobs.detach().double() - rollout_logprobs.double()).abs()[m]  # (N,)
    finite = torch.isfinite(gap)
    n_bad = int((~finite).sum())
    gap = gap[finite]
    out: dict[str, float] = {f"{prefix}_nonfinite": float(n_bad)} if n_bad else {}
    if gap.numel() == 0:
        return out
    qs = torch.quantile(gap, torch.tensor(QUANTILES, dtype=gap.dtype))
    out |= {f"{prefix}_mean": float(gap.mean()), f"{prefix}_max": float(gap.max()),
            f"{prefix}_tokens": float(gap.numel())}
    out |= {f"{prefix}_p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, qs, strict=True)}
    return out


def ragged_gap(train_logprobs: list[list[float]], rollout_logprobs: list[list[float]],
               prefix: str = "rollout/logprob_gap") -> dict[str, float]:
    """``logprob_gap`` for per-sample lists of response-token logprobs (one list per sample)."""
    if len(train_logprobs) != len(rollout_logprobs):
        raise ValueError(f"{len(train_logprobs)} train rows vs {len(rollout_logprobs)} rollout rows")
    train: list[float] = []
    rollout: list[float] = []
    for b, (t, r) in enumerate(zip(train_logprobs, rollout_logprobs, strict=True)):
        if len(t) != len(r):
            raise ValueError(f"sample {b}: {len(t)} train logprobs vs {len(r)} rollout logprobs")
        train += t
        rollout += r
    t_ = torch.tensor(train, dtype=torch.float64)
    return logprob_gap(t_, torch.tensor(rollout, dtype=torch.float64), torch.ones_like(t_, dtype=torch.bool),
                       prefix)
