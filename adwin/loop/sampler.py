"""A step's rollouts (``Batch``) and the one student sampler that makes them (``Sampler``): rollouts,
evaluation and inline probe extension (``adwin.loop.probe_rounds.RoundExtender`` over ``Sampler.generate``)
all go through it, on the engine ``rollout.backend`` names. With ``probes.backend: rollout`` a parked probe
round rides the next training rollout call (``Rider``, ``adwin.probes.riding``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol

from adwin.config import TrainConfig
from adwin.decode.engine import HFEngine, RolloutEngine, VLLMEngine
from adwin.decode.loop import Generation
from adwin.loop.parts import Parts
from adwin.sampling.data import Prompt
from adwin.sampling.rollout import Rows, encode_prompts, eos_ids, layout, pad_id_of

Backend = Literal["hf", "vllm"]


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
    decode_steps: int = 0  # token positions the rollout call decoded (riding probe rows included)


class Rider(Protocol):
    """Probe rows that ride a training rollout call (``adwin.probes.riding.RidingWorker``)."""

    def board(self, window: int) -> tuple[list[list[int]], list[int], list[int] | None] | None:
        """Contexts, token budgets (at most the call's ``window``) and row seeds (None: batch RNG) to add to this
        call; None: nothing to add."""
        ...

    def land(self, g: Generation, rows: int, seconds: float, added_steps: int) -> None:
        """The boarded rows' part of the call's result (``rows``: the call's rows in all; ``seconds``: its wall;
        ``added_steps``: decode steps the call took beyond what its rollout rows needed)."""
        ...


class Sampler:
    """Student sampling for rollouts, evaluation and probe extension: all of it through one ``RolloutEngine``
    (``adwin.decode.engine``; ``rollout.backend`` picks it), kept on the trainer's weights by ``sync_weights``."""

    def __init__(self, parts: Parts, cfg: TrainConfig, engine: RolloutEngine | None = None, *,
                 backend: Backend | None = None) -> None:
        """``engine``: a ready engine (tests); else the one ``backend`` (default ``rollout.backend``) names."""
        self.parts, self.cfg = parts, cfg
        self.eos = eos_ids(parts.student, parts.tokenizer)
        self.pad = pad_id_of(parts.tokenizer, self.eos)
        self.engine = engine or open_engine(backend or cfg.rollout.backend, cfg, parts, self.eos, self.pad)
        self.version = 0  # the student version the engine holds once synced
        # an engine with its own copy of the weights is synced before its first use: the student may have
        # changed since the engine loaded its checkpoint (--resume loads the checkpoint's weights after this)
        self._synced = isinstance(self.engine, HFEngine)
        self.rider: Rider | None = None  # probes.backend: rollout (``adwin.loop.probing.open_probe_side``)

    def sync_weights(self, version: int) -> None:
        """After each optimizer step: the engine samples probes, evaluations and the next rollouts from
        ``version`` (the trainer calls this once per step, skipped steps included: the version counts steps)."""
        self.version = version
        self.engine.sync_weights(self.parts.student, version)
        self._synced = True

    def generate(self, contexts: list[list[int]], budgets: list[int], *, temperature: float, top_p: float,
                 with_logprobs: bool, row_seeds: list[int] | None = None) -> Generation:
        """The engine's ``generate``; ``row_seeds`` (``rollout.seeding: per_sample``): one seed per context."""
        if not self._synced:
            self.sync_weights(self.version)
        return self.engine.generate(contexts, budgets, temperature=temperature, top_p=top_p,
                                    with_logprobs=with_logprobs, row_seeds=row_seeds)

    def roll_out(self, prompts: list[Prompt], n: int, window: int, *, evaluation: bool = False,
                 seeds: list[int] | None = None) -> Batch:
        """``n`` samples per prompt, at most ``window`` tokens each, then right-padded rows for scoring.

        ``evaluation`` samples with ``eval.temperature``/``eval.top_p`` and records no behavior logprobs.
        ``seeds``: one per row (``rollout.seeding: per_sample``, ``adwin.loop.sharding``), else HF's batch RNG.
        A training call also carries the probe rows a ``rider`` boards (their own budgets and seeds).
        """
        rep = [p for p in prompts for _ in range(n)]
        ctx = encode_prompts(self.parts.tokenizer, [p.prompt for p in rep], self.cfg.data.max_prompt_len)
        s = self.cfg.eval if evaluation else self.cfg.rollout
        record = self.cfg.loss.weights_by_behavior and not evaluation
        ride = self.rider.board(window) if self.rider is not None and not evaluation else None
        if ride is None:
            g = self.generate(ctx, [window] * len(ctx), temperature=s.temperature, top_p=s.top_p,
                              with_logprobs=record, row_seeds=seeds)
        else:
            g = self._ride(ctx, window, ride, s.temperature, s.top_p, record, seeds)
        return Batch(rep, ctx, g.response_ids, g.finished, layout(ctx, g.response_ids, self.pad), g.logprobs,
                     g.decode_steps)

    def _ride(self, ctx: list[list[int]], window: int, ride: tuple[list[list[int]], list[int], list[int] | None],
              temperature: float, top_p: float, record: bool, seeds: list[int] | None) -> Generation:
        """One engine call over the rollout rows then the boarded probe rows (their budgets within ``window``); the
        probe part lands on the rider, with the decode steps the call took beyond what the rollout rows needed."""
        assert self.rider is not None
        contexts, budgets, probe_seeds = ride
        if (seeds is None) != (probe_seeds is None):
            raise ValueError("rollout rows and riding probe rows must both be seeded per sample or both not")
        k = len(ctx)
        t0 = time.perf_counter()
        g = self.generate(ctx + contexts, [window] * k + budgets, temperature=temperature, top_p=top_p,
                          with_logprobs=True, row_seeds=None if seeds is None else seeds + probe_seeds)  # type: ignore[operator]
        seconds = time.perf_counter() - t0
        lp = g.logprobs or [[] for _ in g.response_ids]
        mine = Generation(g.response_ids[:k], g.finished[:k], lp[:k] if record else None, g.decode_steps)
        self.rider.land(Generation(g.response_ids[k:], g.finished[k:], lp[k:], g.decode_steps), k + len(contexts),
                        seconds, max(0, g.decode_steps - steps_needed(mine, window)))
        return mine


def steps_needed(g: Generation, window: int) -> int:
    """Decode steps rows that all had the budget ``window`` needed: batched decoding stops once every row emitted
    EOS, so ``window`` unless each of them ended before it, then its longest row."""
    return window if not all(g.finished) else max(map(len, g.response_ids), default=0)


def open_engine(backend: Backend, cfg: TrainConfig, parts: Parts, eos: set[int], pad_id: int) -> RolloutEngine:
    """``hf``: transformers on the trainer's student; ``vllm``: a vLLM engine on the student's checkpoint
    (folder or hub id; lazily imported: no vLLM or no CUDA fails here naming ``rollout.backend``)."""
    if backend == "hf":
        return HFEngine(parts.student, eos, pad_id, compile=cfg.rollout.compile)
    path = str(getattr(parts.student, "name_or_path", "") or "")
    if not path:  # the engine is built from a checkpoint (then synced with the trainer's weights before use)
        raise ValueError("rollout.backend: 'vllm' loads the student from its checkpoint (a folder or hub id); this "
                         "student was not loaded with from_pretrained (no name_or_path): set rollout.backend=hf")
    return VLLMEngine.load(path, eos, dtype=cfg.model.dtype, seed=cfg.seed,
                           gpu_memory_utilization=cfg.model.vllm_gpu_memory,
                           max_model_len=cfg.data.max_prompt_len + cfg.rollout.max_response_len)
