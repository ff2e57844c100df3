"""Shared pieces of the micro-batch, reducer and memory-option tests: a ragged batch, a teacher, one step."""

from __future__ import annotations

import random
import threading
from typing import Any

import torch
from tiny_models import make_tiny_llama

from adwin.config import TrainConfig, load_config
from adwin.loop.parts import build_optimizer
from adwin.loop.sampler import Batch
from adwin.loop.step import TeacherSignal, optimize, score_teacher
from adwin.objectives.losses import token_logprobs
from adwin.sampling.data import Prompt
from adwin.sampling.lora import apply_lora
from adwin.sampling.rollout import layout
from adwin.sampling.teacher import Teachers

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


def teachers() -> Teachers:
    return Teachers({"default": make_tiny_llama(seed=11)})


def config(**overrides: Any) -> TrainConfig:
    # lr 1e-3: Adam's first steps move each weight by about lr * sign(g), so float noise in a near-zero gradient
    # entry shows up as a parameter difference of up to ~1e-3 * lr; at 1e-2 an entry or two can pass 1e-5
    return load_config(None, {"optim.lr": 1e-3} | overrides)


def run_steps(cfg: TrainConfig, batches: list[Batch], *, student_seed: int = 3,
              reducer: Any = None) -> tuple[list[dict[str, float]], torch.nn.Module, list[torch.Tensor]]:
    """``optimize`` once per batch on a fresh tiny student (with ``model.lora``: its LoRA wrapper, as
    ``adwin.loop.parts.load_student`` builds it); returns the metrics, the student, the logprobs."""
    with _BUILD:
        model = make_tiny_llama(seed=student_seed)
        t = teachers()
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


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module, tol: float = 1e-5) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")
