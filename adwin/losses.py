"""OPD estimators: per-token losses, window masks and aggregation.

Math layer: imports nothing from the controller, probes or application modules.

Position convention (DESIGN.md): the token at ``input_ids[b, i]`` is predicted by ``logits[b, i-1]``.
All per-token tensors here are aligned with ``input_ids`` (shape ``(B, L)``): the value at ``[b, i]``
concerns the realized token ``input_ids[b, i]``. Position 0 has no predictor and is always masked.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each realized token, aligned with ``input_ids``.

    logits: (B, L, V); input_ids: (B, L) -> (B, L), with 0 at position 0 (no predictor).
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, L-1, V)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, L-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)  # (B, L)


def response_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """Response position ``j`` (0 at the first response token of each sample), -1 off the response.

    response_mask: (B, L) of 0/1 -> (B, L) long.
    """
    rm = response_mask.long()
    return torch.where(rm.bool(), rm.cumsum(dim=1) - 1, torch.full_like(rm, -1))


def window_mask(response_mask: torch.Tensor, window: int | None) -> torch.Tensor:
    """Float mask of response positions ``j < window`` (all response positions when ``window`` is None)."""
    if window is None:
        return response_mask.float()
    pos = response_positions(response_mask)  # (B, L)
    return ((pos >= 0) & (pos < window)).float()


def reverse_kl_pg(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    behavior_logprobs: torch.Tensor | None = None,
    clip: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Token-local reverse-KL policy-gradient loss (ADWIN eq. 23-24, discount 0), per token.

    student_logprobs, teacher_logprobs, mask: (B, L). Returns (B, L) per-token losses, 0 off the mask.

    Advantage ``A = log q(y) - log p_theta(y)`` is a constant (stop-gradient). Without behavior
    logprobs the loss is ``-A * log p_theta(y)``. With them, the old-to-current importance ratio
    ``rho = p_theta / p_behavior`` (AsyncOPD's reference surrogate) gives ``-rho * A``, whose gradient is
    ``-rho * A * grad log p_theta``; ``clip=(eps_low, eps_high)`` applies the PPO pessimistic clip.
    """
    adv = (teacher_logprobs - student_logprobs).detach()  # (B, L)
    if behavior_logprobs is None:
        per_token = -adv * student_logprobs
    else:
        ratio = torch.exp(student_logprobs - behavior_logprobs.detach())  # (B, L)
        per_token = -ratio * adv
        if clip is not None:
            eps_low, eps_high = clip
            clipped = -torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
            per_token = torch.maximum(per_token, clipped)
    return per_token * mask


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce (B, L) per-token losses to a scalar over the mask.

    ``token-mean``: sum over all masked tokens / their count. ``seq-mean-token-mean``: per-sample mean,
    then mean over samples with at least one token. ``seq-mean-token-sum``: per-sample sum, mean over
    those samples.
    """
    mask = mask.float()
    if mode == "token-mean":
        return (per_token * mask).sum() / mask.sum().clamp_min(1.0)
    per_seq_tokens = mask.sum(dim=1)  # (B,)
    per_seq = (per_token * mask).sum(dim=1)  # (B,)
    live = per_seq_tokens > 0
    n_live = live.float().sum().clamp_min(1.0)
    if mode == "seq-mean-token-mean":
        return (per_seq / per_seq_tokens.clamp_min(1.0) * live).sum() / n_live
    if mode == "seq-mean-token-sum":
        return (per_seq * live).sum() / n_live
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")
