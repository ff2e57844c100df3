"""``decode_steps``: the token positions a batched ``generate`` call decoded, read off its cut rows: exact when every
row had the same budget (what transformers' ``generate`` itself ran), an upper bound when budgets differ."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.probes.extender import decode_steps
from adwin.sampling.rollout import generate, left_pad

CONTEXTS = [[1, 5, 6], [1, 8], [1, 9, 9, 9]]


def _hf_positions(model: torch.nn.Module, eos: set[int], max_new: int) -> int:
    ids, mask = left_pad(CONTEXTS, 0, "cpu")
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                         max_new_tokens=max_new, pad_token_id=0, eos_token_id=sorted(eos))
    return out.shape[1] - ids.shape[1]


@pytest.mark.parametrize("eos", [{2}, set(range(3, 64))])  # rarely any EOS; an EOS almost every token
def test_an_equal_budget_call_decoded_exactly_the_positions_generate_ran(eos: set[int]) -> None:
    model = make_tiny_llama(vocab_size=64, seed=4).eval()
    torch.manual_seed(0)
    g = generate(model, CONTEXTS, [7] * 3, eos=eos, pad_id=0)
    torch.manual_seed(0)
    assert decode_steps(g, [7] * 3) == _hf_positions(model, eos, 7)


def test_with_unequal_budgets_it_is_an_upper_bound_of_the_positions_generate_ran() -> None:
    model = make_tiny_llama(vocab_size=64, seed=4).eval()
    eos = set(range(3, 64))
    for seed in range(5):
        torch.manual_seed(seed)
        g = generate(model, CONTEXTS, [1, 7, 2], eos=eos, pad_id=0)
        torch.manual_seed(seed)
        assert decode_steps(g, [1, 7, 2]) >= _hf_positions(model, eos, 7)
