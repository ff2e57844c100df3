"""The ``Extender`` over a transformers causal LM (``adwin.sampling.rollout.generate``): what probe workers run
on their own student replica, and what the trainer's inline backend runs on its student (``Sampler.extend``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from adwin.probes.pool import Extension
from adwin.sampling.rollout import generate
from adwin.sampling.static_decode import CompileSetting


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
        return Extension(g.response_ids, g.logprobs or [[] for _ in contexts], g.finished)

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Move the replica to a published version (a step-boundary snapshot of the trainer's weights)."""
        self.model.load_state_dict(weights)


def snapshot_weights(model: torch.nn.Module, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A copy of ``model``'s state at a step boundary on ``device``: the trainer keeps updating its own
    tensors. A thread worker on the same GPU takes it on the GPU (a device-to-device copy instead of a round
    trip through host memory every step); a Ray actor takes it on the CPU."""
    return {k: v.detach().to(device, copy=True) for k, v in model.state_dict().items()}
