"""A rollout worker of the AsyncOPD scheduler: one thread around its own ``StreamingEngine`` snapshot.

Continuous batching over up to ``worker_batch`` active requests (probes admitted before training requests),
one token per request per ``engine.step``. Between steps the worker installs pending weights and acknowledges them: in keep-mode
(AsyncOPD) active requests keep their prefix and the next token records a version breakpoint; with
``restart_on_sync`` (OAPL) training requests that already have tokens leave as ``stale`` instead.
Forced probes (staleness limit) run alone to EOS or the horizon with the current weights.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from adwin.trainer_adapters.asyncopd.items import StreamingEngine, StreamItem

if TYPE_CHECKING:
    from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler


class RolloutWorker:
    """One rollout worker thread around its own ``StreamingEngine`` snapshot."""

    def __init__(self, index: int, engine: StreamingEngine, sched: AsyncOPDScheduler) -> None:
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
        if self.sched.cfg.restart_on_sync:
            self._drop_stale()
        self.sched._log("weights_received", version, worker=self.index, in_flight=len(self.active))
        self.synced.set()

    def _drop_stale(self) -> None:
        """OAPL (Algorithm 1): a sync clears what the old inference policy generated. A training request
        that has tokens would continue under other weights; it leaves as ``stale`` (straight to the
        dispatcher, which discards its group and returns its permit). Requests without tokens, and probes,
        stay: the new weights generate all of their tokens, or the audit corrects them."""
        stale = [it for it in self.active if it.tokens and not it.is_probe]
        if not stale:
            return
        self.active = [it for it in self.active if not (it.tokens and not it.is_probe)]
        for it in stale:
            it.finish_reason = "stale"
            self.sched.learner_q.put(it)

    def _admit(self) -> None:
        s = self.sched
        while len(self.active) < s.cfg.worker_batch:
            item = s.probes.admit()  # a probe's staleness runs from its submission: it never queues behind training
            if item is None:
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
