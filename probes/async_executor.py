"""The probe executor: runs the controller's probe plan on workers, off the critical path.

The executor never talks to the controller: the probe client (``adwin.probes.client.ProbeClient``) asks
for the plan, hands it over and sends the reports the executor returns. The trainer thread is the only
thread that mutates the pool. Each step the client calls ``publish(version)`` after the optimizer step (a
weights snapshot for the workers) and ``advance(plan, version)``, which

1. collects rounds that finished since the last call (never waits), applies them to the pool and
   returns one report per probe (``AdvanceStats.reports``, in the order the controller must see them);
2. follows the plan at ``version``; probes the plan wants force-completed (staleness reached S) are
   the one thing it waits for: the round holding them (if in flight), then a forced round to the
   horizon. That wait is ``blocked_s``;
3. hands every other active probe that is not in flight to an idle worker (at most one round per
   worker in flight, so work is bounded by ``max_active`` probes) and returns.

Workers are told the version to use with each round and get that version's weights when their replica
is older, so after optimizer step ``t`` every round starts from version ``t + 1`` and every appended
token carries the version that produced it (a probe's tokens may span several versions).

Faults: a round that raises (thread died, actor killed, ...) loses no probe silently. A dead worker is
replaced; each of its probes is re-issued from its last recorded prefix (the pool only changes when a
round's result is applied, so the prefix is intact) unless the policy is ``drop`` or the probe has
already been re-issued ``max_reissues`` times: then it is dropped, reported ``dropped`` to the
controller (through the reports) and counted in ``lost``. Both come with a log line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from adwin.audit.job import AuditJob, AuditOutcome
from adwin.controller.schemas import ProbePlanOut, ProbeReportIn
from adwin.probes.pool import Extension, ProbePool, RoundStats, record_round
from adwin.probes.workers import ProbeWorker, RoundJob

log = logging.getLogger(__name__)

FaultPolicy = Literal["reissue", "drop"]


@dataclass
class AdvanceStats(RoundStats):
    """One ``advance``: applied rounds (``RoundStats``) plus what the async machinery did."""

    blocked_s: float = 0.0  # the trainer thread waited for probes (forced completion; inline rounds)
    active: int = 0  # active probes in the plan
    submitted: int = 0  # probes handed to workers
    in_flight: int = 0  # probes in workers' hands when ``advance`` returned
    reissued: int = 0
    lost: int = 0
    restarts: int = 0
    dropped_stale: int = 0  # unfinished probes past S dropped before the round (missed rounds)
    sync_s: float = 0.0  # the weights snapshot of the version (``publish``)
    decode_steps: int = 0  # of the rounds applied (``Extension.decode_steps``)
    staleness: list[int] = field(default_factory=list)  # of the probes reported, at the version (the client's)


@dataclass
class _Slot:
    worker: ProbeWorker
    loaded: int = -1  # weights version the worker's replica holds (after its queued jobs)
    job: RoundJob | None = None
    future: Future[Extension] | None = None


@dataclass
class _Totals:
    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("blocked_s", "sync_s", "reissued", "lost", "restarts", "rounds"), 0.0))


class AsyncProbeExecutor:
    """Runs probe rounds on ``workers`` slots made by ``spawn``; see the module docstring."""

    def __init__(self, pool: ProbePool, spawn: Callable[[], ProbeWorker], *, workers: int = 1,
                 snapshot: Callable[[], Any] | None = None, fault_policy: FaultPolicy = "reissue",
                 max_reissues: int = 2) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if fault_policy not in ("reissue", "drop"):
            raise ValueError(f"fault_policy must be 'reissue' or 'drop', got {fault_policy!r}")
        self.pool, self.spawn, self.snapshot = pool, spawn, snapshot
        self.fault_policy, self.max_reissues = fault_policy, max_reissues
        self.slots = [_Slot(spawn()) for _ in range(workers)]
        self.version = 0
        self._weights: Any = None
        self._attempts: dict[str, int] = {}
        self.totals = _Totals().counts

    # --- weights ----------------------------------------------------------------------------------

    def publish(self, version: int) -> float:
        """Step boundary: rounds submitted from now on use ``version`` (its weights are snapshotted now)."""
        t0 = time.perf_counter()
        if version != self.version or self._weights is None:
            self.version = version
            self._weights = self.snapshot() if self.snapshot is not None else None
        dt = time.perf_counter() - t0
        self.totals["sync_s"] += dt
        return dt

    # --- one step ---------------------------------------------------------------------------------

    def advance(self, plan: ProbePlanOut, version: int, *, to_full: bool = False,
                drop_unknown: bool = True) -> AdvanceStats:
        """Follow ``plan`` (the controller's at ``version``); the reports to send are in ``stats.reports``.

        ``plan`` is read after the rounds already back are applied (``collect``), as the controller must have
        seen their reports first: the client calls ``collect`` and reports before it asks for the plan.
        ``to_full``: extend every active probe to the horizon in this round (a loop that finishes its probes
        in one full-length call). ``drop_unknown``: report probes the plan names but this pool never held as
        dropped (one process holds every probe); False leaves them to the processes that hold them.
        """
        if version != self.version:
            self.publish(version)
        stats = AdvanceStats()
        stats.active = len(plan.active)
        flying = self._in_flight()
        for pid in dict.fromkeys([*plan.force_complete, *plan.active]):
            if drop_unknown and pid not in self.pool and pid not in flying:
                stats.dropped += 1  # unknown here (e.g. lost with a restarted trainer): the controller drops it
                stats.reports.append(ProbeReportIn(probe_id=pid, step=version, tokens_added=0, version=version,
                                                   dropped=True))
        forced = [pid for pid in plan.force_complete if pid in self.pool]
        if forced:
            t0 = time.perf_counter()
            self._force(forced, stats)
            stats.blocked_s += time.perf_counter() - t0
        closed = {r.probe_id for r in stats.reports if r.finished or r.forced or r.dropped}
        self._submit([p for p in plan.active if p not in closed], None if to_full else plan.extend_by, stats)
        self._collect(stats, block=False)  # inline workers are done already
        stats.in_flight = len(self._in_flight())
        for k in ("blocked_s", "reissued", "lost", "restarts"):
            self.totals[k] += getattr(stats, k)
        return stats

    def collect(self, version: int) -> AdvanceStats:
        """Apply the rounds that are back (never waits); their reports are in ``stats.reports``."""
        if version != self.version:
            self.publish(version)
        stats = AdvanceStats()
        self._collect(stats, block=False)
        for k in ("reissued", "lost", "restarts"):
            self.totals[k] += getattr(stats, k)
        return stats

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        """Hand an audit to a worker (an idle one if any): it runs on that worker's replica under
        ``job.version``'s weights, after the rounds already queued there."""
        if job.version != self.version:
            raise ValueError(f"audit at version {job.version}, but the published weights are version {self.version}")
        slot = next((s for s in self.slots if s.job is None), self.slots[0])
        job.weights = self._weights if slot.loaded < job.version else None
        slot.loaded = max(slot.loaded, job.version)
        return slot.worker.submit_audit(job)

    def close(self) -> None:
        for slot in self.slots:
            slot.worker.close()

    # --- internals --------------------------------------------------------------------------------

    def _in_flight(self) -> set[str]:
        return {pid for s in self.slots if s.job is not None for pid in s.job.probe_ids}

    def _collect(self, stats: AdvanceStats, *, block: bool, only: set[str] | None = None) -> None:
        for slot in self.slots:
            if slot.future is None or slot.job is None:
                continue
            if only is not None and not only & set(slot.job.probe_ids):
                continue
            if not block and not slot.future.done():
                continue
            self._finish(slot, stats)

    def _finish(self, slot: _Slot, stats: AdvanceStats) -> None:
        job, fut = slot.job, slot.future
        assert job is not None and fut is not None
        slot.job, slot.future = None, None
        try:
            ext = fut.result()
        except Exception as e:  # noqa: BLE001 - any failed round goes through the same recovery
            self._recover(slot, job, e, stats)
            return
        probes = [self.pool.get(pid) for pid in job.probe_ids if pid in self.pool]
        keep = [i for i, pid in enumerate(job.probe_ids) if pid in self.pool]
        ext = Extension([ext.tokens[i] for i in keep], None if ext.logprobs is None else [ext.logprobs[i] for i in keep],
                        [ext.finished[i] for i in keep], ext.decode_steps)
        added = self.pool.apply(probes, ext, job.version, force=job.force)
        applied = RoundStats()
        record_round(applied, probes, added, self.version, job.version, force=job.force)
        self.totals["rounds"] += 1
        stats.decode_steps += ext.decode_steps
        for k in ("extended", "forced", "completed", "tokens"):
            setattr(stats, k, getattr(stats, k) + getattr(applied, k))
        stats.reports += applied.reports

    def _recover(self, slot: _Slot, job: RoundJob, err: BaseException, stats: AdvanceStats) -> None:
        if not slot.worker.alive():
            slot.worker.close()
            slot.worker, slot.loaded = self.spawn(), -1
            stats.restarts += 1
            log.warning("probe worker died (%r); started a new one", err)
        else:
            slot.loaded = -1  # the failed round may have left the replica half-loaded
        drops: list[ProbeReportIn] = []
        for pid in job.probe_ids:
            if pid not in self.pool:
                continue
            n = self._attempts[pid] = self._attempts.get(pid, 0) + 1
            if self.fault_policy == "drop" or n > self.max_reissues:
                self.pool.pop([pid])
                stats.lost += 1
                drops.append(ProbeReportIn(probe_id=pid, step=self.version, tokens_added=0, version=self.version,
                                           dropped=True))
                log.warning("probe %s dropped after a failed round (attempt %d, policy %s)", pid, n, self.fault_policy)
            else:
                stats.reissued += 1
                log.warning("probe %s re-issued from its %d-token prefix (attempt %d)", pid,
                            len(self.pool.get(pid).response_ids), n)
        stats.reports += drops

    def _force(self, forced: list[str], stats: AdvanceStats) -> None:
        """Complete ``forced`` now: wait for the rounds holding them, then extend them to the horizon."""
        self._collect(stats, block=True, only=set(forced))
        while True:
            todo = [pid for pid in forced if pid in self.pool and not self.pool.get(pid).finished]
            if not todo:
                break
            slot = self._idle_slot(stats)
            probes = [self.pool.get(pid) for pid in todo]
            job = self._job(slot, todo, [self.pool.budget(p, None) for p in probes], force=True)
            self._start(slot, job)
            self._finish(slot, stats)  # blocks: forced completion is the one allowed wait

    def _idle_slot(self, stats: AdvanceStats) -> _Slot:
        for slot in self.slots:
            if slot.job is None:
                return slot
        slot = self.slots[0]
        self._finish(slot, stats)  # all busy: wait for one
        return slot

    def _submit(self, active: list[str], extend_by: int | None, stats: AdvanceStats) -> None:
        flying = self._in_flight()
        todo, done = [], []
        for pid in active:
            if pid not in self.pool or pid in flying:
                continue
            (done if self.pool.get(pid).finished else todo).append(pid)
        if done:  # complete on arrival (e.g. full-horizon rollouts): report without extending
            applied = RoundStats()
            record_round(applied, [self.pool.get(pid) for pid in done], {}, self.version, self.version, force=False)
            stats.completed += applied.completed
            stats.reports += applied.reports
        idle = [s for s in self.slots if s.job is None]
        if not todo or not idle:
            return
        for i, slot in enumerate(idle):
            share = todo[i :: len(idle)]  # interleave: every worker gets old and new probes alike
            if not share:
                continue
            job = self._job(slot, share, [self.pool.budget(self.pool.get(p), extend_by) for p in share], force=False)
            t0 = time.perf_counter()
            self._start(slot, job)
            if slot.worker.synchronous:
                stats.blocked_s += time.perf_counter() - t0
            stats.submitted += len(share)

    def _job(self, slot: _Slot, ids: list[str], budgets: list[int], *, force: bool) -> RoundJob:
        probes = [self.pool.get(pid) for pid in ids]
        weights = self._weights if slot.loaded < self.version else None
        return RoundJob(ids, [p.prompt_ids + p.response_ids for p in probes], budgets, self.version, force=force,
                        weights=weights)

    def _start(self, slot: _Slot, job: RoundJob) -> None:
        slot.job, slot.future = job, slot.worker.submit(job)
        slot.loaded = max(slot.loaded, job.version)
