"""The AsyncOPD streaming scheduler core (AsyncOPD section 7, Appendix G), model-agnostic.

Stages run concurrently on threads and talk through FIFO queues (probes through their own lane, ``probe_lane.py``)::

    feeder --inbox--> rollout workers (N) --teacher_q--> teacher --learner_q--> train dispatcher

- **Feeder**: for every request takes one permit from a ``PermitPool`` of ``(tau + 1) * B``, asks the window
  hooks for its plan (cap ``max_tokens``, probe or not; a probe gives its permit back) and submits it. A checkpoint
  pauses it between two submissions (``paused``). It stops once it has submitted the training requests the
  remaining updates consume, ``(steps - start) * B`` (with ``groups``: the permits alone bound it).
- **Rollout workers** (``worker.py``): continuous batching over up to ``worker_batch`` active requests (probes
  first), one token per request per ``engine.step``. Between steps a worker installs pending weights (keep-mode:
  active requests keep their prefix; the next token records a version breakpoint) and acknowledges.
- **Teacher**: scores completed items in arrival order, in batches of what is queued (<= ``teacher_batch``).
- **Train dispatcher** (the thread that calls ``run``): training items in FIFO order, ``B`` at a time per learner
  update; before and after each update every scored probe goes to the hooks (never into a training batch).
  Then the weight sync: close the gate, release the ``B`` permits (deferred by the gate), push the learner's
  weights to every worker and wait for all acknowledgements, read the next window through the hooks, open the
  gate. Probe audits run after the gate opened, off the feeder's critical path.

**Lag** (``sync_every = L``): the weights go to the workers only after every ``L``-th update, so the
inference policy lags up to ``L - 1`` updates behind the learner; between two syncs the permits of an
update are released at once, no sync runs and the window stays (it is read at syncs only).
**Groups** (``groups``, OAPL): the feeder tags each request with its prompt group; a sync makes workers
drop training requests that already have tokens (``restart_on_sync``); the dispatcher trains on whole
groups sampled by the inference policy the workers hold now, ``B / samples_per_prompt`` per update, and
discards every other complete group (``groups.GroupBuffer``), returning its permits (Algorithm 1).

**Bounded state**: the scheduler keeps no per-item history. What an update consumed and which probes
completed since the previous one are handed out as an ``UpdateDelta`` (``last_update``, and every
``update_sinks`` callback); the ordered event log goes to ``event_sinks`` (tests check orderings on it)
and is folded online into the invariant checks; staleness is kept as counts per value.

Queues are FIFO and never evict stale items. Every blocking wait has a timeout and re-checks the stop
flag and the first error raised by any stage (re-raised by ``run``), so a broken stage never hangs a run.
Workers are threads on CPU; ``worker_factory`` is the seam for another backend (e.g. Ray actors).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from adwin.trainer_adapters.asyncopd.groups import GroupBuffer
from adwin.trainer_adapters.asyncopd.items import (
    Learner,
    PromptSpec,
    StreamingEngine,
    StreamItem,
    TeacherScorer,
)
from adwin.trainer_adapters.asyncopd.metrics import (
    EventChecks,
    LogEvent,
    ThroughputMeter,
    Timeline,
    staleness_summary,
)
from adwin.trainer_adapters.asyncopd.permits import PermitPool
from adwin.trainer_adapters.asyncopd.probe_lane import ProbeLane
from adwin.trainer_adapters.asyncopd.requests import Request, RequestStream
from adwin.trainer_adapters.asyncopd.worker import RolloutWorker
from adwin.trainer_adapters.hooks import WindowHooks

log = logging.getLogger(__name__)


class SchedulerStopped(Exception):
    """Raised inside a stage when the scheduler stops while the stage waits."""


@dataclass
class SchedulerConfig:
    batch_size: int  # B: training samples per learner update
    queue_depth: int = 4  # tau: permits = (tau + 1) * B
    samples_per_prompt: int = 1
    max_response_len: int = 256  # full horizon (probes)
    worker_batch: int = 8  # active requests per rollout worker
    teacher_batch: int = 8
    poll_s: float = 0.002  # how often idle stages re-check stop and sync requests
    wait_timeout_s: float = 120.0  # no progress for this long anywhere a stage waits: raise
    throughput_warmup: int = 5
    sync_every: int = 1  # L: weights go to the workers after every L-th update
    groups: bool = False  # OAPL: train on whole prompt groups of the current inference policy only

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.queue_depth < 0 or self.samples_per_prompt < 1 or self.sync_every < 1:
            raise ValueError("batch_size >= 1, queue_depth >= 0, samples_per_prompt >= 1 and sync_every >= 1 "
                             "are required")
        if self.groups and self.batch_size % self.samples_per_prompt:
            raise ValueError(f"groups: batch_size ({self.batch_size}) must be whole groups of samples_per_prompt "
                             f"({self.samples_per_prompt})")

    @property
    def restart_on_sync(self) -> bool:
        return self.groups


@dataclass
class UpdateDelta:
    """What one learner update consumed, and the probes completed since the previous update."""

    step: int
    version: int  # learner version the items were consumed at (updates applied before this one)
    items: list[StreamItem]
    probes: list[StreamItem] = field(default_factory=list)


__all__ = ["AsyncOPDScheduler", "LogEvent", "SchedulerConfig", "SchedulerStopped", "UpdateDelta"]


class AsyncOPDScheduler:
    """Runs the four stages for ``steps`` learner updates; see the module docstring."""

    def __init__(
        self,
        cfg: SchedulerConfig,
        prompts: Callable[[], PromptSpec],
        engines: list[StreamingEngine],
        teacher: TeacherScorer,
        learner: Learner,
        hooks: WindowHooks,
        *,
        worker_factory: Callable[[int, StreamingEngine, AsyncOPDScheduler], RolloutWorker] = RolloutWorker,
        event_sink: Callable[[LogEvent], None] | None = None,
        update_sink: Callable[[UpdateDelta], None] | None = None,
    ) -> None:
        if not engines:
            raise ValueError("at least one rollout engine is needed")
        self.cfg, self.teacher, self.learner, self.hooks = cfg, teacher, learner, hooks
        self.requests = RequestStream(prompts, cfg.samples_per_prompt)
        self._feed_lock = threading.Lock()
        self.permits = PermitPool((cfg.queue_depth + 1) * cfg.batch_size)
        self.inbox: queue.Queue[StreamItem] = queue.Queue()
        self.teacher_q: queue.Queue[StreamItem] = queue.Queue()
        self.learner_q: queue.Queue[StreamItem] = queue.Queue()
        self.stop = threading.Event()
        self.timeline = Timeline()
        self.throughput = ThroughputMeter(cfg.throughput_warmup)
        # bounded: the log goes to the sinks (called in log order, under the log lock) and into the checks
        self.event_sinks: list[Callable[[LogEvent], None]] = [event_sink] if event_sink else []
        self.update_sinks: list[Callable[[UpdateDelta], None]] = [update_sink] if update_sink else []
        self.checks = EventChecks(cfg.batch_size)
        self.staleness: Counter[int] = Counter()  # consumed samples per staleness value
        self.last_update: UpdateDelta | None = None
        self._probes_since: list[StreamItem] = []  # completed since the last update (handed out with it)
        self.probes = ProbeLane()
        self.n_breakpoint_samples = 0
        self.version = 0
        self.inference_version = 0  # the weights the rollout workers hold (pi_inf)
        self.window = 0
        self.groups = GroupBuffer() if cfg.groups else None
        self._submitted = 0
        self._training_submitted = 0
        self._training_quota: int | None = None  # set by ``run``: training requests its updates consume
        self._elock = threading.Lock()
        self._error: BaseException | None = None
        self.workers = [worker_factory(i, e, self) for i, e in enumerate(engines)]
        self._threads = [threading.Thread(target=self._guard, args=(self._feed,), name="asyncopd-feeder", daemon=True),
                         threading.Thread(target=self._guard, args=(self._score,), name="asyncopd-teacher", daemon=True)]

    # ------------------------------------------------------------------------------------ plumbing

    def _log(self, kind: str, version: int, **detail: Any) -> None:
        ev = LogEvent(kind, version, detail)
        with self._elock:
            self.checks.feed(ev)
            for sink in self.event_sinks:
                sink(ev)

    def _guard(self, fn: Callable[[], None]) -> None:
        """Thread body wrapper: the first error stops everything and is re-raised by ``run``."""
        try:
            fn()
        except SchedulerStopped:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the dispatcher thread
            log.exception("asyncopd stage %s failed", threading.current_thread().name)
            with self._elock:
                if self._error is None:
                    self._error = e
            self.stop.set()

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"an AsyncOPD stage failed: {self._error!r}") from self._error
        if self.stop.is_set():
            raise SchedulerStopped

    def _get(self, q: queue.Queue[StreamItem], what: str) -> StreamItem:
        """Blocking FIFO get that re-checks errors/stop and raises after ``wait_timeout_s`` idle."""
        deadline = time.monotonic() + self.cfg.wait_timeout_s
        while True:
            self._check()
            try:
                return q.get(timeout=self.cfg.poll_s * 5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {what} for {self.cfg.wait_timeout_s}s: the pipeline is stuck") from None

    # --------------------------------------------------------------------------------------- stages

    def _feed(self) -> None:
        training: Counter[int] = Counter()  # training requests of each open group so far
        while self._training_quota is None or self._training_submitted < self._training_quota:
            ticket = self.permits.acquire(timeout=self.cfg.poll_s * 5)
            while ticket is None:
                self._check()
                ticket = self.permits.acquire(timeout=self.cfg.poll_s * 5)
            with self._feed_lock:  # a checkpoint (``paused``) sees either all of a submission or none of it
                self._check()
                self._submit(self.requests.next(), ticket, training)

    def _submit(self, req: Request, ticket: int, training: Counter[int]) -> None:
        version, spec, rid = self.version, req.spec, req.request_id
        plan = self.hooks.plan_request(rid, spec.prompt_id, version)
        if plan.is_probe:
            self.permits.release(1, unused=True)  # probes hold no learner permit
        item = StreamItem(rid, req.seq, spec.prompt_id, list(spec.prompt_ids), spec.route, plan.window,
                          plan.max_tokens, plan.is_probe, version, group=-1 if plan.is_probe else req.group,
                          answer=spec.answer)
        training[req.group] += int(not plan.is_probe)
        self._training_submitted += int(not plan.is_probe)
        if req.closes_group:
            n_train = training.pop(req.group)
            if self.groups is not None:
                self.groups.expect(req.group, n_train)  # before the last request can complete
        self.requests.submitted(req, plan.is_probe)
        self._submitted += 1
        self._log("submit", version, seq=req.seq, request_id=rid, probe=plan.is_probe, ticket=ticket)
        (self.probes.submit if plan.is_probe else self.inbox.put)(item)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The feeder submits nothing inside (it may hold a permit); rollout, teacher and learner go on."""
        with self._feed_lock:
            yield

    def _score(self) -> None:
        while True:
            first = self._get(self.teacher_q, "completed rollout")
            batch = [first]
            while len(batch) < self.cfg.teacher_batch:
                try:
                    batch.append(self.teacher_q.get_nowait())
                except queue.Empty:
                    break
            t0 = time.perf_counter()
            self.teacher.score(batch)
            self.timeline.record("teacher", t0, time.perf_counter())
            for it in batch:
                (self.probes.scored if it.is_probe else self.learner_q.put)(it)

    # ---------------------------------------------------------------------------------- dispatcher

    def _after_update(self, version: int, consumed: int) -> dict[str, float]:
        """Sync the workers after every ``sync_every``-th update; in between only give the permits back."""
        if version % self.cfg.sync_every == 0:
            return self._sync(version, consumed)
        self.version = version  # the inference policy stays: nothing to wait for, no gate
        self._log("release", version, n=consumed)
        self.permits.release(consumed)
        return {}

    def _sync(self, version: int, consumed: int) -> dict[str, float]:
        """Weight sync after an update; the gate keeps released permits back until every worker has them."""
        self.permits.close_gate()
        ps = self.permits.stats()  # one snapshot: permits usable during the sync, and the tickets issued before it
        self._log("sync_start", version, available=ps.available, acquired=ps.acquired_total)
        self.permits.release(consumed)  # consumed by the update: deferred by the closed gate
        weights = self.learner.weights()
        for w in self.workers:
            w.request_sync(version, weights)
        deadline = time.monotonic() + self.cfg.wait_timeout_s
        for w in self.workers:
            while not w.synced.wait(self.cfg.poll_s * 5):
                self._check()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rollout worker {w.index} did not take weights {version}")
        self.inference_version = version
        decision = self.hooks.on_sync(version)
        self.window = decision.window
        self.probes.force(decision.force_complete)
        self.version = version  # the feeder stamps new requests with it
        # logged before the gate opens: no submit can precede it
        self._log("sync_done", version, window=decision.window, released=consumed)
        self.permits.open_gate()
        return decision.metrics

    def run(self, steps: int, on_step: Callable[[int, dict[str, float]], None] | None = None, *,
            start: int = 0) -> dict[str, Any]:
        """Run learner updates ``start .. steps - 1``, then stop every stage; returns the scheduler summary. From a
        checkpoint of ``start > 0`` updates the workers get the learner's weights (version ``start``) first."""
        if self.groups is None:  # FIFO: every submitted training request is consumed, so these are all it takes
            self._training_quota = max(0, steps - start) * self.cfg.batch_size
        if start:
            weights = self.learner.weights()
            for w in self.workers:  # their threads have not started: no request sees older weights
                w.engine.load_weights(weights, start)
            self.version = self.inference_version = start
        decision = self.hooks.on_sync(start)
        self.window = decision.window
        for w in self.workers:
            w.thread.start()
        for t in self._threads:
            t.start()
        updates = 0
        try:
            for step in range(start, steps):
                m = self._one_update(step, last=step == steps - 1)
                updates += 1
                if on_step is not None:
                    on_step(step, m)
        finally:
            self.stop.set()
            self._join()
        if self._error is not None:
            raise RuntimeError(f"an AsyncOPD stage failed: {self._error!r}") from self._error
        return self.summary(updates)

    def _hand_out_probes(self) -> None:
        """Every scored probe to the hooks now: its audit must not wait behind a training batch."""
        for it in self.probes.take_scored():
            self.requests.done(it.seq)
            self._probes_since.append(it)
            self.hooks.on_probe_complete(it, self.version)

    def _fifo_batch(self) -> list[StreamItem]:
        batch: list[StreamItem] = []
        while len(batch) < self.cfg.batch_size:
            it = self._get(self.learner_q, "scored sample")
            batch.append(it)
            self.requests.done(it.seq)
            self._log("consume", self.version, seq=it.seq)
        return batch

    def _group_batch(self, groups: GroupBuffer) -> list[StreamItem]:
        """``B / samples_per_prompt`` whole groups sampled by the workers' current weights; every other
        complete group is discarded and its permits go back (Algorithm 1's cleared buffer)."""
        n = self.cfg.batch_size // self.cfg.samples_per_prompt
        deadline = time.monotonic() + self.cfg.wait_timeout_s
        while True:
            ready, dropped = groups.take(n, self.inference_version)
            if dropped:
                self._log("discard", self.version, n=len(dropped), seqs=[it.seq for it in dropped])
                self.permits.release(len(dropped))
                self.requests.done(*(it.seq for it in dropped))
            if ready is not None:
                batch = [it for g in ready for it in g]
                self.requests.done(*(it.seq for it in batch))
                for it in batch:
                    self._log("consume", self.version, seq=it.seq)
                return batch
            self._check()
            try:
                it = self.learner_q.get(timeout=self.cfg.poll_s * 5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no complete group for {self.cfg.wait_timeout_s}s: the pipeline is stuck") \
                        from None
                continue
            deadline = time.monotonic() + self.cfg.wait_timeout_s
            groups.add(it)

    def _one_update(self, step: int, *, last: bool = False) -> dict[str, float]:
        self._hand_out_probes()
        batch = self._fifo_batch() if self.groups is None else self._group_batch(self.groups)
        self.hooks.offer_complete(batch, self.version)  # finished / full-length items may be complete probes
        stale = [self.version - it.behavior_version for it in batch]
        self.staleness.update(stale)
        self.n_breakpoint_samples += sum(1 for it in batch if it.version_breakpoints)
        version = self.version
        t0 = time.perf_counter()
        m = dict(self.learner.update(batch, self.version))
        t1 = time.perf_counter()
        self.timeline.record("train", t0, t1)
        n_tokens = sum(it.response_len for it in batch)
        self.throughput.record(n_tokens, t1)
        self._log("update", self.version + 1, tokens=n_tokens)
        m |= self._after_update(self.version + 1, len(batch))
        self._hand_out_probes()  # those completed during the update, at the version they are audited at
        delta = UpdateDelta(step, version, batch, self._probes_since)
        self._probes_since = []
        m |= self.hooks.poll_audit(self.version, last=last)
        ps = self.permits.stats()
        m |= {"async/staleness_mean": sum(stale) / len(stale), "async/staleness_max": float(max(stale)),
              "async/tokens": float(n_tokens), "async/permits_outstanding": float(ps.outstanding),
              "async/version": float(self.version), "window/current": float(self.window),
              "async/breakpoints": float(sum(len(it.version_breakpoints) for it in batch)),
              "async/inference_version": float(self.inference_version)}
        if self.groups is not None:  # cumulative: what Algorithm 1's cleared buffer cost so far
            m |= {"async/discarded_items": float(self.groups.discarded_items),
                  "async/discarded_tokens": float(self.groups.discarded_tokens)}
        throughput = self.throughput.throughput()  # None during the warm-up updates
        if throughput is not None:
            m["async/throughput_tokens_per_s"] = throughput
        m |= self.timeline.overlap()  # cumulative since the first stage interval
        self.last_update = delta
        for sink in self.update_sinks:
            sink(delta)
        self.hooks.on_step(step, m)
        return m

    def _join(self) -> None:
        alive = []
        for t in [*self._threads, *(w.thread for w in self.workers)]:
            if t.is_alive():
                t.join(timeout=max(self.cfg.wait_timeout_s, 1.0))
                if t.is_alive():
                    alive.append(t.name)
        if alive:
            raise RuntimeError(f"AsyncOPD threads did not stop: {alive}")

    def summary(self, updates: int) -> dict[str, Any]:
        """The run's totals; the per-update rows are what ``run``'s ``on_step`` received."""
        ps = self.permits.stats()
        return {
            "updates": updates,
            "version": self.version,
            "throughput_tokens_per_s": self.throughput.throughput(),
            "overlap": self.timeline.overlap(),
            "staleness": staleness_summary(self.staleness),
            "permits": {"capacity": ps.capacity, "max_outstanding": ps.max_outstanding,
                        "blocked_waits": ps.blocked_waits, "acquired": ps.acquired_total},
            "submitted": self._submitted,
            "probes_completed": self.probes.completed,
            "breakpoint_samples": self.n_breakpoint_samples,
            "sync_every": self.cfg.sync_every,
            "discarded": None if self.groups is None else {
                "groups": self.groups.discarded_groups, "items": self.groups.discarded_items,
                "tokens": self.groups.discarded_tokens},
            "checks": self.event_checks(),
        }

    def event_checks(self) -> dict[str, int]:
        """Invariants recomputed from the event log (``metrics.EventChecks``)."""
        with self._elock:
            return self.checks.result()
