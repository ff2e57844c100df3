"""Teacher-surprise horizon: the per-step observation behind the ``surprise`` window policy.

Math layer: tensors in, numbers out; imports nothing from the controller, probes or application modules.

A response token is *lost* when the teacher's logprob of the student's token is below ``threshold``
(-9.2 ~ log 1e-4: the teacher would essentially never have produced it). Per sample, the *surprise
position* is the number of response tokens up to and including the ``rank``-th lost token, or the
sample's length when it has fewer lost tokens (the rollout may have been cut by the current window:
then the position is censored at the window, which is what lets the horizon grow by at most ``scale``
per step). The step's proposal is ``scale x`` the ``quantile`` of those positions over the batch; the
policy (``adwin.policies.window.SurpriseWindow``) smooths it with an EMA and clips it.
"""

from __future__ import annotations

from typing import Protocol

import torch

from adwin.objectives.losses import response_positions


class SurpriseParams(Protocol):
    threshold: float
    rank: int
    quantile: float
    scale: float


def surprise_positions(teacher_logprobs: torch.Tensor, response_mask: torch.Tensor, threshold: float,
                       rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample surprise positions and whether each sample had ``rank`` lost tokens.

    teacher_logprobs, response_mask: (B, L), aligned with ``input_ids`` (the value at ``[b, i]`` is the
    teacher's logprob of ``input_ids[b, i]``). Returns positions (B,) float and reached (B,) bool.
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    on = response_mask > 0  # (B, L)
    lp = torch.nan_to_num(teacher_logprobs.float(), nan=float("-inf"))  # NaN counts as lost
    lost = on & (lp < threshold)  # (B, L)
    n_lost = lost.long().cumsum(dim=1)  # (B, L) lost tokens up to and including i
    pos = response_positions(response_mask)  # (B, L), -1 off the response
    hit = lost & (n_lost == rank)  # (B, L): at most one True per row, the rank-th lost token
    length = on.long().sum(dim=1)  # (B,)
    reached = hit.any(dim=1)  # (B,)
    at_hit = torch.where(hit, pos + 1, torch.zeros_like(pos)).sum(dim=1)  # (B,) tokens up to and including it
    return torch.where(reached, at_hit, length).float(), reached


def surprise_metrics(teacher_logprobs: torch.Tensor, response_mask: torch.Tensor,
                     params: SurpriseParams) -> dict[str, float]:
    """One step's ``rollout/surprise_*`` metrics; ``rollout/surprise_horizon`` is the policy's input.

    ``rollout/surprise_horizon`` = ``scale`` x quantile of the surprise positions;
    ``rollout/surprise_position_q`` the quantile itself; ``rollout/surprise_reached_frac`` the fraction
    of samples with at least ``rank`` lost tokens; ``rollout/surprise_lost_frac`` lost / response tokens.
    """
    positions, reached = surprise_positions(teacher_logprobs, response_mask, params.threshold, params.rank)
    if positions.numel() == 0:
        return {}
    q = float(torch.quantile(positions, params.quantile))
    on = response_mask > 0
    lp = torch.nan_to_num(teacher_logprobs.float(), nan=float("-inf"))
    n_tokens = float(on.sum())
    return {
        "rollout/surprise_horizon": params.scale * q,
        "rollout/surprise_position_q": q,
        "rollout/surprise_reached_frac": float(reached.float().mean()),
        "rollout/surprise_lost_frac": float((on & (lp < params.threshold)).sum()) / max(n_tokens, 1.0),
    }
