"""The AsyncOPD streaming scheduler core (AsyncOPD section 7, Appendix G), model-agnostic.

Stages run concurrently on threads and talk through FIFO queues::

    feeder --inbox--> rollout workers (N) --teacher_q--> teacher --learner_q--> train dispatcher

- **Feeder**: for every request takes one permit from a ``PermitPool`` of ``(tau + 1) * B``, asks the
  window hooks for its plan (cap ``max_tokens``, probe or not; a probe gives its permit back) and
  submits it to the shared rollout inbox.
- **Rollout workers**: continuous batching over up to ``worker_batch`` active requests, one token per
  request per ``engine.step``. Between steps a worker installs pending weights (keep-mode: active
  requests keep their prefix; the next token records a version breakpoint) and acknowledges.
- **Teacher**: scores completed items in arrival order, in batches of what is queued (<= ``teacher_batch``).
- **Train dispatcher** (the thread that calls ``run``): takes items in FIFO order; probes go to the hooks
  (they never count toward a training batch), training items are consumed ``B`` at a time by one learner
  update. Then the weight sync: close the gate, release the ``B`` permits (deferred by the gate), push
  the learner's weights to every worker and wait for all acknowledgements, read the next window through
  the hooks, open the gate. Probe audits run after the gate opened, off the feeder's critical path.

Queues are FIFO and never evict stale items. Every blocking wait has a timeout and re-checks the stop
flag and the first error raised by any stage (re-raised by ``run``), so a broken stage never hangs a run.
Workers are threads on CPU; ``worker_factory`` is the seam for another backend (e.g. Ray actors).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from adwin.trainer_adapters.asyncopd.items import (
    Learner,
    PromptSpec,
    RolloutEngine,
    StreamItem,
    TeacherScorer,
)
from adwin.trainer_adapters.asyncopd.metrics import ThroughputMeter, Timeline, staleness_summary
from adwin.trainer_adapters.asyncopd.permits import PermitPool
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

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.queue_depth < 0 or self.samples_per_prompt < 1:
            raise ValueError("batch_size >= 1, queue_depth >= 0 and samples_per_prompt >= 1 are required")


@dataclass
class LogEvent:
    """One entry of the scheduler's ordered event log (tests check orderings, never timings)."""

    kind: str  # submit | sync_start | weights_received | sync_done | consume | update
    version: int
    detail: dict[str, Any] = field(default_factory=dict)


class RolloutWorker:
    """One rollout worker thread around its own ``RolloutEngine`` snapshot."""

    def __init__(self, index: int, engine: RolloutEngine, sched: AsyncOPDScheduler) -> None:
        self.index, self.engine, self.sched = index, engine, sched
        self.active: list[StreamItem] = []
        self._lock = threading.Lock()
        self._pending: tuple[int, Any] | None = None
        self.synced = threading.Event()
        self.synced.set()
        self.thread = threading.Thread(target=sched._guard, args=(self._loop,), name=f"asyncopd-rollout-{index}",
                                       daemon=True)

    def request_sync(self, version: int, weights: Any) -> None:
        with self._lock:
            self._pending = (version, weights)
            self.synced.clear()

    def _maybe_sync(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        version, weights = pending
        self.engine.load_weights(weights, version)  # keep-mode: self.active keeps its prefixes
        self.sched._log("weights_received", version, worker=self.index, in_flight=len(self.active))
        self.synced.set()

    def _admit(self) -> None:
        s = self.sched
        while len(self.active) < s.cfg.worker_batch:
            try:
                item = s.inbox.get(timeout=s.cfg.poll_s) if not self.active else s.inbox.get_nowait()
            except queue.Empty:
                return
            self.active.append(item)

    def _loop(self) -> None:
        s = self.sched
        while not s.stop.is_set():
            self._maybe_sync()
            self._admit()
            if not self.active:
                continue
            forced = [it for it in self.active if it.force]
            if forced:
                self._complete_forced(forced)
                continue
            progressed = self._step(self.active)
            if not progressed:
                s.stop.wait(s.cfg.poll_s)  # every request is held by the engine: don't spin

    def _step(self, items: list[StreamItem]) -> bool:
        s = self.sched
        t0 = time.perf_counter()
        outs = self.engine.step(items)
        s.timeline.record(f"rollout/{self.index}", t0, time.perf_counter())
        if len(outs) != len(items):
            raise RuntimeError(f"engine returned {len(outs)} outputs for {len(items)} requests")
        progressed = False
        for it, out in zip(items, outs, strict=True):
            if out is None:
                continue
            progressed = True
            it.append(out, self.engine.version)
            if out.eos:
                it.finish_reason = "eos"
            elif it.response_len >= it.max_tokens:
                it.finish_reason = "horizon" if it.max_tokens >= s.cfg.max_response_len else "window"
        done = [it for it in items if it.finish_reason is not None]
        if done:
            self.active = [it for it in self.active if it.finish_reason is None]
            for it in done:  # completion order, admission order within a step: FIFO downstream
                s.teacher_q.put(it)
        return progressed

    def _complete_forced(self, forced: list[StreamItem]) -> None:
        """Staleness limit reached: run these probes alone to EOS or the horizon with current weights."""
        for it in forced:
            it.forced = True
            it.max_tokens = self.sched.cfg.max_response_len
            while it.finish_reason is None and not self.sched.stop.is_set():
                self._maybe_sync()  # the dispatcher may be waiting for this worker's acknowledgement
                if not self._step([it]):
                    self.sched.stop.wait(self.sched.cfg.poll_s)
            self.active = [a for a in self.active if a is not it]


class AsyncOPDScheduler:
    """Runs the four stages for ``steps`` learner updates; see the module docstring."""

    def __init__(
        self,
        cfg: SchedulerConfig,
        prompts: Callable[[], PromptSpec],
        engines: list[RolloutEngine],
        teacher: TeacherScorer,
        learner: Learner,
        hooks: WindowHooks,
        *,
        worker_factory: Callable[[int, RolloutEngine, AsyncOPDScheduler], RolloutWorker] = RolloutWorker,
    ) -> None:
        if not engines:
            raise ValueError("at least one rollout engine is needed")
        self.cfg, self.prompts, self.teacher, self.learner, self.hooks = cfg, prompts, teacher, learner, hooks
        self.permits = PermitPool((cfg.queue_depth + 1) * cfg.batch_size)
        self.inbox: queue.Queue[StreamItem] = queue.Queue()
        self.teacher_q: queue.Queue[StreamItem] = queue.Queue()
        self.learner_q: queue.Queue[StreamItem] = queue.Queue()
        self.stop = threading.Event()
        self.timeline = Timeline()
        self.throughput = ThroughputMeter(cfg.throughput_warmup)
        self.events: list[LogEvent] = []
        self.staleness: list[int] = []
        self.consumed: list[StreamItem] = []
        self.probes_completed: list[StreamItem] = []
        self.version = 0
        self.window = 0
        self._submitted = 0
        self._elock = threading.Lock()
        self._error: BaseException | None = None
        self._inflight_probes: dict[str, StreamItem] = {}
        self.workers = [worker_factory(i, e, self) for i, e in enumerate(engines)]
        self._threads = [threading.Thread(target=self._guard, args=(self._feed,), name="asyncopd-feeder", daemon=True),
                         threading.Thread(target=self._guard, args=(self._score,), name="asyncopd-teacher", daemon=True)]

    # ------------------------------------------------------------------------------------ plumbing

    def _log(self, kind: str, version: int, **detail: Any) -> None:
        with self._elock:
            self.events.append(LogEvent(kind, version, detail))

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

    def _requests(self) -> Iterator[tuple[PromptSpec, int]]:
        while True:
            spec = self.prompts()
            for k in range(self.cfg.samples_per_prompt):
                yield spec, k

    def _feed(self) -> None:
        for spec, k in self._requests():
            ticket = self.permits.acquire(timeout=self.cfg.poll_s * 5)
            while ticket is None:
                self._check()
                ticket = self.permits.acquire(timeout=self.cfg.poll_s * 5)
            self._check()
            version = self.version
            seq = self._submitted
            rid = f"r{seq}-{spec.prompt_id}-{k}"
            plan = self.hooks.plan_request(rid, spec.prompt_id, version)
            if plan.is_probe:
                self.permits.release(1, unused=True)  # probes hold no learner permit
            item = StreamItem(rid, seq, spec.prompt_id, list(spec.prompt_ids), spec.route, plan.window,
                              plan.max_tokens, plan.is_probe, version)
            if plan.is_probe:
                with self._elock:
                    self._inflight_probes[rid] = item
            self._submitted += 1
            self._log("submit", version, seq=seq, request_id=rid, probe=plan.is_probe, ticket=ticket)
            self.inbox.put(item)

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
                self.learner_q.put(it)

    # ---------------------------------------------------------------------------------- dispatcher

    def _sync(self, version: int) -> dict[str, float]:
        """Weight sync after an update; the gate keeps released permits back until every worker has them."""
        self.permits.close_gate()
        ps = self.permits.stats()  # one snapshot: permits usable during the sync, and the tickets issued before it
        self._log("sync_start", version, available=ps.available, acquired=ps.acquired_total)
        self.permits.release(self.cfg.batch_size)  # consumed by the update: deferred by the closed gate
        weights = self.learner.weights()
        for w in self.workers:
            w.request_sync(version, weights)
        deadline = time.monotonic() + self.cfg.wait_timeout_s
        for w in self.workers:
            while not w.synced.wait(self.cfg.poll_s * 5):
                self._check()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rollout worker {w.index} did not take weights {version}")
        decision = self.hooks.on_sync(version)
        self.window = decision.window
        with self._elock:
            for pid in decision.force_complete:
                it = self._inflight_probes.get(pid)
                if it is not None:
                    it.force = True
        self.version = version  # the feeder stamps new requests with it
        self._log("sync_done", version, window=decision.window)  # logged first: no submit can precede it
        self.permits.open_gate()
        return decision.metrics

    def run(self, steps: int, on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, Any]:
        """Run ``steps`` learner updates, then stop every stage; returns the scheduler summary."""
        decision = self.hooks.on_sync(0)
        self.window = decision.window
        for w in self.workers:
            w.thread.start()
        for t in self._threads:
            t.start()
        history: list[dict[str, float]] = []
        try:
            for step in range(steps):
                m = self._one_update(step)
                history.append(m)
                if on_step is not None:
                    on_step(step, m)
        finally:
            self.stop.set()
            self._join()
        if self._error is not None:
            raise RuntimeError(f"an AsyncOPD stage failed: {self._error!r}") from self._error
        return self.summary(history)

    def _one_update(self, step: int) -> dict[str, float]:
        batch: list[StreamItem] = []
        while len(batch) < self.cfg.batch_size:
            it = self._get(self.learner_q, "scored sample")
            if it.is_probe:
                with self._elock:
                    self._inflight_probes.pop(it.request_id, None)
                self.probes_completed.append(it)
                self.hooks.on_probe_complete(it, self.version)
                continue
            batch.append(it)
            self._log("consume", self.version, seq=it.seq)
        self.hooks.offer_complete(batch, self.version)  # finished / full-length items may be complete probes
        stale = [self.version - it.behavior_version for it in batch]
        self.staleness += stale
        self.consumed += batch
        t0 = time.perf_counter()
        m = dict(self.learner.update(batch, self.version))
        t1 = time.perf_counter()
        self.timeline.record("train", t0, t1)
        n_tokens = sum(it.response_len for it in batch)
        self.throughput.record(n_tokens, t1)
        self._log("update", self.version + 1, tokens=n_tokens)
        m |= self._sync(self.version + 1)
        m |= self.hooks.poll_audit(self.version)
        ps = self.permits.stats()
        m |= {"async/staleness_mean": sum(stale) / len(stale), "async/staleness_max": float(max(stale)),
              "async/tokens": float(n_tokens), "async/permits_outstanding": float(ps.outstanding),
              "async/version": float(self.version), "window/current": float(self.window),
              "async/breakpoints": float(sum(len(it.version_breakpoints) for it in batch))}
        throughput = self.throughput.throughput()  # None during the warm-up updates
        if throughput is not None:
            m["async/throughput_tokens_per_s"] = throughput
        m |= self.timeline.overlap()  # cumulative since the first stage interval
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

    def summary(self, history: list[dict[str, float]]) -> dict[str, Any]:
        ps = self.permits.stats()
        return {
            "updates": len(history),
            "version": self.version,
            "throughput_tokens_per_s": self.throughput.throughput(),
            "overlap": self.timeline.overlap(),
            "staleness": staleness_summary(self.staleness),
            "permits": {"capacity": ps.capacity, "max_outstanding": ps.max_outstanding,
                        "blocked_waits": ps.blocked_waits, "acquired": ps.acquired_total},
            "submitted": self._submitted,
            "probes_completed": len(self.probes_completed),
            "breakpoint_samples": sum(1 for it in self.consumed if it.version_breakpoints),
            "checks": self.event_checks(),
            "history": history,
        }

    def event_checks(self) -> dict[str, int]:
        """Invariants recomputed from the event log (instrumentation, independent of the permit pool).

        ``max_unconsumed``: training requests submitted minus ``B`` per completed sync, maximized over the
        log; the capacity bound says it never exceeds ``(tau + 1) * B``. ``gate_violations``: syncs during
        which the feeder used more permits acquired after the sync started (tickets above the start
        snapshot) than were available then: a permit released by the sync was used before every worker
        had the new weights.
        """
        with self._elock:
            events = list(self.events)
        unconsumed = peak = violations = 0
        in_sync: list[int] | None = None  # [available at start, tickets issued before it, new tickets since]
        for ev in events:
            if ev.kind == "submit" and not ev.detail["probe"]:
                unconsumed += 1
                peak = max(peak, unconsumed)
            if ev.kind == "submit" and in_sync is not None and ev.detail["ticket"] > in_sync[1]:
                in_sync[2] += 1
            elif ev.kind == "sync_start":
                in_sync = [int(ev.detail["available"]), int(ev.detail["acquired"]), 0]
            elif ev.kind == "sync_done":
                unconsumed -= self.cfg.batch_size
                if in_sync is not None and in_sync[2] > in_sync[0]:
                    violations += 1
                in_sync = None
        return {"max_unconsumed": peak, "gate_violations": violations}
