"""A step's rollouts (``Batch``) and the one student sampler that makes them (``Sampler``): rollouts,
evaluation and probe extension all go through it."""

from __future__ import annotations

from dataclasses import dataclass

from adwin.config import TrainConfig
from adwin.loop.parts import Parts
from adwin.probes.extender import ModelExtender
from adwin.sampling.data import Prompt
from adwin.sampling.rollout import Rows, encode_prompts, eos_ids, generate, layout, pad_id_of


@dataclass
class Batch:
    """One step's rollouts: ragged per-sample lists plus their right-padded rows."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]
    rows: Rows
    # log p(token) under the sampling weights, one per response token; recorded only when the loss weights
    # tokens by the old-to-current ratio (loss.is_method, the PPO clip): generation and training forward
    # differ numerically (kernels, padding, dtype), which those treatments correct
    behavior_logprobs: list[list[float]] | None = None



class Sampler:
    """Student sampling for rollouts, evaluation and probe extension: all of it through ``generate``."""

    def __init__(self, parts: Parts, cfg: TrainConfig) -> None:
        self.parts, self.cfg = parts, cfg
        self.eos = eos_ids(parts.student, parts.tokenizer)
        self.pad = pad_id_of(parts.tokenizer, self.eos)
        r = cfg.rollout
        # probe extension with the trainer's own student (the inline probe backend): the extender the probe
        # workers run on their replicas, sampling like the rollouts and recording behavior logprobs
        self.extend = ModelExtender(parts.student, self.eos, self.pad, r.temperature, r.top_p)

    def roll_out(self, prompts: list[Prompt], n: int, window: int, *, evaluation: bool = False,
                 seeds: list[int] | None = None) -> Batch:
        """``n`` samples per prompt, at most ``window`` tokens each, then right-padded rows for scoring.

        ``evaluation`` samples with ``eval.temperature``/``eval.top_p`` and records no behavior logprobs.
        ``seeds``: one per row (``rollout.seeding: per_sample``, ``adwin.loop.sharding``), else HF's batch RNG.
        """
        rep = [p for p in prompts for _ in range(n)]
        ctx = encode_prompts(self.parts.tokenizer, [p.prompt for p in rep], self.cfg.data.max_prompt_len)
        s = self.cfg.eval if evaluation else self.cfg.rollout
        record = self.cfg.loss.weights_by_behavior and not evaluation
        g = generate(self.parts.student, ctx, [window] * len(ctx), eos=self.eos, pad_id=self.pad,
                     temperature=s.temperature, top_p=s.top_p, with_logprobs=record, row_seeds=seeds)
        return Batch(rep, ctx, g.response_ids, g.finished, layout(ctx, g.response_ids, self.pad), g.logprobs)
