"""``adwin train --scheduler asyncopd``: the AsyncOPD pipeline in the synchronous trainer's run shell
(``adwin.loop.shell``), to which it reports every update.

Same run folder as the synchronous trainer (``runs/<name>/``: ``config.json``, ``metrics.jsonl`` with one
namespaced row per learner update, ``summary.json``, a checkpoint every ``checkpoint_every`` updates and at the
end, which ``adwin train --resume`` continues, and the same export), the same evaluation cadence
(``eval/*`` on step 0, every ``eval.every`` updates and on the last one, run on the dispatcher thread
between two updates while rollout workers keep generating with their snapshots), and the same token
ledger (``rollout/sync_tokens``, ``rollout/full_equiv_tokens``, ``probe/tokens_total``). On top of those,
each row carries the scheduler's metrics: ``async/*`` (staleness, permits, version, breakpoints,
``async/throughput_tokens_per_s`` after ``asyncopd.throughput_warmup`` updates) and ``pipeline/*``
(overlap and per-stage busy seconds, cumulative). ``time/{rollout,teacher,train}`` are each stage's busy
seconds since the previous row: they overlap, so their sum may exceed the wall time (that is the point).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.loop.parts import Parts
from adwin.loop.shell import TrainResult
from adwin.trainer_adapters.asyncopd.run import build_asyncopd, run_asyncopd

SUMMARY_KEYS = ("updates", "throughput_tokens_per_s", "overlap", "staleness", "permits", "checks", "submitted",
                "probes_completed", "breakpoint_samples", "probes", "options", "batch_size", "loss", "mc_samples",
                "learner_shapes", "sync_every", "discarded", "oapl")


@dataclass
class AsyncTrainResult(TrainResult):
    """``TrainResult`` plus the scheduler's own summary (throughput, overlap, permits, staleness)."""

    asyncopd: dict[str, Any] = field(default_factory=dict)


def train_asyncopd(cfg: TrainConfig, controller: ControllerAPI, parts: Parts,
                   on_step: Callable[[int, dict[str, Any]], None] | None = None,
                   initial_eval: dict[str, float] | None = None, resume: Path | None = None) -> AsyncTrainResult:
    """Evaluate, run ``cfg.steps`` AsyncOPD learner updates, evaluate again; see the module docstring.
    ``initial_eval``: the start-of-run evaluation already computed on the same student, problems and seed
    (as in ``adwin.loop.trainer.train``). ``resume``: a checkpoint of this run to continue from, as in
    ``train`` (the embedded controller must be ``adwin.runtime.resume.open_resumed_controller(resume)``)."""
    built = build_asyncopd(cfg, controller, parts=parts, resume=resume)
    out = run_asyncopd(cfg, controller, built=built, on_step=on_step, evaluate=True, initial_eval=initial_eval)
    shell = built.shell
    return AsyncTrainResult(shell.run_id, shell.run_dir, shell.initial, shell.final, out["logged"], shell.totals(),
                            Path(out["student_dir"]), asyncopd={k: out[k] for k in SUMMARY_KEYS if k in out})
