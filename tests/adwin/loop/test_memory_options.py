"""``model.gradient_checkpointing`` and ``model.autocast`` in the optimizer step, and the config refusals of the
memory options where they cannot apply."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_same_params
from pydantic import ValidationError
from step_fixtures import config, ragged_batch, run_steps

from adwin.config import load_config
from adwin.loop.memory import micro_slices, training_forward


def _count_mlp_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every LlamaMLP forward, training or recompute: checkpointing runs each layer's MLP twice per step."""
    from transformers.models.llama import modeling_llama

    calls: list[int] = []
    real = modeling_llama.LlamaMLP.forward

    def counted(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(self, x)

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", counted)
    return calls


def test_gradient_checkpointing_recomputes_the_layers_and_gives_the_same_parameters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [ragged_batch(8, seed=0)]
    calls = _count_mlp_calls(monkeypatch)
    _, plain, _ = run_steps(config(), batches)
    n_plain = len(calls)
    m, ckpt, _ = run_steps(config(**{"model.gradient_checkpointing": True, "optim.micro_batch_size": 4}), batches)
    n_teacher = n_plain - 2  # the teacher's two layers score the batch once, in one micro-batch without the option
    assert len(calls) - n_plain == 2 * n_teacher + 2 * 2 * 2  # teacher 2 micro-batches; student 2 x (fwd + recompute)
    assert_same_params(plain, ckpt)
    assert not ckpt.training and not any(layer.training for layer in ckpt.model.layers)  # eval mode restored
    assert m[0]["optim/skipped"] == 0.0


def test_checkpointing_keeps_dropout_off_in_the_training_forward() -> None:
    from tiny_models import make_tiny_llama

    model = make_tiny_llama(seed=3)
    model.config.attention_dropout = 0.5
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    ids = torch.randint(3, 64, (2, 9))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    with training_forward(model, config(**{"model.gradient_checkpointing": True})), torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits
    assert torch.equal(got, want)


def test_bf16_autocast_trains_in_bf16_close_to_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    dtypes: list[torch.dtype] = []
    real = modeling_llama.LlamaMLP.forward
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward",
                        lambda self, x: dtypes.append(real(self, x).dtype) or real(self, x))
    batches = [ragged_batch(8, seed=0)]
    fp32_m, fp32, _ = run_steps(config(), batches, dtype=torch.float32)  # autocast casts float32 only
    dtypes.clear()
    bf16_m, bf16, lp = run_steps(config(**{"model.autocast": "bf16"}), batches, dtype=torch.float32)
    assert torch.bfloat16 in dtypes
    assert bf16_m[0]["loss/total"] == pytest.approx(fp32_m[0]["loss/total"], rel=0.05, abs=0.02)
    assert bf16_m[0]["loss/teacher_kl"] == pytest.approx(fp32_m[0]["loss/teacher_kl"], rel=0.05, abs=0.02)
    assert lp[0].dtype == torch.float32 and all(p.dtype == torch.float32 for p in bf16.parameters())
    assert_same_params(fp32, bf16, 1e-2)  # one step of lr 1e-3: the update's direction survives bf16


def test_autocast_refuses_half_precision_weights_and_other_devices() -> None:
    with pytest.raises(ValidationError, match=r"model\.autocast"):
        load_config(None, {"model.autocast": "bf16", "model.dtype": "bfloat16"})
    with pytest.raises(ValidationError, match=r"model\.autocast"):
        load_config(None, {"model.autocast": "bf16", "model.device": "mps"})
    with pytest.raises(ValidationError, match="micro_batch_size"):
        load_config(None, {"optim.micro_batch_size": 0})
    assert load_config(None, {"model.autocast": "bf16", "model.device": "cuda:1"}).model.autocast == "bf16"


def test_micro_slices_cover_the_rows_in_order() -> None:
    assert micro_slices(8, None) == [slice(0, 8)] == micro_slices(8, 8) == micro_slices(8, 100)
    assert micro_slices(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
