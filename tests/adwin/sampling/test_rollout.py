from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import make_tiny_llama

from adwin.decode.generate import generate
from adwin.decode.loop import left_pad
from adwin.objectives.losses import token_logprobs
from adwin.sampling.rollout import layout, response_values

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


def test_generation_samples_in_eval_mode_and_restores_the_training_mode() -> None:
    model = make_tiny_llama(seed=3)
    model.config.attention_dropout = 0.5  # dropout the policy must not sample with
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    contexts = [[1, 5, 6], [1, 7, 8, 9]]
    want = generate(model, contexts, [8, 8], eos=EOS, pad_id=0, temperature=0.0).response_ids  # eval mode
    model.train()
    for seed in range(3):
        torch.manual_seed(seed)
        assert generate(model, contexts, [8, 8], eos=EOS, pad_id=0, temperature=0.0).response_ids == want
    assert model.training


def test_verbatim_sampling_arguments_exclude_temperature_and_top_p() -> None:
    with pytest.raises(ValueError, match="not both"):
        generate(make_tiny_llama(), [[1, 5]], [2], eos=EOS, pad_id=0, temperature=0.5, sampling={"do_sample": True})


def test_layout_widens_rows_to_a_fixed_width() -> None:
    rows = layout([[1, 5], [1]], [[9], [7, 2]], pad_id=0, width=6)
    assert rows.input_ids.tolist() == [[1, 5, 9, 0, 0, 0], [1, 7, 2, 0, 0, 0]]
    assert rows.response_mask.tolist() == [[0, 0, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0]]


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4)), min_size=1, max_size=5))
def test_response_values_sit_on_the_response_columns_and_fill_the_rest(shape: list[tuple[int, int]]) -> None:
    prompts = [[1] * n_p for n_p, _ in shape]
    responses = [[3] * n_r for _, n_r in shape]
    values = [[float(10 * b + j) for j in range(n_r)] for b, (_, n_r) in enumerate(shape)]
    rows = layout(prompts, responses, pad_id=0)
    out = response_values(rows, values, fill=-7.0)
    for b, (n_p, n_r) in enumerate(shape):
        want = [-7.0] * n_p + values[b] + [-7.0] * (rows.input_ids.shape[1] - n_p - n_r)
        assert out[b].tolist() == want
    assert torch.equal(out != -7.0, rows.response_mask.bool())


def test_response_values_refuse_a_count_that_is_not_one_per_response_token() -> None:
    rows = layout([[1, 5]], [[9, 2]], pad_id=0)
    with pytest.raises(ValueError, match="1 values for 2 response tokens"):
        response_values(rows, [[0.5]])
