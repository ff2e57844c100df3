"""AsyncOPD ``StreamingEngine`` on vLLM (``rollout.backend: vllm`` with ``--scheduler asyncopd``).

UNTESTED ON HARDWARE (no GPU while writing it); the step logic is unit-tested on CPU with a stand-in
engine. Each ``step`` asks vLLM for one token per active request with ``n = 1 + m`` samples of the same
prompt: the first sample is the realized token, the other ``m`` are the cached MC actions, all iid from
the same behavior distribution (``logprobs_mode="processed_logprobs"``: logprobs of the distribution
actually sampled). ``load_weights`` loads the learner's tensors into the engine and resets its prefix
cache, so a kept prefix is re-encoded under the new weights before generation resumes (keep-mode).

Correct, not fast: one engine call per decoding step (prefix caching keeps the re-encoding cheap). A
streaming ``AsyncLLM`` engine with per-request ``max_tokens`` would be the production path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from adwin.decode.vllm import VLLMRollout
from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut


class VLLMRolloutEngine:
    """See the module docstring."""

    def __init__(self, rollout: VLLMRollout, *, eos: set[int], temperature: float = 1.0, top_p: float = 1.0,
                 mc_samples: int = 0) -> None:
        if mc_samples < 0:
            raise ValueError(f"mc_samples must be >= 0, got {mc_samples}")
        self.rollout, self.eos, self.temperature, self.top_p, self.m = rollout, eos, temperature, top_p, mc_samples
        self.version = 0

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.rollout.sync_weights(weights.items())
        self.version = version

    def step(self, items: Sequence[StreamItem]) -> list[TokenOut | None]:
        per_item = self.rollout.generate([it.prompt_ids + it.tokens for it in items], 1,
                                         temperature=self.temperature, top_p=self.top_p, n=1 + self.m)
        outs: list[TokenOut | None] = []
        for comps in per_item:
            first, acts = comps[0], comps[1:]
            if not first.token_ids:  # the engine stopped before sampling (e.g. context full)
                outs.append(None)
                continue
            tok = first.token_ids[0]
            kw: dict[str, Any] = {}
            if self.m:
                kw = {"mc_actions": [c.token_ids[0] for c in acts], "mc_logprobs": [c.logprobs[0] for c in acts]}
            outs.append(TokenOut(tok, first.logprobs[0], eos=tok in self.eos, **kw))
        return outs


def vllm_engines(model_path: str, n: int, *, eos: set[int], temperature: float, top_p: float, mc_samples: int,
                 seed: int, dtype: str, gpu_memory_utilization: float = 0.3) -> list[VLLMRolloutEngine]:
    """``n`` engines, each its own vLLM instance on the visible GPU (one per worker)."""
    return [VLLMRolloutEngine(VLLMRollout.load(model_path, dtype=dtype, seed=seed + 1000 * i,
                                               gpu_memory_utilization=gpu_memory_utilization / n),
                              eos=eos, temperature=temperature, top_p=top_p, mc_samples=mc_samples)
            for i in range(n)]
