"""``steps_needed``: the decode steps rows of one budget needed, read off their cut rows, is what transformers'
``generate`` decoded for them (``Generation.decode_steps``): the riding call charges its riders the rest."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.decode.generate import generate
from adwin.sampling.batch import steps_needed

CONTEXTS = [[1, 5, 6], [1, 8], [1, 9, 9, 9]]


@pytest.mark.parametrize("eos", [{2}, set(range(3, 64))])  # rarely any EOS; an EOS almost every token
def test_rows_of_one_budget_needed_the_positions_generate_decoded(eos: set[int]) -> None:
    model = make_tiny_llama(vocab_size=64, seed=4)
    for seed in range(3):
        torch.manual_seed(seed)
        g = generate(model, CONTEXTS, [7] * 3, eos=eos, pad_id=0)
        assert steps_needed(g, 7) == g.decode_steps
