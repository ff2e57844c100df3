"""Student rollout on vLLM: ``max_tokens = W`` per request, behavior logprobs, weight sync after each step.

UNTESTED ON HARDWARE: written against vLLM's offline ``LLM`` API (``generate`` with token prompts,
``SamplingParams``, ``reset_prefix_cache``) without a GPU; the output parsing is unit-tested on CPU with
stand-in outputs. Pieces:

- ``VLLMRollout.generate(prompt_ids, window)``: one request per prompt with ``max_tokens = window`` (the
  window caps generated tokens; learner tensors keep their global width); ``generate_each`` gives every
  request its own ``max_tokens`` and seed (the synchronous trainer: windows, probe budgets). ``logprobs=0`` returns the
  sampled token's logprob; the engine is built with ``logprobs_mode="processed_logprobs"`` so those are
  the logprobs of the distribution actually sampled (after temperature / top-p), which the old-to-current
  importance ratio needs (vLLM's default, raw logprobs, ignores the temperature).
- ``VLLMRollout.sync_weights(named_tensors)``: after each optimizer step, load the learner's tensors
  into the engine's model (``model.load_weights`` of the model runner, the path TRL's colocate mode uses;
  falls back to ``LLM.apply_model`` when the worker runs in another process), then reset the prefix
  cache so no KV block computed by the old weights is reused: a kept prefix is re-encoded by the new
  weights (AsyncOPD keep-mode).

The AsyncOPD ``StreamingEngine`` on top of it is ``adwin.trainer_adapters.asyncopd.vllm``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adwin.backends import require_vllm


@dataclass
class Completion:
    """One sampled continuation."""

    token_ids: list[int]
    logprobs: list[float]  # behavior logprob of each sampled token
    finish_reason: str  # "stop" (EOS / stop token) or "length" (hit max_tokens)

    @property
    def finished(self) -> bool:
        return self.finish_reason == "stop"


def sampled_logprobs(token_ids: Sequence[int], logprobs: Sequence[dict[int, Any]] | None) -> list[float]:
    """The sampled tokens' logprobs from vLLM's per-position ``{token_id: Logprob}`` dicts."""
    if logprobs is None:
        raise ValueError("the request was made without logprobs: set SamplingParams(logprobs=0)")
    if len(logprobs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} logprob entries")
    return [float(lp[int(t)].logprob) for t, lp in zip(token_ids, logprobs, strict=True)]


def parse_outputs(outputs: Sequence[Any]) -> list[list[Completion]]:
    """``LLM.generate`` outputs -> per prompt, its ``n`` completions."""
    out: list[list[Completion]] = []
    for req in outputs:
        comps = []
        for c in req.outputs:
            ids = [int(t) for t in c.token_ids]
            comps.append(Completion(ids, sampled_logprobs(ids, c.logprobs), str(c.finish_reason or "length")))
        out.append(comps)
    return out


def engine_kwargs(model_path: str, *, dtype: str = "bfloat16", seed: int = 0, gpu_memory_utilization: float = 0.4,
                  max_model_len: int | None = None, max_logprobs: int = 20, **extra: Any) -> dict[str, Any]:
    """``vllm.LLM`` arguments for a rollout or teacher engine (prefix caching on, processed logprobs)."""
    kw: dict[str, Any] = {"model": model_path, "dtype": dtype, "seed": seed, "enable_prefix_caching": True,
                          "gpu_memory_utilization": gpu_memory_utilization, "max_logprobs": max_logprobs,
                          "logprobs_mode": "processed_logprobs"}
    if max_model_len is not None:
        kw["max_model_len"] = max_model_len
    return kw | extra


class VLLMRollout:
    """A vLLM engine used as the student's sampler. ``llm``: a ``vllm.LLM`` (or a stand-in in tests)."""

    def __init__(self, llm: Any, sampling_params: Callable[..., Any] | None = None) -> None:
        self.llm = llm
        self._params = sampling_params

    @classmethod
    def load(cls, model_path: str, **engine_kw: Any) -> VLLMRollout:
        vllm = require_vllm()
        return cls(vllm.LLM(**engine_kwargs(model_path, **engine_kw)), vllm.SamplingParams)

    def params(self, **kw: Any) -> Any:
        make = self._params or require_vllm().SamplingParams
        return make(**kw)

    def generate(self, prompt_ids: Sequence[Sequence[int]], window: int, *, temperature: float = 1.0,
                 top_p: float = 1.0, n: int = 1, seed: int | None = None) -> list[list[Completion]]:
        """``n`` samples per prompt of at most ``window`` new tokens each, with behavior logprobs."""
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        params = self.params(max_tokens=int(window), temperature=temperature, top_p=top_p, n=n, logprobs=0,
                             seed=seed)
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        return parse_outputs(self.llm.generate(prompts, params, use_tqdm=False))

    def generate_each(self, prompt_ids: Sequence[Sequence[int]], max_tokens: Sequence[int], *,
                      temperature: float = 1.0, top_p: float = 1.0, seeds: Sequence[int | None] | None = None,
                      stop_token_ids: Sequence[int] = ()) -> list[Completion]:
        """One sample per prompt, each request with its own ``max_tokens`` (>= 1) and seed, in one engine call.

        ``stop_token_ids``: every id that ends a sample (the trainer's EOS set), so the engine stops where
        the transformers sampler would, whatever the checkpoint's generation config says.
        """
        if len(max_tokens) != len(prompt_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(max_tokens)} max_tokens")
        if any(m < 1 for m in max_tokens):
            raise ValueError(f"every max_tokens must be >= 1, got {min(max_tokens)}")
        seeds = list(seeds) if seeds is not None else [None] * len(prompt_ids)
        params = [self.params(max_tokens=int(m), temperature=temperature, top_p=top_p, n=1, logprobs=0, seed=s,
                              stop_token_ids=list(stop_token_ids))
                  for m, s in zip(max_tokens, seeds, strict=True)]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        return [per[0] for per in parse_outputs(self.llm.generate(prompts, params, use_tqdm=False))]

    def _runner_model(self) -> Any | None:
        """The in-process model of the engine's driver worker, when there is one (TRL colocate path)."""
        try:
            return self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        except AttributeError:
            return None

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the learner's weights into the engine, then drop every cached KV block."""
        model = self._runner_model()
        if model is not None:
            for name, tensor in named_tensors:  # one tensor at a time: no second full copy on the GPU
                model.load_weights([(name, tensor)])
        else:
            weights = [(n, t.detach().cpu()) for n, t in named_tensors]
            self.llm.apply_model(lambda m: m.load_weights(weights))
        self.llm.reset_prefix_cache()
