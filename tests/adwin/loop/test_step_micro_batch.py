"""``optim.micro_batch_size``: gradient accumulation inside a step gives the whole batch's update and metrics."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_same_params, f32_sum_tol
from step_fixtures import WINDOW, config, ragged_batch, run_steps, teachers, with_behavior
from tiny_models import make_tiny_llama

from adwin.loop.step import optimize, score_teacher
from adwin.objectives.losses import opd_loss
from adwin.student.optimizer import build_optimizer

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
COMPARED = ("loss/total", "loss/teacher_kl", "loss/tokens")


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_quarter_micro_batches_give_the_same_parameters_after_two_steps(aggregation: str) -> None:
    batches = [ragged_batch(8, seed=0), ragged_batch(8, seed=1)]
    whole_m, whole, whole_lp = run_steps(config(**{"loss.aggregation": aggregation}), batches)
    micro_m, micro, micro_lp = run_steps(
        config(**{"loss.aggregation": aggregation, "optim.micro_batch_size": 2}), batches)
    assert_same_params(whole, micro)
    for a, b in zip(whole_m, micro_m, strict=True):
        for k in COMPARED:
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k
    for a, b in zip(whole_lp, micro_lp, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)  # the (B, L) logprobs probes carry forward


CASES = [
    ("reverse_kl_pg", {}),
    ("reverse_kl_pg", {"loss.iw_gamma": 0.5}),
    ("reverse_kl_pg", {"loss.is_method": "clip", "loss.is_low": 0.9, "loss.is_high": 1.1}),
    ("reverse_kl_pg", {"loss.is_method": "icepop", "loss.is_low": 0.9, "loss.is_high": 1.1}),
    ("reverse_kl_pg", {"loss.clip_low": 0.1, "loss.clip_high": 0.1}),
    ("k2", {"loss.iw_gamma": 0.5}),
    ("k3", {}),
    ("forward_kl", {}),
    ("reverse_kl", {}),
    ("jsd", {"loss.jsd_beta": 0.3}),
    ("forward_kl_topk", {"loss.topk": 5}),
]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("name, extra", CASES, ids=[f"{n}-{'-'.join(e) or 'plain'}" for n, e in CASES])
def test_every_loss_and_aggregation_gives_the_whole_batch_update_in_uneven_micro_batches(
        name: str, extra: dict, aggregation: str) -> None:
    overrides = {"loss.name": name, "loss.aggregation": aggregation} | extra
    batch = ragged_batch(8, seed=2)
    if any(k.startswith(("loss.is_", "loss.clip")) for k in extra):
        batch = with_behavior(batch, make_tiny_llama(seed=3))
    # float32, as the step runs by default; compared before the optimizer (the gradients left in .grad): Adam's
    # first step, ~lr * sign(g), turns rounding in near-zero gradient entries into visible parameter differences
    whole_m, whole, _ = run_steps(config(**overrides), [batch], dtype=torch.float32)
    micro_m, micro, _ = run_steps(config(**overrides, **{"optim.micro_batch_size": 3}), [batch],
                                  dtype=torch.float32)  # rows 3 + 3 + 2
    # within float32 rounding of the largest entry: each entry sums one term per response token of the batch
    scale = max(float(p.grad.abs().max()) for p in whole.parameters())
    tol = f32_sum_tol(int(batch.rows.response_mask.sum())) * scale
    for (n, p), q in zip(whole.named_parameters(), micro.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0.0, atol=tol, msg=lambda m, n=n: f"{n}: {m}")
    assert set(micro_m[0]) == set(whole_m[0])
    for k, v in whole_m[0].items():
        assert micro_m[0][k] == pytest.approx(v, rel=1e-5, abs=1e-6, nan_ok=True), k


def test_the_whole_batch_path_is_todays_computation_bit_for_bit() -> None:
    """No micro_batch_size, no reducer: one forward, one unnormalised ``opd_loss``, as before the option."""
    cfg, batch = config(**{"loss.aggregation": "seq-mean-token-mean"}), ragged_batch(8, seed=4)
    _, got, _ = run_steps(cfg, [batch], dtype=torch.float32)  # float32 as the step runs by default
    model = make_tiny_llama(seed=3)
    optimizer, scheduler = build_optimizer(cfg, model)
    signal = score_teacher(teachers(), batch, cfg)
    rows = batch.rows
    logits = model(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits
    loss, _ = opd_loss("reverse_kl_pg", input_ids=rows.input_ids, response_mask=rows.response_mask,
                       student_logits=logits, teacher_logprobs=signal.logprobs, window=WINDOW,
                       aggregation="seq-mean-token-mean")
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
    optimizer.step()
    for p, q in zip(got.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_teacher_scoring_in_micro_batches_equals_the_whole_batch() -> None:
    batch, t = ragged_batch(8, seed=5), teachers()
    for name in ("reverse_kl_pg", "forward_kl_topk", "jsd"):
        whole = score_teacher(t, batch, config(**{"loss.name": name}))
        micro = score_teacher(t, batch, config(**{"loss.name": name, "optim.micro_batch_size": 3}))
        tol = f32_sum_tol(64)  # a log-softmax over the tiny vocabulary (64)
        torch.testing.assert_close(micro.logprobs, whole.logprobs, rtol=tol, atol=tol)
        for field in ("logits", "topk_ids", "topk_logprobs"):
            a, b = getattr(whole, field), getattr(micro, field)
            assert (a is None) == (b is None), (name, field)
            if a is not None:
                torch.testing.assert_close(b, a, rtol=tol, atol=tol)
    assert score_teacher(t, batch, config(**{"loss.name": "k3"})).logits is None  # realized logprobs suffice


def test_an_optimizer_step_with_micro_batches_runs_each_forward_on_at_most_that_many_rows() -> None:
    cfg, batch = config(**{"optim.micro_batch_size": 3}), ragged_batch(8, seed=6)
    model = make_tiny_llama(seed=3)
    seen: list[int] = []
    model.model.embed_tokens.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[0]))
    optimizer, scheduler = build_optimizer(cfg, model)
    optimize(model, optimizer, scheduler, batch, score_teacher(teachers(), batch, cfg), cfg, WINDOW)
    assert seen == [3, 3, 2]
