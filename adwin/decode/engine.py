"""The student's batch decode engine behind the synchronous trainer's ``Sampler`` (``rollout.backend``).

One narrow interface, ``RolloutEngine``: continue token contexts by at most a per-request budget
(``max_tokens``: the window for rollouts, the remaining budget for probe extension, the horizon for
evaluation) with a temperature / top-p, returning behavior logprobs when asked; and ``sync_weights`` so
the engine samples from the student version the trainer just produced. Two implementations:

- ``HFEngine`` (``rollout.backend: hf``): ``adwin.decode.generate.generate`` on the trainer's own
  student module, numerically what the trainer did before the engine existed; ``sync_weights`` has
  nothing to copy (the engine *is* the trainer's module). A sharded student (``model.sharding: fsdp``)
  is gathered whole for each call (``adwin.student.fsdp.full_weights``; docs/decisions.md, "Sharded students").
- ``VLLMEngine`` (``rollout.backend: vllm``): ``adwin.decode.vllm.VLLMRollout`` (vLLM's
  offline ``LLM``), one request per context with its own ``max_tokens`` and seed; ``sync_weights``
  loads the student's tensors into the engine and drops its prefix cache. UNTESTED ON A GPU: the
  trainer runs end to end on CPU with a stand-in ``vllm.LLM`` (tests/adwin/decode/test_vllm_sync_trainer.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from adwin.decode.generate import generate
from adwin.decode.loop import Generation
from adwin.decode.static_cache import CompileSetting
from adwin.decode.vllm import VLLMRollout
from adwin.student.fsdp import full_weights

log = logging.getLogger(__name__)

SEED_RANGE = 2**31 - 1  # vLLM takes per-request seeds as non-negative ints


class RolloutEngine(Protocol):
    """What the ``Sampler`` needs from a student sampler (see the module docstring)."""

    def generate(self, contexts: Sequence[Sequence[int]], budgets: Sequence[int], *, temperature: float,
                 top_p: float, with_logprobs: bool, row_seeds: Sequence[int] | None = None) -> Generation:
        """Continue ``contexts[b]`` by at most ``budgets[b]`` tokens; rows cut at their first EOS (kept).
        ``row_seeds``: one seed per context, so a row's tokens do not depend on the rest of the batch."""
        ...

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        """Sample from ``model``'s current weights (student ``version``: optimizer steps applied) from now on."""
        ...


@dataclass
class HFEngine:
    """transformers ``generate`` on the trainer's student module (``rollout.backend: hf``)."""

    model: torch.nn.Module
    eos: set[int]
    pad_id: int
    version: int = 0
    compile: CompileSetting = False  # rollout.compile

    def generate(self, contexts: Sequence[Sequence[int]], budgets: Sequence[int], *, temperature: float,
                 top_p: float, with_logprobs: bool, row_seeds: Sequence[int] | None = None) -> Generation:
        with full_weights(self.model):  # a sharded student decodes on its gathered weights (adwin.student.fsdp)
            return generate(self.model, contexts, budgets, eos=self.eos, pad_id=self.pad_id,
                            temperature=temperature, top_p=top_p, with_logprobs=with_logprobs, row_seeds=row_seeds,
                            compile=self.compile)

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        if model is not self.model:  # a second module would need a copy: nothing in the trainer builds that
            raise ValueError("HFEngine samples with the trainer's own student module; got another module")
        self.version = version


class VLLMEngine:
    """A vLLM engine as the student's sampler (``rollout.backend: vllm``). ``rollout``: a ``VLLMRollout``."""

    def __init__(self, rollout: VLLMRollout, eos: set[int]) -> None:
        self.rollout, self.eos = rollout, set(eos)
        self.version: int | None = None  # None: the engine still holds the checkpoint it was loaded from
        self.syncs: list[int] = []  # versions pushed, in order (telemetry and tests)

    @classmethod
    def load(cls, student_path: str, eos: set[int], *, dtype: str, seed: int, gpu_memory_utilization: float,
             max_model_len: int) -> VLLMEngine:
        """An engine on ``student_path`` sized for a run (the trainer passes ``model.dtype``, ``seed``,
        ``model.vllm_gpu_memory`` and ``data.max_prompt_len + rollout.max_response_len``)."""
        # raw logprobs (temperature 1), as transformers' generate records them: behavior logprobs mean the same
        # thing whichever engine sampled (the AsyncOPD engine keeps vLLM's processed ones; decisions.md)
        ro = VLLMRollout.load(student_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                              max_model_len=max_model_len, logprobs_mode="raw_logprobs")
        return cls(ro, eos)

    def generate(self, contexts: Sequence[Sequence[int]], budgets: Sequence[int], *, temperature: float,
                 top_p: float, with_logprobs: bool, row_seeds: Sequence[int] | None = None) -> Generation:
        """One request per context with ``max_tokens = budgets[b]``; a budget of 0 makes no request.

        Per-request seeds are ``row_seeds`` when given, else drawn from torch's global RNG, so the engine's
        noise follows the run seed and ``evaluate``'s forked, re-seeded RNG pairs every evaluation's samples
        as it does with transformers.
        """
        n = len(contexts)
        if row_seeds is not None:
            seeds = [int(x) % SEED_RANGE for x in row_seeds]
        else:
            seeds = torch.randint(0, SEED_RANGE, (n,)).tolist() if n else []
        ask = [b for b in range(n) if budgets[b] > 0]
        comps = self.rollout.generate_each([contexts[b] for b in ask], [int(budgets[b]) for b in ask],
                                           temperature=temperature, top_p=top_p, seeds=[seeds[b] for b in ask],
                                           stop_token_ids=sorted(self.eos)) if ask else []
        responses: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finished = [False] * n
        for b, c in zip(ask, comps, strict=True):
            ids = c.token_ids[: budgets[b]]
            stop = next((i for i, tok in enumerate(ids) if tok in self.eos), None)  # the same cut as transformers
            cut = len(ids) if stop is None else stop + 1
            responses[b], logprobs[b], finished[b] = ids[:cut], c.logprobs[:cut], stop is not None
        # vLLM decodes a request until it stops: the batch's positions are its longest request's tokens
        steps = max((len(c.token_ids) for c in comps), default=0)
        return Generation(responses, finished, logprobs if with_logprobs else None, decode_steps=steps)

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        self.rollout.sync_weights(model.state_dict().items())
        self.version = version
        self.syncs.append(version)
