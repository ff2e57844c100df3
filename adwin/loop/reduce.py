"""The reduction hook of the optimizer step: how ``adwin.loop.learner.learner_step`` sums across data-parallel ranks.

``optimize`` calls ``reducer.all_sum`` on (1) the loss normaliser, before any micro-batch loss, (2) the
accumulated gradients, after the last backward and before clipping, and (3) the sums behind the logged
metrics, before the non-finite check; so every rank trains on the global loss, clips the global gradient,
logs the global values and takes the same skip decision. One process passes no reducer (``LocalReducer``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

GRAD_BUCKET_ELEMENTS = 1 << 25  # gradients are summed in flat buckets of at most this many elements (128 MiB fp32)


class Reducer(Protocol):
    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` across ranks in place and return it."""
        ...


class LocalReducer:
    """One rank: the sum over ranks is the tensor itself."""

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t


def all_sum_grads(params: Iterable[torch.nn.Parameter], reducer: Reducer,
                  bucket: int = GRAD_BUCKET_ELEMENTS) -> None:
    """Sum the ``.grad`` of ``params`` (the trainable ones: ``adwin.student.lora.trainable_parameters``) across
    ranks, in flat same-dtype buckets (few collectives, bounded copy).

    A parameter without a gradient contributes zeros and gets the summed gradient: every rank must send
    the same layout, whichever parameters its own micro-batches happened to reach.
    """
    live = list(params)
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    i = 0
    while i < len(live):
        group, size = [live[i]], live[i].numel()
        i += 1
        while i < len(live) and live[i].grad.dtype == group[0].grad.dtype \
                and live[i].grad.device == group[0].grad.device and size + live[i].numel() <= bucket:
            group.append(live[i])
            size += live[i].numel()
            i += 1
        flat = reducer.all_sum(torch.cat([p.grad.reshape(-1) for p in group]))  # (size,)
        offset = 0
        for p in group:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
