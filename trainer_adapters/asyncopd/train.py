"""``adwin train --scheduler asyncopd``: the AsyncOPD pipeline with the sync trainer's run conventions.

Same run folder as the synchronous trainer (``runs/<name>/``: ``config.json``, ``metrics.jsonl`` with one
namespaced row per learner update, ``summary.json``, a checkpoint every ``checkpoint_every`` updates and at the
end, which ``adwin train --resume`` continues: ``run.AsyncOPDRun``), the same evaluation cadence
(``eval/*`` on step 0, every ``eval.every`` updates and on the last one, run on the dispatcher thread
between two updates while rollout workers keep generating with their snapshots), and the same token
ledger (``rollout/sync_tokens``, ``rollout/full_equiv_tokens``, ``probe/tokens_total``). On top of those,
each row carries the scheduler's metrics: ``async/*`` (staleness, permits, version, breakpoints,
``async/throughput_tokens_per_s`` after ``asyncopd.throughput_warmup`` updates) and ``pipeline/*``
(overlap and per-stage busy seconds, cumulative). ``time/{rollout,teacher,train}`` are each stage's busy
seconds since the previous row: they overlap, so their sum may exceed the wall time (that is the point).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.loop.evaluate import evaluate
from adwin.loop.parts import Parts
from adwin.loop.sampler import Sampler
from adwin.loop.trainer import TrainResult
from adwin.student.lora import LORA_EXPORT, export_lora
from adwin.student.structure import is_lora
from adwin.trainer_adapters.asyncopd.run import AsyncOPDRun, build_asyncopd, run_asyncopd

SUMMARY_KEYS = ("throughput_tokens_per_s", "overlap", "staleness", "permits", "checks", "submitted",
                "probes_completed", "breakpoint_samples", "probes", "options", "batch_size", "loss", "mc_samples",
                "learner_shapes", "sync_every", "discarded", "oapl")


@dataclass
class AsyncTrainResult(TrainResult):
    """``TrainResult`` plus the scheduler's own summary (throughput, overlap, permits, staleness)."""

    asyncopd: dict[str, Any] = field(default_factory=dict)


class _StepExtras:
    """Evaluation and token ledger rows for each learner update (called on the dispatcher thread)."""

    def __init__(self, cfg: TrainConfig, parts: Parts, built: AsyncOPDRun, controller: ControllerAPI) -> None:
        self.cfg, self.parts, self.built, self.controller = cfg, parts, built, controller
        self.gen = Sampler(parts, cfg, backend="hf")  # on the learner's weights: vLLM engines are the pipeline's
        self.ledger = built.ledger  # checkpointed with the run
        self.pool = built.hooks.client.pool  # its tokens_generated: probe tokens, checkpointed with the pool
        self.initial: dict[str, float] = {}
        self.final: dict[str, float] = {}
        self._busy: dict[str, float] = {}

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.parts, self.cfg, self.gen)

    def probe_tokens(self) -> int:
        return self.pool.tokens_generated

    def __call__(self, step: int, m: dict[str, float]) -> dict[str, float]:
        sched, cfg = self.built.scheduler, self.cfg
        delta = sched.last_update  # this update's items (OAPL's may be fewer than B: probes) and new probes
        assert delta is not None and delta.step == step
        for it in delta.probes:
            self.ledger.add_completed(it.response_len)
            self.pool.tokens_generated += it.response_len
        batch = delta.items
        view = SimpleNamespace(response_ids=[it.tokens for it in batch],
                               finished=[it.finish_reason != "window" for it in batch])
        out = self.ledger.record(view, int(m.get("window/current", cfg.rollout.max_response_len)),  # type: ignore[arg-type]
                                 self.probe_tokens(), windows=[it.window for it in batch])
        out["rollout/prompt_tokens"] = float(sum(len(it.prompt_ids) for it in batch))  # FLOPs estimates read it
        for stage in ("rollout", "teacher", "train"):  # this update's share of each stage's busy time
            total = m.get(f"pipeline/busy_{stage}_s", 0.0)
            out[f"time/{stage}"] = total - self._busy.get(stage, 0.0)
            self._busy[stage] = total
        t0 = time.perf_counter()
        if step == 0:
            out |= self.initial
        last = step == cfg.steps - 1
        if (cfg.eval.every and (step + 1) % cfg.eval.every == 0) or last:
            self.final = self.evaluate()
            out |= self.final
        if last and is_lora(self.parts.student):  # as the sync trainer: the adapter and the merged student
            export_lora(self.parts.student, self.parts.tokenizer, self.built.run_dir / LORA_EXPORT)
        out["time/eval"] = time.perf_counter() - t0
        return out


def train_asyncopd(cfg: TrainConfig, controller: ControllerAPI, parts: Parts,
                   on_step: Callable[[int, dict[str, Any]], None] | None = None,
                   initial_eval: dict[str, float] | None = None, resume: Path | None = None) -> AsyncTrainResult:
    """Evaluate, run ``cfg.steps`` AsyncOPD learner updates, evaluate again; see the module docstring.
    ``initial_eval``: the start-of-run evaluation already computed on the same student, problems and seed
    (as in ``adwin.loop.trainer.train``). ``resume``: a checkpoint of this run to continue from, as in
    ``train`` (the embedded controller must be ``adwin.runtime.resume.open_resumed_controller(resume)``)."""
    built = build_asyncopd(cfg, controller, parts=parts, resume=resume)
    extras = _StepExtras(cfg, parts, built, controller)
    t0 = time.perf_counter()
    if resume is not None:
        extras.initial = dict(built.initial_eval)
    else:
        extras.initial = dict(initial_eval) if initial_eval is not None else extras.evaluate()
        extras.initial["time/eval_initial"] = time.perf_counter() - t0
    built.initial_eval = {k: v for k, v in extras.initial.items() if k.startswith("eval/")}  # into checkpoints
    out = run_asyncopd(cfg, controller, built=built, on_step=on_step, enrich=extras)
    totals = extras.ledger.totals(extras.probe_tokens())
    initial = {k: v for k, v in extras.initial.items() if k.startswith("eval/")}
    return AsyncTrainResult(built.run_id, built.run_dir, initial, extras.final or initial, out["logged"], totals,
                            asyncopd={k: out[k] for k in SUMMARY_KEYS if k in out})
