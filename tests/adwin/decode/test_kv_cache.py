"""The KV-cache keyword and output field follow the model and the installed transformers (``cache`` from 5.24,
``past_key_values`` before), so feeding a cache back never goes through the deprecated name."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.decode.kv_cache import (
    _default_keyword,
    allocate,
    cache_keyword,
    is_allocated,
    returned_cache,
    tracks_position,
    with_cache,
)
from adwin.sampling.compact import generate_compacting


class _NewName(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, cache: Any = None, use_cache: bool = False) -> None: ...


class _OldName(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = False) -> None: ...


class _Wrapper(torch.nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> None: ...


def test_the_keyword_is_the_one_the_forward_names_else_the_installed_transformers() -> None:
    assert cache_keyword(_NewName()) == "cache"
    assert cache_keyword(_OldName()) == "past_key_values"
    assert cache_keyword(_Wrapper()) == _default_keyword() in ("cache", "past_key_values")
    assert with_cache(_OldName(), "kv") == {"past_key_values": "kv"}


def test_a_tiny_llama_takes_the_installed_transformers_keyword() -> None:
    import inspect

    model = make_tiny_llama(vocab_size=16, seed=0)
    assert cache_keyword(model) == _default_keyword()
    assert cache_keyword(model) in inspect.signature(model.forward).parameters


@dataclasses.dataclass
class _OutNew:
    logits: Any = None
    cache: Any = None


@dataclasses.dataclass
class _OutOld:
    logits: Any = None
    past_key_values: Any = None


@pytest.mark.parametrize("out", [_OutNew(cache="kv"), _OutOld(past_key_values="kv")])
def test_the_returned_cache_is_read_by_the_outputs_own_field(out: Any) -> None:
    assert returned_cache(out) == "kv"
    assert returned_cache(type(out)()) is None


def test_compact_generation_feeds_its_cache_back_without_the_deprecated_name() -> None:
    model = make_tiny_llama(vocab_size=64, seed=0).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = generate_compacting(model, [[1, 5, 6], [1, 9]], 6, eos={2}, pad_id=0, temperature=0.0)
    assert [len(r) for r in out.response_ids] == [6, 6] or any(out.finished)
    assert not [w for w in caught if "past_key_values" in str(w.message)]


class _Layer4x:
    """A 4.x static layer's surface: allocated from keys alone, no write position of its own."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor) -> None:
        self.keys = torch.zeros(key_states.shape[0], key_states.shape[1], 8, key_states.shape[-1])


def test_a_4x_static_layer_is_allocated_from_its_keys_and_has_its_write_position_passed_in() -> None:
    layer = _Layer4x()
    assert not is_allocated(layer) and not tracks_position(layer)
    allocate(layer, torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 4))
    assert is_allocated(layer) and layer.keys is not None and layer.keys.shape == (2, 3, 8, 4)


def test_the_installed_static_layer_is_allocated_from_keys_and_values() -> None:
    from transformers import StaticCache

    model = make_tiny_llama(vocab_size=16, seed=0)
    layer = StaticCache(config=model.config, max_cache_len=8).layers[0]
    assert not is_allocated(layer)
    allocate(layer, torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 6))
    assert is_allocated(layer) and layer.keys.shape[:3] == (2, 3, 8) and layer.values.shape[:3] == (2, 3, 8)
