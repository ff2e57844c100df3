"""The audit's prepared batch and the causal chunked forward of its segment losses.

Math layer, shared by the one-row-at-a-time engine (``adwin.audit.grams``) and the batched per-sample one
(``adwin.audit.persample``): both differentiate the segment losses this forward builds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from adwin.audit.sketch import Grads
from adwin.decode.kv_cache import with_cache
from adwin.objectives.logprobs import upcast
from adwin.objectives.losses import response_positions, reverse_kl_pg

# Per-token loss: (student_logprobs, teacher_logprobs, mask) -> (B, L) per-token losses.
TokenLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Prepared:
    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L) long
    position_ids: torch.Tensor  # (B, L)
    response_mask: torch.Tensor  # (B, L) float
    teacher_logprobs: torch.Tensor  # (B, L) float
    token_weights: torch.Tensor | None  # (B, L) float
    segment: torch.Tensor  # (B, L) long: segment of each response token, -1 elsewhere
    tokens_per_segment: list[int]
    loss: str | TokenLoss = "reverse_kl_pg"


def prepare(batch: Any, token_weights: torch.Tensor | None, cands: list[int], device: torch.device) -> Prepared:
    """A ``ProbeBatch`` on ``device`` with each response token's segment (candidate boundaries ``cands``)."""
    shape = tuple(batch.input_ids.shape)
    if token_weights is not None and tuple(token_weights.shape) != shape:
        raise ValueError(f"token_weights must have shape {shape}, got {tuple(token_weights.shape)}")
    am = batch.attention_mask.to(device).long()
    rm = batch.response_mask.to(device).float()
    if bool((rm[:, 0] > 0).any()):
        raise ValueError("response_mask is 1 at column 0, which no logit predicts")
    if bool(((rm > 0) & (am == 0)).any()):
        raise ValueError("response_mask is 1 on a position the attention mask excludes")
    pos = response_positions(rm)  # (B, L), -1 off the response
    bounds = torch.tensor(cands, device=device)
    seg = torch.where(pos >= 0, torch.bucketize(pos, bounds, right=True), torch.full_like(pos, -1))  # (B, L)
    counts = torch.bincount(seg[seg >= 0], minlength=len(cands) + 1).tolist()
    return Prepared(
        input_ids=batch.input_ids.to(device),
        attention_mask=am,
        position_ids=(am.cumsum(dim=1) - 1).clamp_min(0),
        response_mask=rm,
        teacher_logprobs=batch.teacher_logprobs.to(device).float(),
        token_weights=None if token_weights is None else token_weights.to(device).float(),
        segment=seg,
        tokens_per_segment=[int(c) for c in counts],
    )


def rows_of(b: Prepared, idx: torch.Tensor) -> Prepared:
    """The rows ``idx`` (in that order) of a prepared batch; counts and loss as the whole batch's."""
    w = None if b.token_weights is None else b.token_weights[idx]
    return Prepared(b.input_ids[idx], b.attention_mask[idx], b.position_ids[idx], b.response_mask[idx],
                    b.teacher_logprobs[idx], w, b.segment[idx], b.tokens_per_segment, b.loss)


def forwarded_lengths(b: Prepared) -> list[int]:
    """Per row, the input columns the chunked forward needs: up to its last response token."""
    cols = torch.arange(b.segment.shape[1], device=b.segment.device)
    return ((b.segment >= 0) * cols).amax(dim=1).tolist()


def per_token_loss(
    logp: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None,
    loss: str | TokenLoss,
) -> torch.Tensor:
    per = loss(logp, teacher, mask) if callable(loss) else reverse_kl_pg(logp, teacher, mask)  # (B, n)
    return per if weights is None else per * weights


def chunked_forward(
    model: torch.nn.Module,
    b: Prepared,
    rows: slice,
    n_seg: int,
    on_chunk: Callable[[int], None] | None = None,
) -> list[torch.Tensor | None]:
    """Each segment's loss, summed over ``rows`` (None for an empty segment), through one causal chunked forward.

    Chunk ``s`` of the forward covers the input columns needed by segment ``s`` and not by earlier
    ones. A token at column ``i`` is predicted by the logits at ``i - 1``, so segment ``s`` needs input
    columns ``< end_s`` where ``end_s`` is the largest column of a token in segments ``<= s``. Chunks attend
    to earlier ones through a differentiable KV cache, so the graph of segment ``s``'s loss holds only
    chunks ``<= s``. ``on_chunk(s)`` is called before chunk ``s`` is forwarded.
    """
    from transformers import DynamicCache  # heavy; only the causal engine needs it

    seg = b.segment[rows]  # (b, L)
    ids = b.input_ids[rows]
    ends: list[int] = []
    last = 0
    for s in range(n_seg):
        cols = torch.nonzero((seg == s).any(dim=0)).flatten()
        last = max(last, int(cols.max().item()) if cols.numel() else 0)
        ends.append(last)
    cache = DynamicCache(config=getattr(model, "config", None))
    seg_losses: list[torch.Tensor | None] = [None] * n_seg
    begin = 0
    for s in range(n_seg):
        end = ends[s]
        if end <= begin:
            continue  # nothing new to forward for this segment
        if on_chunk is not None:
            on_chunk(s)
        out = model(
            input_ids=ids[:, begin:end],
            attention_mask=b.attention_mask[rows, :end],
            position_ids=b.position_ids[rows, begin:end],
            **with_cache(model, cache),
            use_cache=True,
        )
        logp = torch.log_softmax(upcast(out.logits), dim=-1)  # (b, n, V)
        logp = logp.gather(-1, ids[:, begin + 1 : end + 1, None]).squeeze(-1)  # (b, n): columns begin+1..end
        cols = slice(begin + 1, end + 1)
        weights = None if b.token_weights is None else b.token_weights[rows, cols]
        per = per_token_loss(logp, b.teacher_logprobs[rows, cols], b.response_mask[rows, cols], weights, b.loss)
        chunk_seg = seg[:, cols]
        for t in range(s, n_seg):  # tokens of later segments can sit in this chunk (shorter prompts)
            hit = chunk_seg == t
            if bool(hit.any()):
                part = (per * hit).sum()
                seg_losses[t] = part if seg_losses[t] is None else seg_losses[t] + part
        begin = end
    return seg_losses


def add_into(acc: Grads | None, grads: Grads | None) -> Grads | None:
    """``acc + grads`` per parameter, in place into ``acc`` (None: nothing yet / nothing to add)."""
    if grads is None:
        return acc
    if acc is None:
        return list(grads)
    for i, g in enumerate(grads):
        if g is not None:
            acc[i] = g if acc[i] is None else acc[i].add_(g)
    return acc
