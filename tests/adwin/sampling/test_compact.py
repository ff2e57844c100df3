"""The compacting sampler (evaluation's): ``generate``'s samples, stopped rows dropped from the batch."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama, without_cache

from adwin.decode.generate import generate
from adwin.sampling.compact import generate_compacting
from adwin.sampling.seeding import row_seed

EOS = {2}
CONTEXTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8], [1, 10, 11], [1, 12], [1, 13, 14]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = make_tiny_llama(vocab_size=64, seed=0)
    with torch.no_grad():  # make EOS likely enough that rows stop at different lengths
        m.lm_head.weight[2] += 0.3 * m.lm_head.weight.norm(dim=1).mean()
    return m


def _plain(model, budget: int, **kw) -> object:
    return generate(model, CONTEXTS, [budget] * len(CONTEXTS), eos=EOS, pad_id=0, **kw)


def test_greedy_tokens_equal_transformers_generate_and_rows_stop_at_different_lengths(model) -> None:
    plain = _plain(model, 40, temperature=0.0)
    compact = generate_compacting(model, CONTEXTS, 40, eos=EOS, pad_id=0, temperature=0.0)
    assert compact.response_ids == plain.response_ids and compact.finished == plain.finished
    assert len({len(r) for r in plain.response_ids}) > 1  # some rows really left the batch early


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_per_row_seeds_give_generate_s_tokens_whatever_leaves_the_batch(model, top_p: float) -> None:
    seeds = [row_seed(3, "eval", 0, i) for i in range(len(CONTEXTS))]
    plain = _plain(model, 40, row_seeds=seeds, top_p=top_p, temperature=0.9)
    compact = generate_compacting(model, CONTEXTS, 40, eos=EOS, pad_id=0, row_seeds=seeds, top_p=top_p,
                                  temperature=0.9)
    assert compact.response_ids == plain.response_ids and compact.finished == plain.finished
    assert sum(compact.finished) >= 2 and len({len(r) for r in compact.response_ids}) > 1


def test_global_rng_samples_are_cut_at_eos_or_budget_and_repeat_under_one_seed(model) -> None:
    torch.manual_seed(0)
    a = generate_compacting(model, CONTEXTS, 12, eos=EOS, pad_id=0)
    torch.manual_seed(0)
    b = generate_compacting(model, CONTEXTS, 12, eos=EOS, pad_id=0)
    assert a.response_ids == b.response_ids
    for resp, done in zip(a.response_ids, a.finished, strict=True):
        assert 1 <= len(resp) <= 12
        assert done == (resp[-1] in EOS) and all(t not in EOS for t in resp[:-1])
        assert done or len(resp) == 12


def test_the_model_keeps_its_mode_and_empty_requests_generate_nothing(model) -> None:
    model.train()
    generate_compacting(model, CONTEXTS[:2], 3, eos=EOS, pad_id=0)
    assert model.training
    model.eval()
    assert generate_compacting(model, [], 5, eos=EOS, pad_id=0).response_ids == []
    assert generate_compacting(model, CONTEXTS[:2], 0, eos=EOS, pad_id=0).response_ids == [[], []]
    with pytest.raises(ValueError, match="row_seeds"):
        generate_compacting(model, CONTEXTS[:2], 3, eos=EOS, pad_id=0, row_seeds=[1])


def test_a_model_without_a_droppable_cache_is_refused_naming_the_fallback(model) -> None:
    with pytest.raises(ValueError, match="eval.compact=false"):
        generate_compacting(without_cache(model), CONTEXTS[:2], 3, eos=EOS, pad_id=0)
