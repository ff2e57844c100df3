"""The synchronous prefix-window OPD trainer (docs/design.md "The loop", ADWIN sections 4.1-4.2).

``train`` reads top to bottom as one step of the paper's algorithm; its helpers do one thing each and
live in ``shell`` (the run around the updates, shared with the AsyncOPD pipeline: setup, controller registration,
loggers, evaluation cadence, checkpoints, resume, export, token ledger, fault count), ``parts`` (models, prompts),
``sampler`` (rollouts), ``step`` (teacher, optimizer step), ``probing`` (``ProbeSide``: offers,
probe rounds, audits, token ledger), ``accounting`` (tokens, clocks) and ``evaluate``. Versions: the student's version is the number
of optimizer steps applied, so the rollout of step ``t`` comes from version ``t`` and everything after the
update (probe extension, audit) uses ``t + 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.loop.accounting import Clock
from adwin.loop.distributed import LocalDist
from adwin.loop.outage import score_or_outage, step_start, stop_after_outage
from adwin.loop.parts import Parts, load_parts
from adwin.loop.probing import open_probe_side
from adwin.loop.sharding import check_data_parallel, gather_rollouts
from adwin.loop.shell import TrainResult, open_shell
from adwin.loop.step import optimize, window_metrics
from adwin.policies.surprise import surprise_metrics


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
    # the run around the updates: its id, the student sharded, the optimizer, seeds, ledger, fault count
    shell = open_shell(cfg, controller, parts, dist=dist, resume=resume)
    gen, optimizer, scheduler = shell.gen, shell.optimizer, shell.lr_scheduler
    probes = open_probe_side(cfg, shell.ctl, shell.run_id, parts, gen, optimizer, dist, ledger=shell.ledger)
    shell.closers.append(probes.close)  # thread/Ray workers started with the probe side
    start = shell.start(probes.client, drain=probes.drain)  # a checkpoint restored, loggers open
    clock = Clock()
    initial = shell.initial_evaluation(initial_eval)  # its seconds: step 0's time/eval
    for t in range(start, cfg.steps):
        step_state = step_start(parts)  # a served teacher's outage checkpoints the step's start
        win = shell.ctl.get_window(shell.run_id, t)
        prompts = parts.train_prompts.next_batch(cfg.rollout.prompts_per_step)
        mine = dist.shard(len(prompts))  # every rank drew the same global batch: keep this rank's rows
        with clock("rollout"):
            batch = gen.step_rollouts(prompts[mine], mine, win.window, t)
        with clock("teacher"):
            teacher, outage = score_or_outage(parts.teachers, batch, cfg, dist)
        if teacher is None:  # the server stays down: no rank trains on the step; checkpoint its start and stop
            stop_after_outage(outage, t, step_state, parts, shell)
        with clock("train"):  # gradients, loss normaliser and logged sums are summed over ranks
            m, behavior = optimize(parts.student, optimizer, scheduler, batch, teacher, cfg, win.window,
                                   reducer=dist if dist.world > 1 else None)
        m |= shell.count_faults(t, m)  # too many skipped steps in a row: checkpoint the last good state, stop
        version = t + 1  # optimizer steps applied: the weights every probe token from now on comes from
        gen.sync_weights(version)  # the rollout engine samples probes, evaluations and the next rollouts from it
        save = shell.checkpoint_due(t)
        batch, behavior, teacher_lp = gather_rollouts(dist, batch, behavior, teacher.logprobs, gen.pad)
        if probes.enabled:
            with clock("probe"):
                m |= probes.offer(t, batch, behavior, win.window) | probes.advance(version)
            with clock("audit"):  # learner-side share: thread/Ray workers compute the audit (waited for at a save)
                m |= probes.audit(version, wait=save, last=t == cfg.steps - 1)
        learner_s = sum(clock.spent.get(k, 0.0) for k in ("rollout", "teacher", "train"))  # the decision budget's T
        m |= window_metrics(win) | probes.account(batch, win.window, learner_s)
        m |= surprise_metrics(teacher_lp, batch.rows.response_mask, cfg.window.surprise) | {
            "rollout/prompt_tokens": float(sum(map(len, batch.prompt_ids)))}  # surprise policy input; FLOPs
        if shell.eval_due(t):
            m |= shell.evaluate()
        m = shell.log(t, m | clock.metrics())  # + the run's gauges and time/eval; the periodic checkpoint after it
        clock.reset()
        if on_step is not None:
            on_step(t, m)
    student = shell.finish()  # workers closed, the student exported, loggers closed
    return TrainResult(shell.run_id, shell.run_dir, initial, shell.final, shell.sinks.history, shell.totals(), student)
