"""The one student sampler of a run (``Sampler``): rollouts, evaluation and inline probe extension
(``adwin.loop.probe_rounds.RoundExtender`` over ``Sampler.generate``) all go through it, on the engine
``rollout.backend`` names. Each rollout or evaluation is one call into ``adwin.sampling.batch`` (prompts encoded,
generated, laid out); with ``probes.backend: rollout`` a parked probe round rides the next training rollout call
(``Rider``, ``adwin.probes.riding``)."""

from __future__ import annotations

from adwin.config import TrainConfig
from adwin.decode.engine import HFEngine, RolloutEngine
from adwin.decode.loop import Generation
from adwin.loop.parts import Parts
from adwin.loop.sharding import rollout_seeds, seeds_for
from adwin.sampling.batch import Backend, Batch, Draw, Rider, evaluation_rows, open_student, roll_out
from adwin.sampling.data import Prompt


class Sampler:
    """Student sampling for rollouts, evaluation and probe extension: all of it through one ``RolloutEngine``
    (``adwin.decode.engine``; ``rollout.backend`` picks it), kept on the trainer's weights by ``sync_weights``."""

    def __init__(self, parts: Parts, cfg: TrainConfig, engine: RolloutEngine | None = None, *,
                 backend: Backend | None = None) -> None:
        """``engine``: a ready engine (tests); else the one ``backend`` (default ``rollout.backend``) names."""
        self.parts, self.cfg = parts, cfg
        self.student, opened = open_student(
            parts.student, parts.tokenizer, cfg.data.max_prompt_len,
            None if engine is not None else backend or cfg.rollout.backend,
            compile=cfg.rollout.compile, dtype=cfg.model.dtype, seed=cfg.seed, gpu_memory=cfg.model.vllm_gpu_memory,
            max_model_len=cfg.data.max_prompt_len + cfg.rollout.max_response_len)
        self.eos, self.pad = self.student.eos, self.student.pad
        self.engine: RolloutEngine = engine or opened  # type: ignore[assignment]
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
        return self._ready().generate(contexts, budgets, temperature=temperature, top_p=top_p,
                                      with_logprobs=with_logprobs, row_seeds=row_seeds)

    def roll_out(self, prompts: list[Prompt], n: int, window: int, *, evaluation: bool = False,
                 seeds: list[int] | None = None) -> Batch:
        """``n`` samples per prompt, at most ``window`` tokens each, then right-padded rows for scoring.

        ``evaluation`` samples with ``eval.temperature``/``eval.top_p`` and records no behavior logprobs.
        ``seeds``: one per row (``rollout.seeding: per_sample``, ``adwin.loop.sharding``), else HF's batch RNG.
        A training call also carries the probe rows a ``rider`` boards (their own budgets and seeds).
        """
        s = self.cfg.eval if evaluation else self.cfg.rollout
        draw = Draw(s.temperature, s.top_p, self.cfg.loss.weights_by_behavior and not evaluation, seeds)
        return roll_out(self._ready(), self.student, prompts, n, window, draw, None if evaluation else self.rider)

    def step_rollouts(self, prompts: list[Prompt], rows: slice, window: int, step: int) -> Batch:
        """Step ``step``'s training rollouts of this rank's ``rows`` of the step's prompts (``prompts``: those rows),
        ``rollout.samples_per_prompt`` each, seeded per global row under ``rollout.seeding: per_sample``."""
        engine, r = self._ready(), self.cfg.rollout
        seeds = rollout_seeds(self.cfg, step, rows, r.samples_per_prompt)
        draw = Draw(r.temperature, r.top_p, self.cfg.loss.weights_by_behavior, seeds)
        return roll_out(engine, self.student, prompts, r.samples_per_prompt, window, draw, self.rider)

    def evaluation_rows(self, problems: list[Prompt],
                        first: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """Held-out rows ``first, first + 1, ...`` of the problem-major order as ``adwin.sampling.batch.evaluation_rows``
        samples them (``eval`` settings; seeded per row under ``rollout.seeding: per_sample``)."""
        engine, e = self._ready(), self.cfg.eval
        seeds = seeds_for(self.cfg, "eval", 0, range(first, first + len(problems)))
        return evaluation_rows(engine, self.student, problems, self.cfg.rollout.max_response_len,
                               Draw(e.temperature, e.top_p, seeds=seeds), chunk=e.batch_size, compact=e.compact)

    def _ready(self) -> RolloutEngine:
        """The engine, synced with the trainer's weights before its first use."""
        if not self._synced:
            self.sync_weights(self.version)
        return self.engine
