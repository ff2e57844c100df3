"""The trainer's probe side (ADWIN section 4.2): ``ProbeSide``, the sync trainer's driver of the one probe
client (``adwin.probes.client.ProbeClient``).

It adds what only the synchronous trainer has: rows of a ``Batch`` turned into probe records, the token
ledger that probe lengths feed, and the step metrics. The trainer calls four things, in step order:
``offer`` this step's rollouts, ``advance`` the probe rounds, ``audit`` a batch that is ready, and
``account`` the step's tokens.

Audits run where the probes run (docs/decisions.md, "Audits off the learner"): with ``inline`` workers (and
``rollout``, whose rounds ride the next step's rollout call) the audit is computed in the step, on the trainer's
weights; with ``thread`` and ``ray`` workers the learner only
scores the batch with the teacher and hands an ``AuditJob`` to a worker. The result is submitted at the first
step after it is back (``audit/lag_steps``); the learner never waits for it, except at a checkpoint or at the
end of the run (``drain``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from adwin.audit.budget import DecisionBudget
from adwin.audit.job import adam_snapshot, run_audit_job
from adwin.audit.schedule import AuditSchedule
from adwin.config import TrainConfig
from adwin.config.sections import IN_STEP_BACKENDS
from adwin.controller.api import ControllerAPI
from adwin.loop.accounting import TokenLedger
from adwin.loop.distributed import LocalDist
from adwin.loop.parts import Parts
from adwin.loop.probe_rounds import RoundExtender
from adwin.loop.sampler import Sampler
from adwin.probes.client import ProbeClient
from adwin.probes.executors import build_executor
from adwin.probes.pool import Probe, ProbePool
from adwin.probes.riding import RidingWorker
from adwin.probes.settings import configure_audits
from adwin.sampling.batch import Batch


@dataclass
class ProbeSide:
    """See the module docstring. ``open_probe_side`` builds one from a config; tests may build it by hand."""

    client: ProbeClient
    ledger: TokenLedger
    rider: RidingWorker | None = None  # probes.backend: rollout: its rows in the step's rollout call

    def __post_init__(self) -> None:
        self.client.on_completed = lambda p: self.ledger.add_completed(len(p.response_ids))  # a truncated sample's full length

    @property
    def enabled(self) -> bool:
        """Probing runs only for an audited policy with offers (``open_probe_side`` decides)."""
        return self.client.executor is not None

    @property
    def pool(self) -> ProbePool:
        return self.client.pool

    @property
    def schedule(self) -> AuditSchedule | None:  # restored and saved with a checkpoint
        return self.client.schedule

    @property
    def budget(self) -> DecisionBudget | None:  # restored and saved with a checkpoint
        return self.client.budget

    def offer(self, step: int, batch: Batch, behavior: torch.Tensor, window: int) -> dict[str, float]:
        """Offer this step's rollouts; accepted ones enter the pool.

        behavior: (B, L) the behaviour logprobs of the rollout rows, aligned with their input ids.
        """
        records = []
        rows = behavior.tolist()  # one device-to-host copy for the batch, not one per row (each a GPU sync)
        for b in range(len(batch.response_ids)):
            n_p, n_r = len(batch.prompt_ids[b]), len(batch.response_ids[b])
            records.append(Probe(f"s{step}-{b}", list(batch.prompt_ids[b]), list(batch.response_ids[b]), [step] * n_r,
                                 rows[b][n_p : n_p + n_r], batch.prompts[b].route, submitted_step=step,
                                 prompt_id=batch.prompts[b].id))
        before = dict(self.client.counts)
        self.client.offer(step, records, batch.finished, window)
        return {"probe/offered": float(self.client.counts["offered"] - before["offered"]),
                "probe/accepted": float(self.client.counts["accepted"] - before["accepted"])}

    def advance(self, version: int) -> dict[str, float]:
        """The probe rounds after the update to ``version`` (``ProbeClient.advance``), as step metrics."""
        if self.client.executor is None:
            return {}
        stats = self.client.advance(version)
        expired = self.client.evict(version)  # the controller expires them too
        stale = stats.staleness
        m = {"probe/dropped_stale": float(stats.dropped_stale)} if stats.dropped_stale else {}
        m |= self.rider.metrics() if self.rider is not None else {}
        return m | {
            "probe/active": float(stats.active), "probe/forced": float(stats.forced),
            "probe/completed": float(stats.completed), "probe/tokens": float(stats.tokens), "probe/pool": float(len(self.pool)),
            "probe/staleness_max": float(max(stale, default=0)),
            "probe/staleness_mean": float(np.mean(stale)) if stale else 0.0,
            "probe/blocked_s": stats.blocked_s, "probe/sync_s": stats.sync_s,
            "probe/decode_steps": float(stats.decode_steps),
            "probe/in_flight": float(stats.in_flight),
            "probe/submitted": float(stats.submitted), "probe/reissued": float(stats.reissued),
            "probe/lost": float(stats.lost), "probe/worker_restarts": float(stats.restarts),
            "probe/evicted": float(expired)}

    def audit(self, version: int, *, wait: bool = False, last: bool = False) -> dict[str, float]:
        """Collect audits that are back, then hand ready probe batches to the workers (inline: compute it now);
        ``wait`` (a checkpoint follows) also audits the batches a decision budget holds for its pool, except at
        the ``last`` step, where they are released unaudited: no step is left to use their decision."""
        return self.client.audit(version, wait=wait, flush=wait and not last, release=last)

    def drain(self, version: int) -> dict[str, float]:
        return self.client.drain(version)

    def account(self, batch: Batch, window: int, learner_s: float) -> dict[str, float]:
        """The step's tokens; its training compute (``batch``'s prompt + response tokens, ``learner_s`` the
        learner's rollout, teacher and update seconds) to the decision budget, and ``decision/*``."""
        self.client.record.window = window
        self.client.record_train(float(sum(map(len, batch.prompt_ids)) + sum(map(len, batch.response_ids))), learner_s)
        return self.ledger.record(batch, window, self.pool.tokens_generated) | self.client.decision_metrics() | {
            "rollout/decode_steps": float(batch.decode_steps)}

    def totals(self) -> dict[str, float]:
        return self.ledger.totals(self.pool.tokens_generated)

    def close(self) -> None:
        self.client.close()


def open_probe_side(cfg: TrainConfig, controller: ControllerAPI, run_id: str, parts: Parts, gen: Sampler,
                    optimizer: torch.optim.Optimizer, dist: LocalDist | None = None,
                    ledger: TokenLedger | None = None) -> ProbeSide:
    """The run's probe side; its workers (thread, Ray) start here when the policy is audited. ``ledger``: the
    run's token ledger (``adwin.loop.shell``), which completed probes feed (None: a new one).

    Data-parallel (``dist`` of world > 1, inline backend; ``controller`` answers every rank alike): every
    rank keeps the same pool, each extends its share of a round (``RoundExtender``) and differentiates its
    share of an audited batch, combined exactly across ranks (``adwin.audit.combine``); the teacher drift
    diagnostics are computed on rank 0 only (it alone logs).
    """
    dist = dist or LocalDist()
    client = ProbeClient(controller, run_id, ProbePool(cfg.rollout.max_response_len), cfg.probes.staleness_limit,
                         offer_finished=cfg.probes.offer_finished, probe_batch_size=cfg.probes.batch_size)
    side = ProbeSide(client, ledger or TokenLedger(cfg.rollout.max_response_len))
    if not cfg.probing:
        return side
    p, r = cfg.probes, cfg.rollout
    # inline probes continue on the rollout engine; the thread/Ray workers extend on their own replicas
    extend = RoundExtender(gen.generate, r.temperature, r.top_p, dist,
                           cfg.seed if r.seeding == "per_sample" else None, lambda: client.executor.version)
    if p.backend == "rollout":  # rounds ride the next training rollout call, on the rollout engine
        side.rider = gen.rider = RidingWorker(extend, lambda job: run_audit_job(parts.student, job, optimizer),
                                              lambda: gen.version)
    client.executor = build_executor(p.backend, client.pool, parts.student, eos=gen.eos, pad_id=gen.pad,
                                     temperature=r.temperature, top_p=r.top_p, extend=extend, workers=p.workers,
                                     ray_address=p.ray_address, ray_num_cpus=p.ray_num_cpus,
                                     fault_policy=p.fault_policy, max_reissues=p.max_reissues, optimizer=optimizer,
                                     rider=side.rider, compile=r.compile)
    configure_audits(client, cfg, parts.teachers, pad_id=gen.pad, student=parts.student,
                     drift=dist.is_main)  # drift/*: rank 0's (it alone logs)
    if dist.world > 1:
        client.settings.extra["combine"] = dist
    if cfg.audit.metric == "adam" and p.backend not in IN_STEP_BACKENDS:  # those read the optimizer itself
        client.adam_moments = lambda: adam_snapshot(optimizer, parts.student)
    return side
