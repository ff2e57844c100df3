"""Continuous batching on a static KV cache (``StaticSlots``): the AsyncOPD engine's compiled path (``rollout.compile``).

A compiled decode step needs fixed shapes, and requests join and leave the engine at every step. The layout:

- **Slots.** The batch has a bucketed number of rows (``adwin.decode.static_cache.batch_bucket``); a request
  holds one row (its slot) while it decodes; a free slot decodes a pad token into a column only it attends to.
- **One shared write column.** Every step writes column ``c`` of every row, then ``c + 1``: the compiled step is
  the same graph whatever the rows' lengths. Positions (RoPE) count each row's real tokens, the mask says which
  columns a row attends to, so rows of different lengths share columns (the dynamic engine's left padding, in a
  cache that never changes shape).
- **Left-aligned newcomers.** A newcomer's context is prefilled eagerly (one forward for all of the step's
  newcomers, as the dynamic engine does) and laid into its slot's columns ``[c - n, c)``, ending where every row
  ends.
- **Repacks.** The cache has ``cache_bucket(2 x (max_len + 1))`` columns for requests of at most ``max_len``
  tokens. When a newcomer is longer than ``c``, the live rows outgrow the bucket, or ``c`` reaches the last
  column, the live rows are copied into a fresh batch (the bucket of the rows then needed) ending at column
  ``c' = longest row``, which leaves at least ``max_len`` steps before the next forced repack. A repack is a cache
  copy, as the dynamic engine's merges are.

The logits are the eager layout's (``adwin.decode.streaming.DynamicSlots``) up to the compiled kernels' rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from adwin.decode.kv_cache import returned_cache
from adwin.decode.loop import left_pad
from adwin.decode.static_cache import (
    StaticBatch,
    StaticCacheError,
    batch_bucket,
    cache_bucket,
    lays_rows,
    static_layer_kinds,
)
from adwin.decode.streaming import Request

DECODER = "asyncopd-engine"


class StaticSlots:
    """Requests in the rows of one ``StaticBatch``; see the module docstring."""

    def __init__(self, model: torch.nn.Module, pad_id: int, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1 (the longest request: prompt + horizon), got {max_len}")
        if not lays_rows(model):  # refused when the engine is built, before any request
            raise StaticCacheError(f"the compiled rollout engine lays rows into plain StaticLayer caches only, got "
                                   f"{sorted(static_layer_kinds(model))}; set rollout.compile: false")
        self.model, self.pad_id = model, pad_id
        self.columns = cache_bucket(2 * (max_len + 1))
        self.max_len = max_len
        self.prefilled_tokens = 0  # context tokens encoded by prefills
        self.repacks = 0
        self.reset()

    def reset(self) -> None:
        self.batch: StaticBatch | None = None
        self.rows: list[str | None] = []  # request id of each slot; None: free
        self.fed: list[int] = []  # context tokens of each slot in the cache
        self.start: list[int] = []  # first column of each slot's span

    @property
    def cached_requests(self) -> list[str]:
        return [rid for rid in self.rows if rid is not None]

    def next_logits(self, items: Sequence[Request]) -> torch.Tensor:
        """Next-token logits (n, V) of every item, in their order (the dynamic engine's contract)."""
        want = {it.request_id: len(it.prompt_ids) + len(it.tokens) for it in items}
        too_long = next((n for n in want.values() if n > self.max_len), None)
        if too_long is not None:
            raise ValueError(f"a request of {too_long} tokens in an engine built for max_len={self.max_len}")
        keep = {rid for rid, fed in zip(self.rows, self.fed, strict=True)
                if rid is not None and want.get(rid) == fed + 1}
        self.rows = [rid if rid in keep else None for rid in self.rows]  # the others left (or must re-encode)
        fresh = [it for it in items if it.request_id not in keep]
        self._make_room(len(keep) + len(fresh), max((want[it.request_id] for it in fresh), default=0))
        assert self.batch is not None
        by_id = {it.request_id: it for it in items}
        logits: dict[str, torch.Tensor] = {}
        if keep:
            out = self._decode(by_id)  # (rows, V)
            logits |= {rid: out[s] for s, rid in enumerate(self.rows) if rid in keep}
        if fresh:
            out = self._prefill(fresh)  # (n, V)
            logits |= {it.request_id: out[b] for b, it in enumerate(fresh)}
        return torch.stack([logits[it.request_id] for it in items])  # (n, V)

    # ------------------------------------------------------------------------------------------ layout

    def _make_room(self, needed: int, longest_new: int) -> None:
        """Repack when the rows or the columns do not fit (module docstring)."""
        b = self.batch
        if b is not None and len(self.rows) >= needed and b.column >= longest_new and b.column + 1 < self.columns:
            return
        live = [s for s, rid in enumerate(self.rows) if rid is not None]
        spans = [b.column - self.start[s] for s in live] if b is not None else []
        end = max([*spans, longest_new, 1])
        fresh = StaticBatch(self.model, batch_bucket(max(needed, 1)), self.columns, DECODER)
        if b is not None and live:
            fresh.ensure_allocated(b.layers[0].keys, b.layers[0].keys.shape[1], b.layers[0].keys.shape[-1],
                                   b.layers[0].values.shape[-1])
            for new, (s, span) in enumerate(zip(live, spans, strict=True)):
                old = slice(self.start[s], b.column)
                fresh.write(new, end - span, [layer.keys[s, :, old] for layer in b.layers],
                            [layer.values[s, :, old] for layer in b.layers])
                fresh.mask[new, end - span : end] = b.mask[s, old]
            self.repacks += 1
        fresh.seek(end)
        self.rows = [self.rows[s] for s in live] + [None] * (fresh.rows - len(live))
        self.fed = [self.fed[s] for s in live] + [0] * (fresh.rows - len(live))
        self.start = [end - span for span in spans] + [end] * (fresh.rows - len(live))
        self.batch = fresh

    # -------------------------------------------------------------------------------------- forwards

    def _decode(self, by_id: dict[str, Request]) -> torch.Tensor:
        """One compiled step: each kept row decodes its newest token; free rows a pad only they attend to."""
        b = self.batch
        assert b is not None
        device = b.mask.device
        busy = torch.tensor([rid is not None for rid in self.rows], device=device)  # (rows,)
        free = (~busy).nonzero().squeeze(1)
        b.mask[free] = 0  # a free row attends to its own newest column only
        tokens = torch.tensor([self.pad_id if rid is None else by_id[rid].tokens[-1] for rid in self.rows],
                              dtype=torch.long, device=device)  # (rows,)
        positions = torch.tensor(self.fed, dtype=torch.long, device=device)  # (rows,) real tokens before it
        out = b.step(tokens, positions, torch.ones_like(busy))  # (rows, V)
        self.fed = [n + 1 if rid is not None else 0 for n, rid in zip(self.fed, self.rows, strict=True)]
        self.start = [s if rid is not None else b.column for s, rid in zip(self.start, self.rows, strict=True)]
        return out

    def _prefill(self, items: list[Request]) -> torch.Tensor:
        """Encode the newcomers (eager, one left-padded forward) and lay each into a free slot ending at the
        write column; logits (n, V)."""
        b = self.batch
        assert b is not None
        device = b.mask.device
        contexts = [it.prompt_ids + it.tokens for it in items]
        ids, mask = left_pad(contexts, self.pad_id, device)  # (n, L)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0),
                         use_cache=True, logits_to_keep=1)
        cache: Any = returned_cache(out)
        layers = list(cache.layers)
        b.ensure_allocated(layers[0].keys, layers[0].keys.shape[1], layers[0].keys.shape[-1],
                           layers[0].values.shape[-1])
        free = iter([s for s, rid in enumerate(self.rows) if rid is None])
        width, end = ids.shape[1], b.column
        for row, (it, ctx) in enumerate(zip(items, contexts, strict=True)):
            s, n = next(free), len(ctx)
            b.write(s, end - n, [layer.keys[row, :, width - n :] for layer in layers],
                    [layer.values[row, :, width - n :] for layer in layers])
            b.mask[s] = 0
            b.mask[s, end - n : end] = 1
            self.rows[s], self.fed[s], self.start[s] = it.request_id, n, end - n
        self.prefilled_tokens += sum(map(len, contexts))
        return out.logits[:, -1]
