"""Shared pieces of the micro-batch, reducer and memory-option tests: a ragged batch, a teacher, one step."""

from __future__ import annotations

import random
import threading
from typing import Any

import torch
from tiny_models import make_tiny_llama

from adwin.config import TrainConfig, load_config
from adwin.loop.step import TeacherSignal, optimize, score_teacher
from adwin.objectives.losses import token_logprobs
from adwin.sampling.batch import Batch
from adwin.sampling.data import Prompt
from adwin.sampling.rollout import layout
from adwin.student.lora import apply_lora
from adwin.student.optimizer import build_optimizer
from adwin.teacher.local import Teachers

WINDOW = 6
_BUILD = threading.Lock()  # models are built under the global torch seed: one thread at a time


def ragged_batch(n: int = 8, seed: int = 0) -> Batch:
    """``n`` rows of 2-5 prompt and 1-9 response tokens (some past the window, one of a single token)."""
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, 64) for _ in range(rng.randrange(1, 5))] for _ in range(n)]
    responses = [[rng.randrange(3, 64) for _ in range(1 if b == 1 else rng.randrange(1, 10))] for b in range(n)]
    rows = layout(prompts, responses, pad_id=0)
    return Batch([Prompt(str(b), "q") for b in range(n)], prompts, responses, [True] * n, rows)


def with_behavior(batch: Batch, model: torch.nn.Module, shift: float = 0.3, seed: int = 0) -> Batch:
    """The batch with behavior logprobs: the model's own, moved by up to ``shift`` nats per token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=batch.rows.input_ids, attention_mask=batch.rows.attention_mask).logits,
                            batch.rows.input_ids)  # (B, L)
    out = []
    for b, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids, strict=True)):
        row = lp[b, len(p) : len(p) + len(r)]
        out.append((row + shift * (2 * torch.rand(len(r), generator=g) - 1)).tolist())
    return Batch(batch.prompts, batch.prompt_ids, batch.response_ids, batch.finished, batch.rows, out)


def teachers(dtype: torch.dtype = torch.float32) -> Teachers:
    return Teachers({"default": make_tiny_llama(seed=11).to(dtype)})


def config(**overrides: Any) -> TrainConfig:
    return load_config(None, {"optim.lr": 1e-3} | overrides)


def run_steps(cfg: TrainConfig, batches: list[Batch], *, student_seed: int = 3, reducer: Any = None,
              dtype: torch.dtype = torch.float64) -> tuple[list[dict[str, float]], torch.nn.Module, list[torch.Tensor]]:
    """``optimize`` once per batch on a fresh tiny student (with ``model.lora``: its LoRA wrapper, as
    ``adwin.loop.parts.load_parts`` builds it); returns the metrics, the student, the logprobs.

    float64 by default: the step parity tests promise exactness (tests/numerics.py), which a float32 run cannot
    keep through Adam's normalisation on every CPU's kernels."""
    with _BUILD:
        model = make_tiny_llama(seed=student_seed).to(dtype)
        t = teachers(dtype)
        if cfg.model.lora is not None:
            model = apply_lora(model, cfg.model.lora, seed=cfg.seed)
    optimizer, scheduler = build_optimizer(cfg, model)
    metrics, current = [], []
    for batch in batches:
        signal: TeacherSignal = score_teacher(t, batch, cfg)
        m, lp = optimize(model, optimizer, scheduler, batch, signal, cfg, WINDOW, reducer=reducer)
        metrics.append(m)
        current.append(lp)
    return metrics, model, current
