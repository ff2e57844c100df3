from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.objectives.losses import token_logprobs
from adwin.sampling.rollout import generate, layout, left_pad

EOS = {2}


def test_layout_is_right_padded_with_response_mask() -> None:
    rows = layout([[1, 5], [1, 6, 7]], [[9, 2], []], pad_id=0)
    assert rows.input_ids.tolist() == [[1, 5, 9, 2], [1, 6, 7, 0]]
    assert rows.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert rows.response_mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]


def test_left_pad_puts_tokens_flush_right() -> None:
    ids, mask = left_pad([[4], [5, 6, 7]], pad_id=0, device="cpu")
    assert ids.tolist() == [[0, 0, 4], [5, 6, 7]]
    assert mask.tolist() == [[0, 0, 1], [1, 1, 1]]


def test_generation_respects_budgets_and_flags_eos() -> None:
    torch.manual_seed(0)
    model = make_tiny_llama()
    g = generate(model, [[1, 5, 6], [1, 7]] * 4, [3, 9] * 4, eos=EOS, pad_id=0, temperature=1.0)
    for b, (resp, done) in enumerate(zip(g.response_ids, g.finished, strict=True)):
        assert len(resp) <= [3, 9][b % 2]
        assert done == (2 in resp)
        if done:
            assert resp[-1] == 2 and resp.count(2) == 1  # cut right after the first EOS
        else:
            assert len(resp) == [3, 9][b % 2]  # an unfinished sample used its whole budget


def test_left_padded_batch_matches_single_greedy_generation() -> None:
    model = make_tiny_llama(seed=1)
    contexts = [[1, 5, 6, 7, 8], [1, 9]]
    batched = generate(model, contexts, [6, 6], eos=EOS, pad_id=0, temperature=0.0)
    for b, ctx in enumerate(contexts):
        single = generate(model, [ctx], [6], eos=EOS, pad_id=0, temperature=0.0)
        assert batched.response_ids[b] == single.response_ids[0]


def test_behavior_logprobs_match_a_scoring_forward_pass() -> None:
    torch.manual_seed(0)
    model = make_tiny_llama(seed=2)
    contexts = [[1, 5, 6], [1, 7, 8, 9, 10]]
    g = generate(model, contexts, [5, 5], eos=EOS, pad_id=0, temperature=1.0, with_logprobs=True)
    rows = layout(contexts, g.response_ids, pad_id=0)
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits, rows.input_ids)
    for b, ctx in enumerate(contexts):
        n = len(g.response_ids[b])
        want = lp[b, len(ctx) : len(ctx) + n]
        assert torch.allclose(torch.tensor(g.logprobs[b]), want, atol=1e-4)


def test_zero_budget_generates_nothing() -> None:
    model = make_tiny_llama()
    g = generate(model, [[1, 4]], [0], eos=EOS, pad_id=0, with_logprobs=True)
    assert g.response_ids == [[]] and g.finished == [False] and g.logprobs == [[]]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_generation_is_reproducible_under_a_seed(temperature: float) -> None:
    model = make_tiny_llama(seed=3)
    outs = []
    for _ in range(2):
        torch.manual_seed(11)
        outs.append(generate(model, [[1, 5], [1, 6]], [7, 7], eos=EOS, pad_id=0, temperature=temperature).response_ids)
    assert outs[0] == outs[1]
