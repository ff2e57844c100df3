"""Continuous batching on the model's own KV cache: the AsyncOPD engine's eager layout (``DynamicSlots``).

Requests join and leave at every step. One batch KV cache (transformers' ``DynamicCache``, built by the model's
own forward) holds the requests in flight; each ``next_logits`` costs one batched decode forward of one token per
request already in the cache, plus one prefill forward for the requests that joined since the previous call. A
newcomer's prefill cache is merged into the batch cache with left padding: rows of different lengths share one
cache and one attention mask, and positions count real tokens only. Leading columns that no row uses any more
are cut. A request that leaves stays in the cache as a masked row until the next merge copies the cache anyway
(or until such rows are half of it): dropping rows (``batch_select_indices``) copies every layer, and copies
were half the engine's time. The compiled layout with the same contract is ``adwin.decode.slots.StaticSlots``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from adwin.decode.kv_cache import cache_keyword, returned_cache
from adwin.decode.loop import left_pad


class Request(Protocol):
    """What a streaming layout reads of a request: its id and its context (prompt + tokens so far)."""

    request_id: str
    prompt_ids: list[int]
    tokens: list[int]


class UnsupportedCacheError(ValueError):
    """The model's KV cache has layers whose rows cannot be left-padded and merged (e.g. sliding windows)."""


def _layers(cache: Any) -> list[Any]:
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", []))
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers}) or [type(cache).__name__]
        raise UnsupportedCacheError(f"the continuous-batching rollout engine merges plain DynamicLayer caches "
                                    f"only, got {kinds}")
    return layers


def _keeps_full_history(model: torch.nn.Module) -> bool:
    """Whether prefills should get an empty ``DynamicCache`` that keeps every column of every layer: the model's own
    cache has sliding-window layers (Mistral, Gemma 2 and 3), which roll their columns, and rolled rows cannot be
    left-padded and merged; with every column kept, the model's attention mask (built from its config) still applies
    the window. A cache with layers of other kinds (linear attention, ...) stays the model's own, and the merge
    refuses it by type."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    config = getattr(model, "config", None)
    if config is None:  # not a transformers model: nothing to build a cache from
        return False
    kinds = {type(layer) for layer in DynamicCache(config=config).layers}  # what the forward would build
    return DynamicSlidingWindowLayer in kinds and kinds <= {DynamicLayer, DynamicSlidingWindowLayer}


def _left_pad_kv(t: torch.Tensor, width: int) -> torch.Tensor:
    """(b, h, T, d) -> (b, h, width, d) with zero columns on the left (masked out)."""
    extra = width - t.shape[-2]
    return t if extra == 0 else torch.nn.functional.pad(t, (0, 0, extra, 0))


class DynamicSlots:
    """Requests in the rows of one ``DynamicCache``; see the module docstring."""

    def __init__(self, model: torch.nn.Module, pad_id: int) -> None:
        self.model, self.pad_id = model, pad_id
        self._cache_kw = cache_keyword(model)  # the forward's KV-cache keyword, looked up once
        self._full_history = _keeps_full_history(model)
        self.prefilled_tokens = 0  # context tokens encoded by prefills
        self.reset()

    def reset(self) -> None:
        self.rows: list[str | None] = []  # request id of each cache row; None: it left, dropped at the next merge
        self.fed: list[int] = []  # context tokens of each row in the cache
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # (b, T) 1 where a cache column holds a row's real token

    @property
    def cached_requests(self) -> list[str]:
        return [rid for rid in self.rows if rid is not None]

    @torch.no_grad()
    def next_logits(self, items: Sequence[Request]) -> torch.Tensor:
        """Next-token logits (n, V) of every item, in their order: rows that left are dropped, rows with one
        new token decode it in one batched forward, the others (newcomers, or rows the cache no longer
        matches) are prefilled."""
        want = {it.request_id: len(it.prompt_ids) + len(it.tokens) for it in items}
        # a row continues when it holds all of its context but the token sampled at the previous step
        keep = [r for r, (rid, fed) in enumerate(zip(self.rows, self.fed, strict=True))
                if rid is not None and want.get(rid) == fed + 1]
        continuing = {self.rows[r] for r in keep}
        fresh = [it for it in items if it.request_id not in continuing]
        if fresh or 2 * len(keep) < len(self.rows):
            self._select(keep)
        else:
            self.rows = [rid if rid in continuing else None for rid in self.rows]
        by_id = {it.request_id: it for it in items}
        logits: dict[str, torch.Tensor] = {}
        if keep:
            out = self._decode([None if rid is None else by_id[rid].tokens[-1] for rid in self.rows])  # (b, V)
            logits |= {rid: out[r] for r, rid in enumerate(self.rows) if rid is not None}
        if fresh:
            out = self._prefill(fresh)  # (n, V)
            logits |= {it.request_id: out[b] for b, it in enumerate(fresh)}
        return torch.stack([logits[it.request_id] for it in items])  # (n, V) in the requests' order

    def _select(self, keep: list[int]) -> None:
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.reset()
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)  # type: ignore[union-attr]
        self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]  # type: ignore[index]
        self.rows = [self.rows[i] for i in keep]
        self.fed = [self.fed[i] for i in keep]
        unused = int((self.mask.sum(0) > 0).long().argmax())  # leading columns no row attends to any more
        if unused:
            for layer in _layers(self.cache):
                layer.keys, layer.values = layer.keys[:, :, unused:], layer.values[:, :, unused:]
            self.mask = self.mask[:, unused:]

    def _merge(self, rows: list[str], fed: list[int], cache: Any, mask: torch.Tensor) -> None:
        """Append prefilled rows to the batch cache, left-padding whichever side is shorter."""
        if self.cache is None:
            _layers(cache)
            self.rows, self.fed, self.cache, self.mask = rows, fed, cache, mask
            return
        assert self.mask is not None
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, new in zip(_layers(self.cache), _layers(cache), strict=True):
            mine.keys = torch.cat([_left_pad_kv(mine.keys, width), _left_pad_kv(new.keys, width)])
            mine.values = torch.cat([_left_pad_kv(mine.values, width), _left_pad_kv(new.values, width)])
        pad = torch.nn.functional.pad
        self.mask = torch.cat([pad(self.mask, (width - self.mask.shape[1], 0)), pad(mask, (width - mask.shape[1], 0))])
        self.rows += rows
        self.fed += fed

    def _decode(self, tokens: list[int | None]) -> torch.Tensor:
        """One token per cache row (its newest, not yet encoded; None for a row that left: a masked pad);
        the next-token logits (b, V)."""
        assert self.mask is not None
        device = self.mask.device
        real = torch.tensor([t is not None for t in tokens], dtype=self.mask.dtype, device=device)[:, None]  # (b, 1)
        self.mask = torch.cat([self.mask, real], dim=1)  # (b, T + 1)
        pos = torch.tensor(self.fed, dtype=torch.long, device=device)[:, None]  # (b, 1) real tokens before it
        ids = [self.pad_id if t is None else t for t in tokens]
        out = self.model(input_ids=torch.tensor(ids, dtype=torch.long, device=device)[:, None],
                         attention_mask=self.mask, position_ids=pos, **{self._cache_kw: self.cache}, use_cache=True,
                         logits_to_keep=1)
        self.fed = [n + 1 for n in self.fed]
        return out.logits[:, -1]

    def _fresh_cache(self) -> dict[str, Any]:
        """The prefill's cache keyword: an empty full-history cache (sliding-window models), else none (the
        model builds its own)."""
        from transformers.cache_utils import DynamicCache

        return {self._cache_kw: DynamicCache()} if self._full_history else {}

    def _prefill(self, items: list[Request]) -> torch.Tensor:
        """Encode the whole context of each newcomer and merge it into the batch cache; logits (n, V)."""
        device = next(self.model.parameters()).device
        contexts = [it.prompt_ids + it.tokens for it in items]
        ids, mask = left_pad(contexts, self.pad_id, device)  # (n, L)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0),
                         **self._fresh_cache(), use_cache=True, logits_to_keep=1)
        self.prefilled_tokens += sum(len(c) for c in contexts)
        self._merge([it.request_id for it in items], [len(c) for c in contexts], returned_cache(out), mask)
        return out.logits[:, -1]
