"""The ``Extender`` over a transformers causal LM (``adwin.decode.generate.generate``): what probe workers run
on their own student replica, and what the trainer's inline backend runs on its student (``Sampler.extend``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from adwin.decode.generate import generate
from adwin.decode.static_cache import CompileSetting
from adwin.probes.pool import Extension
from adwin.student.lora import load_trained_state, trained_state


@dataclass
class ModelExtender:
    """Samples continuations with ``model`` (temperature/top-p as the rollouts) and records behavior logprobs."""

    model: torch.nn.Module
    eos: set[int]
    pad_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    compile: CompileSetting = False  # rollout.compile, resolved on the replica's own device

    def __call__(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        g = generate(self.model, contexts, budgets, eos=self.eos, pad_id=self.pad_id, temperature=self.temperature,
                     top_p=self.top_p, with_logprobs=True, compile=self.compile)
        return Extension(g.response_ids, g.logprobs or [[] for _ in contexts], g.finished, g.decode_steps)

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Move the replica to a published version (a step-boundary snapshot of the trainer's weights)."""
        load_trained_state(self.model, weights)


def snapshot_weights(model: torch.nn.Module, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A copy of what training changes in ``model`` (``trained_state``: the whole state, or a LoRA student's
    adapters only; its replicas already hold the frozen base) at a step boundary on ``device``: the trainer
    keeps updating its own tensors. A thread worker on the same GPU takes it on the GPU (a device-to-device
    copy instead of a round trip through host memory every step); a Ray actor takes it on the CPU."""
    return {k: v.detach().to(device, copy=True) for k, v in trained_state(model).items()}
