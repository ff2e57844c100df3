"""The synchronous prefix-window OPD trainer (docs/design.md "The loop", ADWIN sections 4.1-4.2).

``train`` reads top to bottom as one step of the paper's algorithm; its helpers do one thing each and
live in ``parts`` (setup), ``sampler`` (rollouts), ``step`` (teacher, optimizer step), ``probing`` (``ProbeSide``: offers,
probe rounds, audits, token ledger), ``accounting`` (tokens, clocks) and ``evaluate``. Versions: the student's version is the number
of optimizer steps applied, so the rollout of step ``t`` comes from version ``t`` and everything after the
update (probe extension, audit) uses ``t + 1``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.decode.static_cache import LEDGER as COMPILES
from adwin.loop.accounting import Clock
from adwin.loop.distributed import LocalDist
from adwin.loop.evaluate import evaluate
from adwin.loop.learner import FaultCounter
from adwin.loop.outage import score_or_outage, step_start, stop_after_outage
from adwin.loop.parts import Parts, load_parts, run_spec
from adwin.loop.probing import open_probe_side
from adwin.loop.rank_zero import RankZeroController, SilentSinks
from adwin.loop.sampler import Sampler
from adwin.loop.sharding import check_data_parallel, gather_rollouts
from adwin.loop.step import optimize, window_metrics
from adwin.policies.surprise import surprise_metrics
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


@dataclass
class TrainResult:
    run_id: str
    run_dir: Path
    initial_eval: dict[str, float]
    final_eval: dict[str, float]
    history: list[dict[str, Any]]
    totals: dict[str, float] = field(default_factory=dict)
    student_dir: Path | None = None  # the final student as a transformers save_pretrained folder


def train(cfg: TrainConfig, controller: ControllerAPI | None, parts: Parts | None = None,
          on_step: Callable[[int, dict[str, Any]], None] | None = None, resume: Path | None = None,
          initial_eval: dict[str, float] | None = None, dist: LocalDist | None = None) -> TrainResult:
    """Distill ``parts.student`` for ``cfg.steps`` steps, windows decided by ``controller``.

    ``resume``: a checkpoint folder of this run to continue from (``adwin.runtime.resume``; the embedded controller
    must be ``adwin.runtime.resume.open_resumed_controller(resume)``).
    ``initial_eval``: the start-of-run evaluation, already computed by :func:`evaluate` on the same student,
    problems and ``cfg.seed`` (it draws from its own RNG, so skipping it changes nothing else); bench compare
    shares one between the methods of a seed.
    ``dist``: this process's rank of a data-parallel run (``adwin.loop.distributed``; ``controller`` is None on
    ranks > 0): each rank samples and differentiates its shard of the step's rows, rank 0 alone talks to the
    controller and logs, and every rank trains on the same window (docs/decisions.md, "Data-parallel training").
    With ``model.sharding: fsdp`` the student is sharded over the ranks first (``adwin.student.fsdp``), checkpoints
    hold its shards, and the run ends by exporting it whole (``TrainResult.student_dir``; docs/decisions.md,
    "Sharded students").
    """
    dist = dist or LocalDist()
    check_data_parallel(cfg, dist.world)
    parts = parts or load_parts(cfg)
    ctl = controller if dist.world == 1 else RankZeroController(controller, dist)  # every rank's calls
    run_dir = Path(cfg.out_dir) / cfg.name
    state = read_state(resume) if resume else None
    run_id = state["run_id"] if state else ctl.register_run(run_spec(cfg)).run_id  # a resumed run is known
    gen = Sampler(parts, cfg)
    sharded = cfg.model.sharding == "fsdp"  # before the optimizer: it must hold the shards (adwin.student.fsdp)
    shard_student(parts.student, cfg, dist)
    lora = is_lora(parts.student)  # a LoRA student's checkpoints and export hold its adapters
    optimizer, scheduler = build_optimizer(cfg, parts.student)  # over what trains: its shards, its adapters
    # the run's runtime side, together: RNG streams, the checkpoint to resume, loggers, the fault count
    # batch seeding: ranks must not draw the same noise for different prompts; one process: unchanged
    seed_everything(cfg.seed + (dist.rank if cfg.rollout.seeding == "batch" else 0))
    if resume:
        check_resumable(resume, dist.world, cfg.model.sharding, cfg.rollout.seeding)
    if state:
        if dist.is_main:
            truncate_metrics(run_dir, state["step"])
        ctl.get_run(run_id)  # the controller must know the run (and a wrapper caches it)
    sinks = open_loggers(cfg, run_dir, controller, run_id) if dist.is_main else SilentSinks()
    faults = FaultCounter(cfg.optim.max_bad_steps)
    probes = open_probe_side(cfg, ctl, run_id, parts, gen, optimizer, dist)  # thread/Ray workers start here
    clock, started = Clock(), time.perf_counter()

    def checkpoint(step: int, rng: dict[str, Any] | None = None) -> Path:  # rng: the RNG streams to save; None: now's
        probes.drain(step)  # normally a no-op (drained before logging); the fault stop comes here directly
        rng = rng or rng_state()
        rngs = dist.all_gather_object(rng)  # each rank's own streams (batch seeding differs per rank)
        saved = run_dir / f"checkpoint-{step}"
        staged = stage_sharded(run_dir, step, parts.student, optimizer, dist) if sharded else None  # every rank's shards
        if dist.is_main:
            saved = save_checkpoint(
                run_dir, step, parts.student, parts.tokenizer, optimizer, scheduler,
                controller.get_run(run_id).policy_state,
                extra=run_state(probes.pool, probes.ledger, parts.train_prompts, faults, probes.schedule, probes.budget),
                meta={"run_id": run_id, "initial_eval": initial, "world_size": dist.world,
                      "sharding": cfg.model.sharding},
                write_files=lambda d: (snapshot_controller(controller, d / CONTROLLER_DB), write_rank_rngs(d, rngs)),
                staged=staged, rng=rng)
        dist.barrier()  # no rank runs ahead of a checkpoint that is not on disk yet
        return saved

    start = 0
    if resume:  # RNG states are restored last: nothing below may draw before the loop
        initial, start = resume_from(resume, parts.student, optimizer, scheduler, probes.pool, probes.ledger,
                                     parts.train_prompts, faults, probes.schedule, probes.budget, lora=lora)
        restore_rank_rng(resume, dist.rank, dist.world)
    elif initial_eval is not None:
        initial = dict(initial_eval)
    else:
        with clock("eval"):
            initial = evaluate(parts, cfg, gen, dist=dist)
    final = initial
    for t in range(start, cfg.steps):
        step_state = step_start(parts)  # a served teacher's outage checkpoints the step's start
        win = ctl.get_window(run_id, t)
        prompts = parts.train_prompts.next_batch(cfg.rollout.prompts_per_step)
        mine = dist.shard(len(prompts))  # every rank drew the same global batch: keep this rank's rows
        with clock("rollout"):
            batch = gen.step_rollouts(prompts[mine], mine, win.window, t)
        with clock("teacher"):
            teacher, outage = score_or_outage(parts.teachers, batch, cfg, dist)
        if teacher is None:  # the server stays down: no rank trains on the step; checkpoint its start and stop
            stop_after_outage(outage, t, step_state, parts, checkpoint, probes, sinks)
        with clock("train"):  # gradients, loss normaliser and logged sums are summed over ranks
            m, behavior = optimize(parts.student, optimizer, scheduler, batch, teacher, cfg, win.window,
                                   reducer=dist if dist.world > 1 else None)
        m |= faults.record(bool(m["optim/skipped"]))
        if faults.exhausted:  # skipped steps never touched the weights: this checkpoint is the last good state
            sinks.log(t, m | controller_metrics(controller))
            stop_after_faults(faults, t, checkpoint(t + 1), probes, sinks)
        version = t + 1  # optimizer steps applied: the weights every probe token from now on comes from
        gen.sync_weights(version)  # the rollout engine samples probes, evaluations and the next rollouts from it
        save = (cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0) or t == cfg.steps - 1
        batch, behavior, teacher_lp = gather_rollouts(dist, batch, behavior, teacher.logprobs, gen.pad)
        if probes.enabled:
            with clock("probe"):
                m |= probes.offer(t, batch, behavior, win.window) | probes.advance(version)
            with clock("audit"):  # learner-side share: thread/Ray workers compute the audit (waited for at a save)
                m |= probes.audit(version, wait=bool(save), last=t == cfg.steps - 1)
        learner_s = sum(clock.spent.get(k, 0.0) for k in ("rollout", "teacher", "train"))  # the decision budget's T
        m |= window_metrics(win) | probes.account(batch, win.window, learner_s)
        m |= surprise_metrics(teacher_lp, batch.rows.response_mask, cfg.window.surprise) | {
            "rollout/prompt_tokens": float(sum(map(len, batch.prompt_ids)))}  # surprise policy input; FLOPs
        if t == 0:
            m |= initial
        if (cfg.eval.every and (t + 1) % cfg.eval.every == 0) or t == cfg.steps - 1:
            with clock("eval"):
                final = evaluate(parts, cfg, gen, dist=dist)
            m |= final
        m |= controller_metrics(controller)  # controller/degraded etc. (degraded-mode wrapper only)
        m |= COMPILES.step_metrics()  # rollout.compile: compile seconds apart from the decode time
        m |= clock.metrics() | {"optim/lr": scheduler.get_last_lr()[0], "time/wall": time.perf_counter() - started}
        sinks.log(t, m)
        if save:
            checkpoint(t + 1)  # after logging, so the controller snapshot holds this step's telemetry
        clock.reset()  # after logging: step 0 carries the initial evaluation's time
        if on_step is not None:
            on_step(t, m)
    probes.close()
    # the last checkpoint is a transformers folder already, except a sharded student's (gathered on rank 0; a
    # LoRA one's adapter and merged student) and a LoRA student's (its adapter: the merged student beside it)
    if sharded:
        student = export_student(run_dir, parts.student, parts.tokenizer, dist)
    elif lora:
        student = run_dir / LORA_EXPORT / MERGED_DIR
        if dist.is_main:
            export_lora(parts.student, parts.tokenizer, run_dir / LORA_EXPORT)
    else:
        student = run_dir / f"checkpoint-{cfg.steps}"
    drain_controller(controller)  # degraded mode: deliver what is still buffered (bounded wait)
    sinks.close()
    return TrainResult(run_id, run_dir, initial, final, sinks.history, probes.totals(), student)


def stop_after_faults(faults: FaultCounter, step: int, saved: Path, probes: Any, sinks: Any) -> None:
    """Close workers and loggers, then stop the run: too many consecutive non-finite steps."""
    probes.close()
    sinks.close()
    raise faults.fault(step, saved)
