"""Memory options of the training forward: micro-batch slices, activation checkpointing and autocast.

``optim.micro_batch_size`` splits a step's rows into micro-batches (``micro_slices``);
``model.gradient_checkpointing``, ``model.autocast`` and ``model.lora.dropout`` wrap the student's training forward
(``training_forward``). Why checkpointing flips only the decoder layers' own ``training`` flag: see
``training_forward`` and docs/decisions.md, "Micro-batches and memory options".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from adwin.config import TrainConfig
from adwin.objectives.precision import autocast
from adwin.student.lora import lora_dropout_modules


def micro_slices(n: int, size: int | None) -> list[slice]:
    """Row slices of at most ``size`` rows covering ``range(n)`` in order; one slice when ``size`` is None."""
    if size is None or size >= n:
        return [slice(0, n)]
    if size < 1:
        raise ValueError(f"optim.micro_batch_size must be >= 1, got {size}")
    return [slice(s, min(n, s + size)) for s in range(0, n, size)]


def _checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers that checkpoint: HF reads each one's own ``gradient_checkpointing`` and ``training``."""
    from transformers.modeling_layers import GradientCheckpointingLayer  # heavy; only this option needs it

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def enable_checkpointing(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Turn on HF activation checkpointing (non-reentrant) once; returns the modules that checkpoint.

    transformers 5.24 renamed ``gradient_checkpointing_enable`` (deprecated there, with a warning per call) to
    ``activation_checkpointing_enable``; earlier releases have only the first.
    """
    layers = _checkpointed_layers(model)
    if layers:
        return layers
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(model, "gradient_checkpointing_enable",
                                                                              None)
    if enable is not None and getattr(model, "supports_gradient_checkpointing", False):
        enable({"use_reentrant": False})
        layers = _checkpointed_layers(model)
    if not layers:
        raise ValueError(f"model.gradient_checkpointing: {type(model).__name__} has no HF checkpointing layers; "
                         "set model.gradient_checkpointing: false")
    return layers


@contextlib.contextmanager
def training_forward(model: torch.nn.Module, cfg: TrainConfig) -> Iterator[None]:
    """The student's training forward under ``model.gradient_checkpointing`` and ``model.autocast``.

    HF checkpoints a decoder layer only while that layer is in training mode. The trainer computes in eval
    mode (no dropout: the update's logprobs must be those of the sampling policy), so only the checkpointed
    layers' own ``training`` flag is set, not their children's: dropout and attention dropout stay off, and
    the forward computes exactly what it computes without the option. ``model.lora.dropout`` switches on the
    adapters' own dropout layers the same way (the one dropout that is asked for). The flags are restored on
    exit, so generation and the audit (which needs the KV cache HF disables under checkpointing) never see them.
    """
    device = next(model.parameters()).device
    with contextlib.ExitStack() as stack:
        if cfg.model.gradient_checkpointing:
            _training_flag(enable_checkpointing(model), stack)
        if cfg.model.lora is not None and cfg.model.lora.dropout > 0:
            _training_flag(lora_dropout_modules(model), stack)
        stack.enter_context(autocast(cfg.model.autocast, device))
        yield


def _training_flag(modules: list[torch.nn.Module], stack: contextlib.ExitStack) -> None:
    """Set ``training`` on ``modules`` themselves (not ``.train()``: their children keep theirs) until ``stack``
    closes."""
    was = [m.training for m in modules]
    for m in modules:
        m.training = True
    stack.callback(lambda: [setattr(m, "training", w) for m, w in zip(modules, was, strict=True)])
