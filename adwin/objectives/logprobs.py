"""Log-probabilities of realized and candidate tokens, response positions and mask primitives.

Math layer: imports nothing from the controller, probes or application modules. The shared base of
``adwin.objectives.losses`` and ``adwin.objectives.divergences``; ``adwin.objectives.losses`` re-exports its public names.

Position convention (docs/design.md): the token at ``input_ids[b, i]`` is predicted by ``logits[b, i-1]``.
Per-token tensors are aligned with ``input_ids`` (shape ``(B, L)``); per-action tensors are ``(B, L, m)``
with the same alignment. Raw model logits keep the model layout ``(B, L, V)`` and are shifted here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each realized token, aligned with ``input_ids``.

    logits: (B, L, V); input_ids: (B, L) -> (B, L), with 0 at position 0 (no predictor).
    """
    logp = torch.log_softmax(upcast(logits[:, :-1]), dim=-1)  # (B, L-1, V)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, L-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)  # (B, L)


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` likeliest tokens of each position's distribution, aligned with ``input_ids`` like
    ``token_logprobs``: logits (B, L, V) -> logprobs (B, L, k) and ids (B, L, k), by rank; position 0
    (no predictor) holds logprobs 0 and ids 0..k-1. ``k`` is capped at V."""
    logp = F.pad(torch.log_softmax(upcast(logits[:, :-1]), dim=-1), (0, 0, 1, 0))  # (B, L, V)
    return logp.topk(min(k, logits.shape[-1]), dim=-1)


def action_logprobs(logits: torch.Tensor, action_ids: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of ``m`` candidate tokens per position (MC actions or teacher top-k ids).

    logits: (B, L, V) raw model layout; action_ids: (B, L, m) aligned with ``input_ids`` -> (B, L, m),
    0 at position 0. Negative ids (a padding sentinel) read token 0; mask those positions out.
    """
    if action_ids.dim() != 3 or action_ids.shape[:2] != logits.shape[:2]:
        raise ValueError(f"action_ids must be (B, L, m) matching logits {tuple(logits.shape[:2])}, "
                         f"got {tuple(action_ids.shape)}")
    logp = torch.log_softmax(upcast(logits[:, :-1]), dim=-1)  # (B, L-1, V)
    picked = logp.gather(-1, action_ids[:, 1:].long().clamp_min(0))  # (B, L-1, m)
    return F.pad(picked, (0, 0, 1, 0), value=0.0)  # (B, L, m)


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


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Half precision to float32 for the math; float64 stays float64 (reference tests use it)."""
    return x if x.dtype == torch.float64 else x.float()


def keep_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Boolean mask broadcastable to ``like`` ((B, L) -> (B, L, 1) for per-action tensors)."""
    keep = mask > 0
    return keep.unsqueeze(-1) if like.dim() == keep.dim() + 1 else keep


def fill_off(x: torch.Tensor, mask: torch.Tensor, value: float | torch.Tensor = 0.0) -> torch.Tensor:
    """``x`` on the mask, ``value`` elsewhere: sanitizes padding before it enters any arithmetic."""
    return torch.where(keep_mask(mask, x), x, value)
