"""The one generation loop (``adwin.decode.loop.decode``): budgets per row, and rows that stop kept or dropped."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama, without_cache

from adwin.decode.loop import decode
from adwin.decode.sampler import TokenSampler

CONTEXTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8], [1, 10, 11]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return make_tiny_llama(vocab_size=64, seed=0)


def test_a_row_gets_at_most_its_own_budget_and_a_zero_budget_gets_nothing(model) -> None:
    g = decode(model, CONTEXTS, [0, 5, 3, 9], eos=set(), pad_id=0, sampler=TokenSampler(0.0), with_logprobs=True)
    assert [len(r) for r in g.response_ids] == [0, 5, 3, 9]
    assert [len(lp) for lp in g.logprobs] == [0, 5, 3, 9]
    assert g.finished == [False] * 4 and g.decode_steps == 9


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_per_row_seeds_give_the_same_tokens_whether_stopped_rows_stay_or_leave(model, temperature: float) -> None:
    seeds = [11, 12, 13, 14]
    kw = {"eos": {2, 7}, "pad_id": 0}
    kept = decode(model, CONTEXTS, [12, 4, 12, 8], sampler=TokenSampler(temperature, row_seeds=seeds), **kw)
    dropped = decode(model, CONTEXTS, [12, 4, 12, 8], sampler=TokenSampler(temperature, row_seeds=seeds),
                     drop_stopped=True, **kw)
    assert kept.response_ids == dropped.response_ids and kept.finished == dropped.finished
    assert any(kept.finished) or any(len(r) < b for r, b in zip(kept.response_ids, [12, 4, 12, 8], strict=True))


def test_a_model_that_returns_no_cache_is_refused_by_type(model) -> None:
    from adwin.decode.loop import UncachedModelError

    with pytest.raises(UncachedModelError, match="no KV cache"):
        decode(without_cache(model), CONTEXTS, [3] * 4, eos={2}, pad_id=0, sampler=TokenSampler(0.0))
