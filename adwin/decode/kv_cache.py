"""The KV cache of a transformers forward call, across releases.

transformers 5.24 renamed the forward keyword and the output field ``past_key_values`` to ``cache``: the old
names still work there but warn on every call (and are to go in 5.40), while earlier releases know only
``past_key_values``. Every loop that feeds a cache back into a model (compact evaluation, the audit's
segmented forward, the AsyncOPD decode engine) passes it through here, so one place follows the rename.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch


@functools.cache
def _default_keyword() -> str:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache by: the one its signature names, else (a wrapper or a
    ``**kwargs`` forward) the installed transformers' own."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without an inspectable signature
        params = {}
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return _default_keyword()


def with_cache(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``model(**inputs, **with_cache(model, cache), use_cache=True)``; a loop that feeds
    the cache back every token looks its ``cache_keyword`` up once instead."""
    return {cache_keyword(model): cache}


def returned_cache(out: Any) -> Any:
    """The cache a forward returned (None when it returned none), read by the output's own field name."""
    names = {f.name for f in dataclasses.fields(out)} if dataclasses.is_dataclass(out) else set()
    return getattr(out, "cache", None) if "cache" in names else getattr(out, "past_key_values", None)


def last_logits_only(model: torch.nn.Module) -> dict[str, Any]:
    """``{"logits_to_keep": 1}`` when ``model.forward`` takes it (by name or through ``**kwargs``): a prefill then
    projects the last position only, as transformers' ``generate`` asks; ``{}`` for a forward that cannot."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    takes = "logits_to_keep" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {"logits_to_keep": 1} if takes else {}


# Static cache layers across releases. From transformers 5.0 a ``StaticLayer`` keeps its own write position (a
# ``cumulative_length`` tensor the forward advances) and is allocated from keys and values; 4.x layers write where
# the forward's ``cache_position`` says and are allocated from keys alone. ``StaticBatch`` goes through these.


def tracks_position(layer: Any) -> bool:
    """Whether the static ``layer`` keeps its own write position (transformers >= 5); else the caller passes
    ``cache_position`` to every forward."""
    return hasattr(layer, "cumulative_length")


def is_allocated(layer: Any) -> bool:
    """Whether the static ``layer`` holds its key and value tensors yet (they are allocated on first use)."""
    flag = getattr(layer, "is_initialized", None)
    return bool(flag) if flag is not None else getattr(layer, "keys", None) is not None


def allocate(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Allocate the static ``layer``'s tensors shaped like ``keys``/``values`` (rows, heads, n, dim)."""
    if "value_states" in inspect.signature(layer.lazy_initialization).parameters:
        layer.lazy_initialization(keys, values)
    else:  # 4.x: one head dim for keys and values, taken from the keys
        layer.lazy_initialization(keys)


class UncachedModelError(ValueError):
    """The model returned no KV cache (or, for ``drop_stopped``, none whose rows can be dropped)."""


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and attention mask with every sequence flush right."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        if s:
            ids[b, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[b, width - len(s) :] = 1
    return ids.to(device), mask.to(device)
