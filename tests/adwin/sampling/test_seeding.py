"""Per-sample seeding (``rollout.seeding: per_sample``): a row's tokens do not depend on its batch."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.config import load_config
from adwin.decode.generate import generate
from adwin.decode.sampler import TokenSampler
from adwin.sampling.seeding import context_keys, row_seed

CONTEXTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8], [1, 10, 11]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return make_tiny_llama(vocab_size=64, seed=0)


def _gen(model: torch.nn.Module, rows: slice, seeds: list[int], **kw: float):
    return generate(model, CONTEXTS[rows], [12] * len(CONTEXTS[rows]), eos={2}, pad_id=0, row_seeds=seeds[rows],
                    with_logprobs=True, **kw)


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.8, "top_p": 0.9}])
def test_per_sample_rows_are_identical_in_one_batch_or_split_in_two(model, kw) -> None:
    seeds = [row_seed(0, "rollout", 3, i) for i in range(len(CONTEXTS))]
    whole = _gen(model, slice(0, 4), seeds, **kw)
    first, second = _gen(model, slice(0, 2), seeds, **kw), _gen(model, slice(2, 4), seeds, **kw)
    assert whole.response_ids == first.response_ids + second.response_ids
    assert whole.finished == first.finished + second.finished
    assert sum(map(len, whole.response_ids)) > 10  # the rows really sampled something
    # behavior logprobs are the model's own (temperature 1), close whatever the batch padding
    for a, b in zip(whole.logprobs, first.logprobs + second.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_other_seeds_give_other_samples(model) -> None:
    a = _gen(model, slice(0, 4), [row_seed(0, "rollout", 0, i) for i in range(4)])
    b = _gen(model, slice(0, 4), [row_seed(0, "rollout", 1, i) for i in range(4)])
    assert a.response_ids != b.response_ids


def test_gumbel_max_samples_the_tempered_top_p_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])  # (1, V)
    n, temperature, top_p = 4000, 0.7, 0.9
    counts = torch.zeros(4)
    sampler = TokenSampler(temperature, top_p, row_seeds=[row_seed(0, "eval", 0, i) for i in range(n)])
    picks = sampler(logits.expand(n, 4))  # (n,)
    counts += torch.bincount(picks, minlength=4)
    p = torch.softmax(logits[0] / temperature, -1)
    keep = torch.cumsum(p, 0) - p < top_p  # HF keeps the smallest top set reaching top_p
    expected = torch.where(keep, p, torch.zeros_like(p))
    expected /= expected.sum()
    assert (counts / n - expected).abs().max() < 0.03
    assert counts[~keep].sum() == 0


def test_identical_contexts_of_a_round_get_distinct_keys() -> None:
    keys = context_keys([[1, 2], [1, 2], [1, 3]])
    assert len(set(keys)) == 3
    assert context_keys([[1, 2], [1, 2]]) == keys[:2]  # the same in every process


@pytest.mark.parametrize("override,field", [({"probes.backend": "thread"}, "probes.backend"),
                                            ({"rollout.backend": "vllm"}, "rollout.backend")])
def test_per_sample_seeding_is_refused_where_it_cannot_apply(override, field) -> None:
    with pytest.raises(ValueError, match=field):
        load_config(None, {"rollout.seeding": "per_sample", **override})
