"""The optimizer step of a LoRA student: only the adapters move, and micro-batches, activation checkpointing,
data-parallel gradient sums and LoRA dropout work on the adapters as they do on a full student."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_same_params
from step_fixtures import config, ragged_batch, run_steps
from test_reduce import two_ranks
from tiny_models import make_tiny_llama

from adwin.loop.memory import training_forward
from adwin.student.lora import apply_lora, trainable_named_parameters

peft = pytest.importorskip("peft")  # the lora extra

LORA = {"model.lora.r": 4, "model.lora.alpha": 8, "optim.lr": 1e-2}
BATCHES = [ragged_batch(8, seed=0), ragged_batch(8, seed=1)]


def _base(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("base_model.model.").replace(".base_layer.", "."): p
            for n, p in model.named_parameters() if "lora_" not in n}


def test_a_lora_step_moves_the_adapters_and_leaves_the_base_bit_identical() -> None:
    m, student, _ = run_steps(config(**LORA), BATCHES)
    fresh = make_tiny_llama(seed=3).double()  # run_steps' student before wrapping
    for name, p in _base(student).items():
        assert torch.equal(p, dict(fresh.named_parameters())[name]), name
    moved = [n for n, p in trainable_named_parameters(student) if ".lora_B." in n and float(p.detach().abs().max()) > 0]
    assert len(moved) == 14 and all(x["optim/skipped"] == 0.0 for x in m)
    # the logged norm is the adapters' gradient norm (peft starts B at zero: the first step has A-gradients of zero)
    assert 0.0 < m[0]["optim/grad_norm"] < float("inf")


def test_micro_batches_and_activation_checkpointing_train_the_adapters_as_the_whole_batch() -> None:
    _, whole, _ = run_steps(config(**LORA), BATCHES)
    _, micro, _ = run_steps(config(**LORA, **{"optim.micro_batch_size": 3}), BATCHES)
    _, ckpt, _ = run_steps(config(**LORA, **{"model.gradient_checkpointing": True}), BATCHES)
    assert_same_params(whole, micro)
    assert_same_params(whole, ckpt)


def test_two_ranks_of_a_lora_student_sum_the_adapter_gradients_only_and_train_like_one_process() -> None:
    cfg = config(**LORA)
    _, one, _ = run_steps(cfg, BATCHES)
    (r0, r1), hub = two_ranks(cfg, BATCHES)
    assert_same_params(one, r0[1])
    assert_same_params(r0[1], r1[1], 0.0)
    n_adapters = sum(p.numel() for _, p in trainable_named_parameters(one))
    grad_sums = [shape for shape in hub.calls[0] if shape[0] > 16]  # the normaliser and metric sums are tiny
    assert grad_sums == [(n_adapters,)] * len(BATCHES)  # one bucket a step: the adapters, never the base


def test_lora_dropout_is_on_in_the_training_forward_only() -> None:
    student = apply_lora(make_tiny_llama(seed=3), config(**{"model.lora.dropout": 0.5}).model.lora)
    with torch.no_grad():
        for _, p in trainable_named_parameters(student):
            p.add_(0.3)  # B off zero, or the adapters (and their dropout) add nothing
    ids = torch.randint(3, 64, (2, 9))

    def logits() -> torch.Tensor:
        with torch.no_grad():
            return student(input_ids=ids, use_cache=False).logits

    plain = logits()
    assert torch.equal(logits(), plain)  # rollouts, probes, audits and evaluation: no dropout
    with training_forward(student, config(**{"model.lora.dropout": 0.5})):
        dropped = [logits(), logits()]
    assert not torch.equal(dropped[0], plain) and not torch.equal(dropped[0], dropped[1])
    assert torch.equal(logits(), plain) and not student.training  # flags restored
    with training_forward(student, config(**{"model.lora.dropout": 0.0})):
        assert torch.equal(logits(), plain)  # a config without dropout never turns it on
