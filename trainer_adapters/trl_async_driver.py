"""``AdwinCallback``'s side of TRL's ``AsyncDistillationTrainer`` built with ``AdwinRolloutWorker``.

``AdwinCallback.attach`` builds an ``AsyncDriver`` for such a trainer; the callback's events call it. The run is the
one fresh-probe driver (``adwin.trainer_adapters.hooks.ControllerWindowHooks``), shared with the rollout worker:

- at ``attach``: refuse what cannot be honoured (``UnsupportedSetting``, naming the field), register the run, read
  the first window (``on_sync(0)``; a bad answer there is a ``BadWindowAnswer`` before any training), give the
  hooks' probe client the audit (``AuditConfig`` settings and schedule, the decision budget), bind the worker. The
  probes arrive scored by TRL's teacher servers, so the client needs no teacher of its own;
- after each optimizer step (``on_step_end``, after TRL's own weight sync): the probe rows the worker finished are
  reported complete (``on_probe_complete``), the step's training seconds and tokens go to the decision budget, a
  ready batch of ``P`` probes is audited on the trainer's side (``poll_audit``: ``autograd.grad`` on the live
  student, ``.grad`` and optimizer state untouched), and, when TRL synced weights in that step, the window of the
  next phase is read (``on_sync``): the worker's next requests are capped at what the audit decided.

Staleness is counted in one unit, weight syncs (TRL's ``model_version``): adwin's version is TRL's
``model_version - 1`` (the cold sync at train begin publishes version 0, the initial weights). TRL drops a training
row more than ``args.max_staleness`` syncs old, adwin a probe more than the run's ``staleness_limit`` syncs old;
one limit holds for both, the tighter: a run the callback registers gets ``staleness_limit = min(S, max_staleness)``,
and TRL's ``max_staleness`` is lowered to ``S`` when adwin's is tighter. With ``weight_sync_steps = 1`` (TRL's
default) a sync is an optimizer step.

A controller answer outside ``[1, max_len]`` is a ``BadWindowAnswer``: logged, kept in ``window_errors``, counted in
``window/bad_answers``; the worker stays on the last window, and no row, probe or audit is dropped for it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import AuditOut, PolicyIn, RunIn
from adwin.probes.client import InlineAuditor
from adwin.probes.settings import audit_schedule, audit_settings
from adwin.runtime.resilient_controller import drain_controller
from adwin.trainer_adapters.generic import spec_budget
from adwin.trainer_adapters.hooks import BadWindowAnswer, ControllerWindowHooks
from adwin.trainer_adapters.registration import register, resilient
from adwin.trainer_adapters.trl_async import AdwinRolloutWorker, UnsupportedSetting

log = logging.getLogger(__name__)


def staleness_limit(trainer_args: Any, adwin_limit: int) -> int:
    """The tighter of TRL's ``max_staleness`` and adwin's ``S``, both in weight syncs; at least 1."""
    return max(1, min(int(adwin_limit), int(trainer_args.max_staleness)))


def check_settings(trainer: Any) -> None:
    """Refuse (``UnsupportedSetting``, naming the field) what the worker cannot honour, before anything is
    registered: TRL prints sampled completions from its own scheduling loop, which the worker replaces."""
    if trainer.args.log_completions:
        raise UnsupportedSetting("log_completions", "AdwinRolloutWorker schedules TRL's requests itself and does not "
                                 "print completions; leave it False (the trainer's rollout traces still log)")


class AsyncDriver:
    """The run of one ``AsyncDistillationTrainer`` with ``AdwinRolloutWorker`` (module docstring)."""

    def __init__(self, trainer: Any, worker: AdwinRolloutWorker, hooks: ControllerWindowHooks,
                 audit_metric: str) -> None:
        self.trainer, self.worker, self.hooks = trainer, worker, hooks
        self.audit_metric = audit_metric
        self.window_errors: list[BadWindowAnswer] = []
        self.probe_rows = 0  # full-length probe rows the worker finished and the driver reported
        self.decide_s = 0.0  # the learner's seconds in step_end: probe reports, audits, the window read
        self._step_started: float | None = None
        self.synced = 0  # the version whose window the worker caps requests at

    @classmethod
    def connect(cls, trainer: Any, controller: ControllerAPI, run: str | RunIn, *, candidates: list[int] | None,
                threshold: float, probe_count: int, audit: Any, report_steps: bool, offer_finished: str,
                resume: bool, resilient_controller: bool, model_params: tuple[int, ...]) -> AsyncDriver:
        """Register the run, read its first window, configure the audit and bind the worker (module docstring)."""
        worker: AdwinRolloutWorker = trainer.rollout_worker
        check_settings(trainer)  # before anything is registered
        args = trainer.args
        api = resilient(controller, resilient_controller)
        if isinstance(run, str) and candidates is not None:
            policy = PolicyIn(name="adwin", candidates=candidates, threshold=threshold,
                              max_len=int(args.max_completion_length))
            run = RunIn(run_id=run, name=run, policy=policy, probe_batch_size=max(1, probe_count),
                        offers_per_step=probe_count)
        if isinstance(run, RunIn):
            tight = staleness_limit(args, run.staleness_limit)
            if tight < run.staleness_limit:
                log.info("run %s: staleness_limit %d -> %d (TRL's max_staleness, in weight syncs)",
                         run.run_id, run.staleness_limit, tight)
                run = run.model_copy(update={"staleness_limit": tight})
        out = register(api, run, resume=resume)
        s = int(out.spec.get("staleness_limit", 1 << 30))
        if s > staleness_limit(args, s):
            raise UnsupportedSetting("staleness_limit", f"run {out.run_id}: {s} weight syncs is looser than TRL's "
                                     f"max_staleness={args.max_staleness}; register the run with the tighter limit "
                                     "(or pass candidates and let the callback register it)")
        if s < int(args.max_staleness):
            log.info("TRL max_staleness %d -> %d (the run's staleness_limit, in weight syncs)", args.max_staleness, s)
            args.max_staleness = s  # read when train() builds TRL's rollout queue
        policy = out.spec["policy"]
        hooks = ControllerWindowHooks(api, out.run_id, max_len=int(policy["max_len"]), report_steps=report_steps,
                                      offer_finished=offer_finished, resilient_controller=resilient_controller)
        hooks.on_sync(0)  # the first requests' window; BadWindowAnswer here: no window to fall back to
        pc = hooks.client
        pc.settings = audit_settings(audit, policy.get("candidates") or [])
        pc.schedule = audit_schedule(audit, float(policy.get("threshold", threshold)))
        pc.pad_id = int(trainer.processing_class.pad_token_id)
        pc.budget = spec_budget(audit, out.spec, model_params)
        worker.bind(trainer, hooks)
        return cls(trainer, worker, hooks, audit.metric)

    # --- the callback's events ------------------------------------------------------------------------

    def step_begin(self) -> int:
        """The window the worker caps requests at now."""
        self._step_started = time.perf_counter()
        return self.hooks.window

    def step_end(self, step: int) -> tuple[dict[str, float], AuditOut | None]:
        """After optimizer step ``step`` (TRL's sync, if due, has run): report the finished probes, audit a ready
        batch under the new weights, read the next phase's window after a sync; returns the metrics to log and the
        controller's answer to the audit (None without one)."""
        t0 = time.perf_counter()
        version = self.worker.version  # weight syncs (module docstring)
        pc = self.hooks.client
        if self._step_started is not None:  # the step's queue wait, forward, backward and update
            pc.record_train(self._step_tokens(), t0 - self._step_started)
            self._step_started = None
        completed = 0
        while not self.worker.probe_rows.empty():  # only this thread takes from it
            self.hooks.on_probe_complete(self.worker.probe_rows.get_nowait(), version)
            completed += 1
        student = self.trainer.accelerator.unwrap_model(self.trainer.model)
        pc.auditor = InlineAuditor(student, self.trainer.optimizer if self.audit_metric == "adam" else None)
        pc.record.last_out = None
        m = self.hooks.poll_audit(version)
        decision = pc.record.last_out
        if version != self.synced:  # a weight sync: a new phase, whose window the controller decides
            self.synced = version
            try:
                m |= self.hooks.on_sync(version).metrics
            except BadWindowAnswer as e:  # the worker keeps the last window; nothing queued or held is dropped
                log.warning("%s", e)
                self.window_errors.append(e)
        self.probe_rows += completed
        self.decide_s += time.perf_counter() - t0
        counts = self.hooks.counts
        m |= {"window/bad_answers": float(len(self.window_errors)), "probe/completed": float(completed),
              "probe/offered": float(counts["offered"]), "probe/accepted": float(counts["accepted"]),
              "probe/audits": float(counts["audits"]), "probe/expired": float(counts["expired"]),
              "probe/held": float(len(pc.pool)), "probe/audit_s": float(pc.record.audit_s)}
        return m | self.hooks.metrics(), decision

    def train_end(self, timeout_s: float) -> int:
        """Close the probe batches held for a pooled audit unaudited (no later step uses them), then deliver the
        writes buffered during a controller outage (bounded); returns those left."""
        self.hooks.client.release_held(self.worker.version)
        return drain_controller(self.hooks.controller, timeout_s)

    def _step_tokens(self) -> float:
        """The step's forwarded tokens as TRL measured them (its ``batch/forwarded_tokens_per_step``, logged just
        before the callback's ``on_step_end``)."""
        values = self.trainer._metrics["train"].get("batch/forwarded_tokens_per_step") or [0.0]
        return float(values[-1])
