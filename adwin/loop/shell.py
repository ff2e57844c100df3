"""The run around the updates, one for both schedulers: the synchronous trainer (``adwin.loop.trainer.train``)
and the AsyncOPD pipeline (``trainer_adapters/asyncopd``), which reports its updates here.

``open_shell`` sets a run up: its id (registered, or the checkpoint's), the sampler evaluations use, the student
sharded over the ranks, the optimizer over what trains, the RNG seeds, the token ledger and the fault counter.
``RunShell.start`` checks and restores a checkpoint (the schedule's own state through its ``Pipeline``) and opens
the loggers; ``initial_evaluation`` gives the start-of-run evaluation. Per update, in this order:
``count_faults`` (a run of ``optim.max_bad_steps`` skipped updates stops with a checkpoint of the last good state),
``eval_due``/``evaluate``, ``log`` (the run's gauges and clocks, the row, the periodic checkpoint). ``finish`` exports the
student and closes the run.

One layout whichever schedule trains: ``<out_dir>/<name>/metrics.jsonl``, ``checkpoint-<k>`` every
``checkpoint_every`` updates and at the end (``adwin.runtime.checkpoint``; run state ``adwin.runtime.resume``), and
the export: ``student/`` for a sharded student, ``export/`` (adapter and merged student) for a LoRA one, else the
last checkpoint, itself a transformers folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.decode.static_cache import LEDGER as COMPILES
from adwin.loop.accounting import TokenLedger
from adwin.loop.distributed import LocalDist
from adwin.loop.evaluate import evaluate
from adwin.loop.learner import FaultCounter
from adwin.loop.parts import Parts, run_spec
from adwin.loop.rank_zero import RankZeroController, SilentSinks
from adwin.loop.sampler import Sampler
from adwin.probes.client import ProbeClient
from adwin.runtime.checkpoint import rng_state, save_checkpoint, seed_everything
from adwin.runtime.metrics_log import open_loggers
from adwin.runtime.rank_state import check_resumable, restore_rank_rng, write_rank_rngs
from adwin.runtime.resilient_controller import controller_metrics, drain_controller
from adwin.runtime.resume import (
    CONTROLLER_DB,
    read_state,
    resume_from,
    run_state,
    snapshot_controller,
    truncate_metrics,
)
from adwin.runtime.sharded_checkpoint import export_student, stage_sharded
from adwin.student.fsdp import shard_student
from adwin.student.lora import LORA_EXPORT, MERGED_DIR, export_lora
from adwin.student.optimizer import build_optimizer
from adwin.student.structure import is_lora


class Pipeline(Protocol):
    """A schedule with state of its own in flight at a checkpoint (AsyncOPD's request stream)."""

    key: str  # its entry in the checkpoint's run state

    def paused(self) -> AbstractContextManager[None]:
        """Inside it the pipeline's state is one consistent cut with the student's."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], start: int) -> None:
        """Its state back from a checkpoint of ``start`` updates."""


@dataclass
class RunShell:
    """See the module docstring; ``open_shell`` builds one."""

    cfg: TrainConfig
    parts: Parts
    dist: LocalDist
    controller: ControllerAPI | None  # rank 0's own (None on other ranks): checkpoints snapshot its database
    ctl: Any  # what every rank calls (rank 0's answers broadcast in a data-parallel run)
    run_id: str
    optimizer: Any
    lr_scheduler: Any
    ledger: TokenLedger
    faults: FaultCounter
    resume: Path | None = None
    telemetry: Any = None  # the controller loggers and gauges go through (a degraded-mode wrapper may cache)
    client: ProbeClient | None = None  # its pool, audit schedule and decision budget are run state
    pipeline: Pipeline | None = None
    drain: Callable[[int], object] | None = None  # before a checkpoint: collect what probe workers still compute
    closers: list[Callable[[], object]] = field(default_factory=list)  # at the end, or when the run stops
    sinks: Any = None
    initial: dict[str, float] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)
    start_step: int = 0
    started: float = field(default_factory=time.perf_counter)
    sampler_backend: Literal["hf"] | None = None
    _gen: Sampler | None = None
    _eval_s: float = 0.0  # evaluation seconds since the last row
    _closed: bool = False

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.out_dir) / self.cfg.name

    @property
    def gen(self) -> Sampler:
        """The sampler evaluations (and the synchronous trainer's rollouts) draw from."""
        if self._gen is None:
            self._gen = Sampler(self.parts, self.cfg, backend=self.sampler_backend)
        return self._gen

    @property
    def sharded(self) -> bool:
        return self.cfg.model.sharding == "fsdp"

    def start(self, client: ProbeClient, *, pipeline: Pipeline | None = None,
              drain: Callable[[int], object] | None = None, telemetry: Any = None) -> int:
        """Restore the checkpoint the shell was opened with (RNG streams last: nothing may draw after this before
        the first update) and open the loggers; returns the first update to run."""
        self.client, self.pipeline, self.drain = client, pipeline, drain
        self.telemetry = telemetry or self.controller
        if self.resume is not None:
            check_resumable(self.resume, self.dist.world, self.cfg.model.sharding, self.cfg.rollout.seeding)
            if self.dist.is_main:
                truncate_metrics(self.run_dir, int(read_state(self.resume)["step"]))  # rows logged after it come again
            self.ctl.get_run(self.run_id)  # the controller must know the run (and a wrapper caches it)
        self.sinks = (open_loggers(self.cfg, self.run_dir, self.telemetry, self.run_id) if self.dist.is_main
                      else SilentSinks())
        if self.resume is not None:
            extra: dict[str, Any] = {}
            self.initial, self.start_step = resume_from(
                self.resume, self.parts.student, self.optimizer, self.lr_scheduler, client.pool, self.ledger,
                self.parts.train_prompts, self.faults, client.schedule, client.budget, lora=is_lora(self.parts.student),
                on_extra=extra.update)
            if pipeline is not None:
                pipeline.load_state_dict(extra[pipeline.key], self.start_step)
            restore_rank_rng(self.resume, self.dist.rank, self.dist.world)
        self.started = time.perf_counter()
        return self.start_step

    def initial_evaluation(self, given: dict[str, float] | None = None) -> dict[str, float]:
        """The start-of-run evaluation: a resumed run's from its checkpoint, else ``given`` (computed on the same
        student, problems and seed), else evaluated now."""
        if self.resume is None:
            self.initial = dict(given) if given is not None else self.evaluate()
        self.final = self.initial
        return self.initial

    def evaluate(self) -> dict[str, float]:
        """Evaluate the student now; its seconds go to the next row's ``time/eval``."""
        t0 = time.perf_counter()
        self.final = evaluate(self.parts, self.cfg, self.gen, dist=self.dist)
        self._eval_s += time.perf_counter() - t0
        return self.final

    def eval_due(self, step: int) -> bool:
        every = self.cfg.eval.every
        return bool(every and (step + 1) % every == 0) or step == self.cfg.steps - 1

    def checkpoint_due(self, step: int) -> bool:
        every = self.cfg.checkpoint_every
        return bool(every and (step + 1) % every == 0) or step == self.cfg.steps - 1

    def count_faults(self, step: int, m: dict[str, float]) -> dict[str, float]:
        """The update's skipped-step counters; at ``optim.max_bad_steps`` in a row: log the row, checkpoint the
        last good state (skipped updates never touched the weights), close the run and raise ``NumericalFault``."""
        counts = self.faults.record(bool(m["optim/skipped"]))
        if self.faults.exhausted:
            self.sinks.log(step, m | counts | controller_metrics(self.telemetry))
            saved = self.checkpoint(step + 1)
            self.close()
            raise self.faults.fault(step, saved)
        return counts

    def log(self, step: int, m: dict[str, float]) -> dict[str, float]:
        """Add the run's gauges to the update's row, log it, then take the periodic checkpoint (after logging, so
        the controller snapshot holds this update's telemetry). Returns the row."""
        if step == 0:
            m = self.initial | m  # the first row carries the start-of-run evaluation (a later one wins)
        m |= controller_metrics(self.telemetry)  # controller/degraded etc. (degraded-mode wrapper only)
        m |= COMPILES.step_metrics()  # rollout.compile in this process: compile seconds apart from decode time
        m |= {"optim/lr": self.lr_scheduler.get_last_lr()[0], "time/wall": time.perf_counter() - self.started}
        if self._eval_s:  # the first row's includes the start-of-run evaluation
            m["time/eval"], self._eval_s = self._eval_s, 0.0
        self.sinks.log(step, m)
        if self.checkpoint_due(step):
            self.checkpoint(step + 1)
        return m

    def checkpoint(self, step: int, rng: dict[str, Any] | None = None) -> Path:
        """``<run>/checkpoint-<step>``: the student (every rank's shards when sharded), optimizer, LR schedule,
        RNG streams (``rng``: the ones to save; None: now's), the controller's database and the run state;
        every rank returns once it is on disk."""
        if self.drain is not None:
            self.drain(step)  # normally a no-op (drained before logging); the fault stop comes here directly
        with self.pipeline.paused() if self.pipeline is not None else _nothing():
            rng = rng or rng_state()
            rngs = self.dist.all_gather_object(rng)  # each rank's own streams (batch seeding differs per rank)
            student, saved = self.parts.student, self.run_dir / f"checkpoint-{step}"
            staged = stage_sharded(self.run_dir, step, student, self.optimizer, self.dist) if self.sharded else None
            if self.dist.is_main:
                saved = save_checkpoint(
                    self.run_dir, step, student, self.parts.tokenizer, self.optimizer, self.lr_scheduler,
                    self.telemetry.get_run(self.run_id).policy_state,  # cached in an outage
                    extra=self._run_state(), staged=staged, rng=rng,
                    meta={"run_id": self.run_id, "initial_eval": self.initial, "world_size": self.dist.world,
                          "sharding": self.cfg.model.sharding},
                    write_files=lambda d: (snapshot_controller(self.controller, d / CONTROLLER_DB),
                                           write_rank_rngs(d, rngs)))
        self.dist.barrier()  # no rank runs ahead of a checkpoint that is not on disk yet
        return saved

    def _run_state(self) -> dict[str, Any]:
        c = self._client()
        extra = run_state(c.pool, self.ledger, self.parts.train_prompts, self.faults, c.schedule, c.budget)
        if self.pipeline is not None:
            extra[self.pipeline.key] = self.pipeline.state_dict()
        return extra

    def probe_generated(self, length: int) -> None:
        """A probe the schedule generated itself ran to its end: ``length`` tokens, a full rollout's length
        (probe workers' probes reach the ledger through the probe client and the pool)."""
        self.ledger.add_completed(length)
        self._client().pool.tokens_generated += length  # checkpointed with the pool

    def record_rollouts(self, batch: Any, window: int, windows: list[int] | None = None) -> dict[str, float]:
        """The token ledger's row for an update's trained rollouts (``TokenLedger.record``)."""
        return self.ledger.record(batch, window, self._client().pool.tokens_generated, windows=windows)

    def _client(self) -> ProbeClient:
        assert self.client is not None, "RunShell.start first"
        return self.client

    def totals(self) -> dict[str, float]:
        return self.ledger.totals(self.client.pool.tokens_generated if self.client is not None else 0)

    def finish(self) -> Path:
        """Close the run and export the student; returns the folder ``from_pretrained`` loads it from (the last
        checkpoint is one already, except a sharded student's, gathered on rank 0, and a LoRA student's, its
        adapter: the merged student is written beside it)."""
        for close in self.closers:
            close()
        self.closers = []
        student, run_dir = self.parts.student, self.run_dir
        if self.sharded:
            out = export_student(run_dir, student, self.parts.tokenizer, self.dist)
        elif is_lora(student):
            out = run_dir / LORA_EXPORT / MERGED_DIR
            if self.dist.is_main:
                export_lora(student, self.parts.tokenizer, run_dir / LORA_EXPORT)
        else:
            out = run_dir / f"checkpoint-{self.cfg.steps}"
        self.close()
        return out

    def close(self) -> None:
        """Stop what the run started (probe workers, Ray actors), deliver the controller's buffered writes and
        close the loggers; once."""
        if self._closed:
            return
        self._closed = True
        for close in self.closers:
            close()
        drain_controller(self.telemetry)  # degraded mode: deliver what is still buffered (bounded wait)
        if self.sinks is not None:
            self.sinks.close()


@dataclass
class TrainResult:
    """What a run returns, whichever schedule trained it."""

    run_id: str
    run_dir: Path
    initial_eval: dict[str, float]
    final_eval: dict[str, float]
    history: list[dict[str, Any]]
    totals: dict[str, float] = field(default_factory=dict)
    student_dir: Path | None = None  # the final student as a transformers save_pretrained folder


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def open_shell(cfg: TrainConfig, controller: ControllerAPI | None, parts: Parts, *, dist: LocalDist | None = None,
               resume: Path | None = None, sampler: Literal["rollout", "eval"] = "rollout") -> RunShell:
    """Set the run up (the module docstring). ``sampler``: ``rollout`` opens the sampler on ``rollout.backend`` now
    (the synchronous trainer rolls out with it); ``eval`` opens it on transformers at the first evaluation (a
    pipeline samples on engines of its own). ``controller`` is None on ranks > 0 of a data-parallel run."""
    dist = dist or LocalDist()
    ctl = controller if dist.world == 1 else RankZeroController(controller, dist)
    state = read_state(resume) if resume else None
    run_id = state["run_id"] if state else ctl.register_run(run_spec(cfg)).run_id  # a resumed run is known
    shell = RunShell(cfg, parts, dist, controller, ctl, run_id, None, None, TokenLedger(cfg.rollout.max_response_len),
                     FaultCounter(cfg.optim.max_bad_steps), resume=resume,
                     sampler_backend=None if sampler == "rollout" else "hf")
    if sampler == "rollout":
        _ = shell.gen  # before the student is sharded: its engine holds the whole module
    shard_student(parts.student, cfg, dist)  # before the optimizer: it must hold the shards (adwin.student.fsdp)
    shell.optimizer, shell.lr_scheduler = build_optimizer(cfg, parts.student)  # over its shards, its adapters
    # batch seeding: ranks must not draw the same noise for different prompts; one process: unchanged
    seed_everything(cfg.seed + (dist.rank if cfg.rollout.seeding == "batch" else 0))
    return shell
