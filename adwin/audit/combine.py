"""Exact cross-rank combine of an audit whose probe batch is sharded over data-parallel ranks.

Math layer. The segment gradients are sums over the probe batch's tokens and samples (no mean), so the
batch's segment gradient is the sum of the ranks' shard gradients: each rank differentiates its rows and
the (K+1) segment vectors are all-reduced before the Gram, which is then exactly the 1-process Gram (up
to float summation order). What travels per audit (docs/decisions.md, "Data-parallel training"):

* ``fast``: the (K+1, n_params) float32 segment gradients, one all-reduce;
* ``sketch``: the (K+1, sketch_dim) float64 batch sketch (CountSketch is linear; the hash is keyed by
  seed and parameter name, the same on every rank);
* ``reference``: the (K+1, n_params) float64 flattened gradients;
* per-sample statistics (macro cosines, the debiased estimator, the bootstrap interval): each rank's
  per-sample Grams / vectors, all-gathered in rank order (= sample order: shards are contiguous).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import torch

T = TypeVar("T")

# One gradient: one entry per audited parameter, None where the loss does not reach it.
Grads = list[torch.Tensor | None]


class Combiner(Protocol):
    """What the audit needs from a process group (``adwin.loop.distributed.Dist`` implements it)."""

    rank: int
    world: int

    def shard(self, n: int) -> slice: ...

    def all_sum(self, t: torch.Tensor) -> torch.Tensor: ...

    def all_max(self, value: float) -> float: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...


def segment_matrix(seg_grads: Sequence[Grads | None], params: Sequence[torch.Tensor]) -> torch.Tensor:
    """(K+1, n_params) float32: each segment gradient flattened; zeros for an empty segment or parameter.

    Built before an all-reduce, so a segment empty on this rank but not on another still adds up.
    """
    sizes = [p.numel() for p in params]
    out = torch.zeros(len(seg_grads), sum(sizes), dtype=torch.float32, device=params[0].device)
    for s, grads in enumerate(seg_grads):
        if grads is None:
            continue
        at = 0
        for g, n in zip(grads, sizes, strict=True):
            if g is not None:
                out[s, at : at + n] = g.reshape(-1).float()
            at += n
    return out


def gather_concat(combine: Combiner, items: list[T]) -> list[T]:
    """Every rank's list, concatenated in rank order."""
    return [x for part in combine.all_gather_object(items) for x in part]


def summed_counts(combine: Combiner, counts: Sequence[int]) -> list[int]:
    t = torch.tensor([int(c) for c in counts], dtype=torch.float64)
    return [int(round(float(x))) for x in combine.all_sum(t)]
