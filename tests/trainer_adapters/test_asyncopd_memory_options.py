"""The AsyncOPD IS learner honours the memory options of the one learner step (``adwin.loop.learner``):
``optim.micro_batch_size``, ``model.gradient_checkpointing`` and ``model.autocast`` act under
``--scheduler asyncopd`` as they do in the synchronous trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from numerics import assert_same_params
from test_asyncopd_pipeline import tiny_cfg, tiny_parts
from tiny_models import make_tiny_llama

from adwin.config import AsyncOPDSection, TrainConfig, load_config
from adwin.config.reference import read_by
from adwin.controller import Controller
from adwin.student.optimizer import build_optimizer
from adwin.trainer_adapters.asyncopd.hf import HFLearner
from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut
from adwin.trainer_adapters.asyncopd.run import build_asyncopd, run_asyncopd

pytestmark = pytest.mark.numerics  # parity of numbers across code paths: rerun per CPU capability

MEMORY_FIELDS = {"optim.micro_batch_size": 2, "model.gradient_checkpointing": True, "model.autocast": "bf16"}


def items(n: int = 6, m: int = 3, seed: int = 0) -> list[StreamItem]:
    """``n`` ragged scored items with ``m`` cached actions per token, arbitrary behaviour and teacher logprobs."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> list:
        return (-3 * torch.rand(shape, generator=g)).tolist()

    def ints(k: int) -> list[int]:
        return torch.randint(3, 64, (k,), generator=g).tolist()

    out = []
    for i in range(n):
        prompt = [1] + ints(1 + i % 4)
        it = StreamItem(f"r{i}", i, f"p{i}", prompt, "default", 8, 8, False, 0)
        for tok in ints(1 + (i * 5) % 7):
            it.append(TokenOut(tok, float(rand(1)[0]), mc_actions=ints(m),
                               mc_logprobs=rand(m)), 0)
        it.teacher_logprobs = rand(it.response_len)
        it.teacher_mc_logprobs = rand(it.response_len, m)
        out.append(it)
    return out


def cfg_of(**overrides: object) -> TrainConfig:
    return load_config(None, {"scheduler": "asyncopd", "loss.name": "reverse_kl_mc", "optim.lr": 1e-2} | overrides)


def train(cfg: TrainConfig, batches: list[list[StreamItem]], dtype: torch.dtype = torch.float64,
          ) -> tuple[list[dict[str, float]], torch.nn.Module, list[int]]:
    """One learner update per batch on a fresh tiny student; the metrics, the student, the rows of each forward."""
    model = make_tiny_llama(seed=3).to(dtype)
    rows: list[int] = []
    model.register_forward_pre_hook(lambda mod, args, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    optimizer, scheduler = build_optimizer(cfg, model)
    learner = HFLearner(model, optimizer, scheduler, cfg, pad_id=0, width=None)
    return [learner.update(b, v) for v, b in enumerate(batches)], model, rows


@pytest.mark.parametrize("loss", ["reverse_kl_mc", "reverse_kl_pg"])
def test_micro_batches_give_the_whole_batch_update(loss: str) -> None:
    batches = [items(seed=0), items(seed=1)]
    whole_m, whole, whole_rows = train(cfg_of(**{"loss.name": loss}), batches)
    micro_m, micro, micro_rows = train(cfg_of(**{"loss.name": loss, "optim.micro_batch_size": 4}), batches)
    assert whole_rows == [6, 6] and micro_rows == [4, 2, 4, 2]
    assert_same_params(whole, micro)
    for a, b in zip(whole_m, micro_m, strict=True):
        for key in ("loss/total", "loss/teacher_kl", "loss/tokens", "loss/is_ratio_p50", "loss/is_ratio_max",
                    "optim/grad_norm", "rollout/logprob_gap_p99"):
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key


def _count_mlp_calls(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[torch.dtype]]:
    """Every LlamaMLP forward, training or recompute (counted on entry: a checkpoint's recompute stops as soon as
    it has what the backward needs), and the output dtype of each forward that ran to its end."""
    from transformers.models.llama import modeling_llama

    calls: list[int] = []
    dtypes: list[torch.dtype] = []
    real = modeling_llama.LlamaMLP.forward

    def counted(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        out = real(self, x)
        dtypes.append(out.dtype)
        return out

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", counted)
    return calls, dtypes


def test_gradient_checkpointing_recomputes_the_layers_and_gives_the_same_update(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls, _ = _count_mlp_calls(monkeypatch)
    _, plain, _ = train(cfg_of(), [items()])
    n_plain = len(calls)
    _, ckpt, _ = train(cfg_of(**{"model.gradient_checkpointing": True}), [items()])
    assert n_plain == 2 and len(calls) - n_plain == 2 * 2  # two layers: a forward, then a recompute of each
    assert_same_params(plain, ckpt)
    assert not any(layer.training for layer in ckpt.model.layers)  # the flag is the training forward's only


def test_bf16_autocast_trains_in_bf16_close_to_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    _, dtypes = _count_mlp_calls(monkeypatch)
    fp32_m, _, _ = train(cfg_of(), [items()], dtype=torch.float32)  # autocast casts float32 only
    assert set(dtypes) == {torch.float32}
    dtypes.clear()
    bf16_m, bf16, _ = train(cfg_of(**{"model.autocast": "bf16"}), [items()], dtype=torch.float32)
    assert set(dtypes) == {torch.bfloat16}
    assert bf16_m[0]["loss/total"] == pytest.approx(fp32_m[0]["loss/total"], rel=0.05, abs=0.02)
    assert all(p.dtype == torch.float32 for p in bf16.parameters())


@pytest.mark.parametrize("field", sorted(MEMORY_FIELDS))
def test_the_memory_options_load_under_asyncopd_and_are_read_by_both_schedulers(field: str) -> None:
    assert read_by(field) == "both"
    cfg = load_config(None, {"scheduler": "asyncopd", "loss.name": "reverse_kl_mc", field: MEMORY_FIELDS[field]})
    section, name = field.split(".")
    assert getattr(getattr(cfg, section), name) == MEMORY_FIELDS[field]


@pytest.mark.timeout(120)
def test_a_pipeline_run_trains_in_micro_batches_with_checkpointing(tmp_path: Path) -> None:
    """``build_asyncopd`` hands the run's memory options to its learner: no learner forward sees more rows."""
    cfg = tiny_cfg(tmp_path, steps=2, **{"optim.micro_batch_size": 2, "model.gradient_checkpointing": True})
    parts = tiny_parts()
    opts = AsyncOPDSection(queue_depth=1, worker_batch=8, teacher_batch=8, wait_timeout_s=60, throughput_warmup=1)
    built = build_asyncopd(cfg, Controller(), parts=parts, options=opts)  # the rollout workers hold copies
    rows: list[int] = []
    parts.student.register_forward_pre_hook(lambda mod, args, kw: rows.append(kw["input_ids"].shape[0]),
                                            with_kwargs=True)
    out = run_asyncopd(cfg, Controller(), built=built)
    assert out["learner_shapes"] == [(4, 20)] and out["updates"] == 2
    assert rows and max(rows) <= 2
    assert all(r["optim/skipped"] == 0.0 for r in out["logged"])
