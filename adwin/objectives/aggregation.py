"""The loss mask and the reduction of per-token losses to one scalar, with an explicit normaliser.

Math layer; re-exported by ``adwin.objectives.losses``. Every OPD loss is row-local (a token's loss, its
IW-OPD weight and its importance ratio depend only on its own sample), so splitting a step's batch into
micro-batches, or across data-parallel ranks, changes nothing but the aggregation's denominator: the
token count (``token-mean``) or the count of samples with a counted token (the ``seq-mean-*`` modes).
``loss_normalizer`` gives a shard's share of it; the shares add up to the whole batch's, so a caller sums
them over the shards first and hands the total to ``aggregate`` (docs/decisions.md, "Micro-batches and memory options").
"""

from __future__ import annotations

import torch

from adwin.objectives.logprobs import fill_off, window_mask

AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def loss_mask(response_mask: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, L) float mask of the counted tokens: the first ``window`` response tokens, never position 0
    (it has no predictor)."""
    mask = window_mask(response_mask, window).clone()  # (B, L)
    mask[:, 0] = 0.0
    return mask


def loss_normalizer(mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """This shard's share of ``aggregate``'s denominator, unclamped (float64 scalar, exact for any count).

    ``token-mean``: its counted tokens; ``seq-mean-*``: its samples with at least one counted token.
    The denominator of the whole batch is the sum over its shards, clamped at 1 (``aggregate`` clamps).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")
    m = mask.double()
    return m.sum() if mode == "token-mean" else (m.sum(dim=1) > 0).double().sum()


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              normalizer: torch.Tensor | float | None = None) -> torch.Tensor:
    """Reduce (B, L) per-token losses to a scalar over the mask.

    ``token-mean``: sum over all masked tokens / their count. ``seq-mean-token-mean``: per-sample mean,
    then mean over samples with at least one token. ``seq-mean-token-sum``: per-sample sum, mean over
    those samples. ``normalizer`` replaces the local denominator (the count above) by a given one, the
    sum of ``loss_normalizer`` over every shard of the batch this one belongs to: the shards' losses then
    add up to the whole batch's loss, and so do their gradients.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")
    mask = mask.float()
    per_token = fill_off(per_token, mask)
    if mode == "token-mean":
        num, den = per_token.sum(), mask.sum()
    else:
        per_seq_tokens = mask.sum(dim=1)  # (B,)
        per_seq = per_token.sum(dim=1)  # (B,)
        live = per_seq_tokens > 0
        den = live.float().sum()
        num = (per_seq / per_seq_tokens.clamp_min(1.0) * live).sum() if mode == "seq-mean-token-mean" \
            else (per_seq * live).sum()
    if normalizer is None:
        return num / den.clamp_min(1.0)
    total = torch.as_tensor(normalizer, device=num.device).clamp_min(1.0).to(num.dtype)
    return num / total
