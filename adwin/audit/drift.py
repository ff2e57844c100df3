"""Supervision-drift diagnostics along student rollouts (ADWIN paper, section 3.1).

Per response position ``t`` (0 = the first response token), over a batch of student rollouts scored by
the teacher ``q``:

* **branching factor** ``exp(H(q(. | x, y_<t)))``: the teacher's per-position perplexity, averaged over
  the rollouts still running at ``t``; a broad teacher offers many plausible paths.
* **top-k survival** ``S_k(t)``: the fraction of rollouts with no top-k rejection at any position
  ``<= t``, where a rejection is a student token whose rank under the teacher is above ``k`` (rank 1 =
  the teacher's argmax). A rollout that ended keeps the status it ended with, so ``S_k`` never rises.
* **cumulative top-k rejection** ``R_k(t)``: the mean number of rejections at positions ``<= t``
  (ended rollouts keep their count), so ``R_k`` never falls.

Pure tensors in, numbers out; nothing here knows about the trainer. ``drift_metrics`` turns a teacher
forward on a probe batch into the ``drift/*`` metrics the probe side logs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

TOP_KS: tuple[int, ...] = (1, 5)  # top-1: the teacher's argmax; top-5: its few plausible tokens


def position_stats(logits: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher entropy and the rank of the realized token, aligned with ``input_ids``.

    logits: (B, L, V), position j predicts token j + 1; input_ids: (B, L).
    Returns entropy (B, L) and rank (B, L) long (1 = argmax; ties count in the token's favour);
    position 0 has no prediction and gets entropy 0, rank 1.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, L-1, V)
    entropy = -(logp.exp() * logp).sum(-1)  # (B, L-1)
    realized = logp.gather(-1, input_ids[:, 1:, None])  # (B, L-1, 1)
    rank = 1 + (logp > realized).sum(-1)  # (B, L-1)
    zero = torch.zeros_like(entropy[:, :1])  # (B, 1)
    return torch.cat([zero, entropy], 1), torch.cat([torch.ones_like(rank[:, :1]), rank], 1)


def to_response_positions(x: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift each row so that its first response token sits at column 0.

    x, response_mask: (B, L), the response contiguous in each row. Returns x_r (B, T) and mask_r (B, T)
    bool, T the longest response; columns past a row's response are masked out.
    """
    mask = response_mask.bool()  # (B, L)
    lengths = mask.sum(1)  # (B,)
    width = int(lengths.max()) if mask.numel() else 0
    start = mask.float().argmax(1)  # (B,) first response column (0 for an empty row, masked anyway)
    cols = torch.arange(width)  # (T,)
    idx = (start[:, None] + cols[None]).clamp(max=max(0, x.shape[1] - 1))  # (B, T)
    mask_r = cols[None] < lengths[:, None]  # (B, T)
    return x.gather(1, idx), mask_r


def branching_factor(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean ``exp(entropy)`` over the rollouts running at each position. (B, T) -> (T,), NaN where none run."""
    m = mask.float()  # (B, T)
    alive = m.sum(0)  # (T,)
    total = (entropy.exp() * m).sum(0)  # (T,)
    return torch.where(alive > 0, total / alive.clamp(min=1), torch.full_like(total, float("nan")))


def _carried_rejections(rank: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """Rejections at or before each position, per rollout (B, T); an ended rollout keeps its count."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return ((rank > k) & mask.bool()).long().cumsum(1)  # (B, T)


def topk_survival(rank: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """``S_k(t)``: fraction of rollouts with no rank-above-k token through ``t``. (B, T) -> (T,)."""
    return (_carried_rejections(rank, mask, k) == 0).float().mean(0)


def cumulative_rejection(rank: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """``R_k(t)``: mean number of rank-above-k tokens through ``t``. (B, T) -> (T,)."""
    return _carried_rejections(rank, mask, k).float().mean(0)


def drift_curves(
    logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor, ks: Sequence[int] = TOP_KS
) -> dict[str, list[float]]:
    """Every diagnostic per response position: ``ppl`` and, per k, ``survival_k`` and ``rejections_k``."""
    entropy, rank = position_stats(logits, input_ids)
    entropy_r, mask_r = to_response_positions(entropy, response_mask)
    rank_r, _ = to_response_positions(rank, response_mask)
    out = {"ppl": branching_factor(entropy_r, mask_r).tolist()}
    for k in ks:
        out[f"survival_{k}"] = topk_survival(rank_r, mask_r, k).tolist()
        out[f"rejections_{k}"] = cumulative_rejection(rank_r, mask_r, k).tolist()
    return out


def drift_metrics(curves: dict[str, list[float]], positions: Sequence[int]) -> dict[str, float]:
    """``drift/*`` scalars read off the curves at window boundaries: at each position ``c`` (a candidate
    window), the survival and rejections through token ``c`` and the mean branching factor over the
    tokens ``[previous c, c)``. Positions beyond the longest response are left out."""
    ppl = torch.tensor(curves["ppl"])  # (T,)
    out: dict[str, float] = {}
    lo = 0
    for c in sorted(positions):
        if c > len(ppl) or c <= lo:
            continue
        seg = ppl[lo:c]
        seg = seg[~seg.isnan()]
        if len(seg):
            out[f"drift/ppl_{c}"] = float(seg.mean())
        for name, values in curves.items():
            if name != "ppl":
                out[f"drift/{name}_at_{c}"] = float(values[c - 1])
        lo = c
    return out


def teacher_drift(
    logits_fn: Callable[[torch.Tensor, torch.Tensor, list[str]], torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    routes: list[str],
    candidates: Sequence[int],
) -> dict[str, float]:
    """``drift/*`` metrics of one probe batch: one teacher forward (``logits_fn``, (B, L, V)) on the
    learner. Probe batches are full rollouts, so every candidate window's boundary can be read."""
    with torch.no_grad():
        logits = logits_fn(input_ids, attention_mask, routes)  # (B, L, V)
    return drift_metrics(drift_curves(logits, input_ids, response_mask), candidates)
