"""Degraded mode: a ``ControllerAPI`` wrapper that keeps a run training while its controller is away.

``ResilientController(inner)`` forwards every call. When ``inner`` raises ``ControllerUnavailable`` (the
``RemoteController`` raises it after its own retries), the wrapper enters *degraded mode*:

* ``get_window`` answers the last window the controller gave (training continues on it);
* telemetry writes (``report_step``, ``report_probe``, ``submit_audit``) are buffered in order with their
  idempotency keys (a key is generated when the caller gives none, so a replay reuses it);
* probing pauses: ``probe_plan`` is empty, ``offer_probes`` declines everything, ``next_probe_batch``
  returns None (a batch whose answer was lost in flight is asked for again with the same key on recovery
  and handed to the trainer then);
* the controller is retried with exponential backoff (``backoff`` doubling up to ``max_backoff`` seconds);
  in between, calls do not touch the network.

On the first successful retry the buffer is replayed in order before anything else; the service applies
each idempotency key once, so a write that had in fact landed before the outage is not counted twice. A
replayed write the service refuses for a non-transient reason (e.g. 422 for a NaN audit) is logged and
dropped. ``drain`` waits (bounded) for the buffer to empty at the end of a run. ``metrics()`` exposes
``controller/degraded`` (1 if the controller was unreachable at any time since the last call),
``controller/pending``, ``controller/replayed``, ``controller/outages``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adwin.controller.api import ControllerAPI, ControllerError, ControllerUnavailable
from adwin.controller.schemas import (
    AuditIn,
    AuditOut,
    OfferIn,
    OfferOut,
    ProbeBatchOut,
    ProbeOut,
    ProbePlanOut,
    ProbeReportIn,
    RunIn,
    RunOut,
    StepMetricsIn,
    TelemetryOut,
    WindowOut,
)

log = logging.getLogger(__name__)


@dataclass
class _Write:
    op: str  # ControllerAPI method name
    run_id: str
    args: tuple[Any, ...]
    key: str


class ResilientController:
    """``ControllerAPI`` over ``inner`` with degraded mode, buffered writes and in-order replay."""

    def __init__(self, inner: ControllerAPI, *, backoff: float = 0.5, max_backoff: float = 8.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.backoff, self.max_backoff, self._clock = backoff, max_backoff, clock
        self._lock = threading.RLock()
        self._pending: deque[_Write] = deque()
        self._lost_batches: deque[tuple[str, str]] = deque()  # (run_id, key) of batch requests cut off mid-flight
        self._ready_batches: dict[str, deque[ProbeBatchOut]] = {}
        self._windows: dict[str, WindowOut] = {}
        self._runs: dict[str, RunOut] = {}
        self.degraded = False
        self._was_degraded = False
        self._delay = backoff
        self._next_try = 0.0
        self.outages = self.replayed = self.rejected = self.buffered = 0

    # --- state machine ---------------------------------------------------------------------------

    def _down(self, err: Exception) -> None:
        if not self.degraded:
            self.outages += 1
            win = ", ".join(f"{r}: {w.window}" for r, w in self._windows.items()) or "none yet"
            log.warning("controller unavailable (%s): degraded mode, training continues on the last window "
                        "(%s); writes are buffered and retried with backoff", err, win)
            self._delay = self.backoff
        else:
            self._delay = min(self._delay * 2, self.max_backoff)
        self.degraded = self._was_degraded = True
        self._next_try = self._clock() + self._delay

    def _reachable(self) -> bool:
        """True when calls may go to ``inner``: up, or due for a retry and the backlog replayed."""
        if not self.degraded:
            return True
        if self._clock() < self._next_try:
            return False
        return self._replay()

    def _replay(self) -> bool:
        n = 0
        while self._pending:
            w = self._pending[0]
            try:
                getattr(self.inner, w.op)(w.run_id, *w.args, idempotency_key=w.key)
            except ControllerUnavailable as e:
                self._down(e)
                return False
            except ControllerError as e:  # refused for good (e.g. a NaN audit): retrying cannot help
                self.rejected += 1
                log.warning("controller refused replayed %s (%s): dropped", w.op, e)
            self._pending.popleft()
            n += 1
        while self._lost_batches:
            run_id, key = self._lost_batches[0]
            try:
                batch = self.inner.next_probe_batch(run_id, idempotency_key=key)
            except ControllerUnavailable as e:
                self._down(e)
                return False
            if batch is not None:
                self._ready_batches.setdefault(run_id, deque()).append(batch)
            self._lost_batches.popleft()
        self.replayed += n
        self.degraded = False
        log.warning("controller reachable again: replayed %d buffered write(s)", n)
        return True

    def _read(self, fn: Callable[[], Any], fallback: Callable[[], Any]) -> Any:
        with self._lock:
            if not self._reachable():
                return fallback()
            try:
                return fn()
            except ControllerUnavailable as e:
                self._down(e)
                return fallback()

    def _write(self, op: str, run_id: str, args: tuple[Any, ...], key: str | None, fallback: Callable[[], Any]) -> Any:
        key = key or uuid.uuid4().hex
        with self._lock:
            if self._reachable():
                try:
                    return getattr(self.inner, op)(run_id, *args, idempotency_key=key)
                except ControllerUnavailable as e:
                    self._down(e)
            self._pending.append(_Write(op, run_id, args, key))
            self.buffered += 1
            return fallback()

    # --- lifecycle -------------------------------------------------------------------------------

    def drain(self, timeout_s: float = 30.0) -> int:
        """Wait up to ``timeout_s`` for buffered writes to replay; returns how many are still pending."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self.degraded and time.monotonic() < deadline:
                time.sleep(max(0.0, min(self._next_try - self._clock(), deadline - time.monotonic())))
                self._next_try = min(self._next_try, self._clock())  # the backoff has passed in real time
                self._reachable()
            left = len(self._pending) + len(self._lost_batches)
        if left:
            log.error("controller still unavailable after %.0f s: %d write(s) not delivered", timeout_s, left)
        return left

    def metrics(self) -> dict[str, float]:
        with self._lock:
            out = {"controller/degraded": float(self.degraded or self._was_degraded),
                   "controller/pending": float(len(self._pending)), "controller/replayed": float(self.replayed),
                   "controller/outages": float(self.outages)}
            self._was_degraded = self.degraded
            return out

    # --- ControllerAPI ---------------------------------------------------------------------------

    def register_run(self, spec: RunIn, *, idempotency_key: str | None = None) -> RunOut:
        out = self.inner.register_run(spec, idempotency_key=idempotency_key)  # no run without a controller
        self._runs[out.run_id] = out
        return out

    def get_run(self, run_id: str) -> RunOut:
        def cached() -> RunOut:
            if run_id not in self._runs:
                raise ControllerUnavailable(f"controller unavailable and run {run_id!r} unknown here")
            return self._runs[run_id]

        out = self._read(lambda: self.inner.get_run(run_id), cached)
        self._runs[run_id] = out
        return out

    def list_runs(self) -> list[RunOut]:
        return self._read(self.inner.list_runs, lambda: list(self._runs.values()))

    def get_window(self, run_id: str, step: int) -> WindowOut:
        def last() -> WindowOut:
            if run_id not in self._windows:
                raise ControllerUnavailable(f"controller unavailable before run {run_id!r} got its first window")
            return self._windows[run_id].model_copy(update={"step": step})

        out = self._read(lambda: self.inner.get_window(run_id, step), last)
        self._windows[run_id] = out
        return out

    def offer_probes(self, run_id: str, offer: OfferIn, *, idempotency_key: str | None = None) -> OfferOut:
        # Not buffered: the answer (which prefixes became probes) is needed now. Probes the controller took
        # in a cut-off request show up in a later plan and the pool reports them dropped.
        def decline() -> OfferOut:
            return OfferOut(accepted=[], declined=len(offer.offers))

        return self._read(lambda: self.inner.offer_probes(run_id, offer, idempotency_key=idempotency_key), decline)

    def probe_plan(self, run_id: str, step: int) -> ProbePlanOut:
        return self._read(lambda: self.inner.probe_plan(run_id, step),
                          lambda: ProbePlanOut(step=step, extend_by=0, active=[], force_complete=[]))

    def report_probe(self, run_id: str, report: ProbeReportIn, *, idempotency_key: str | None = None) -> ProbeOut:
        state = "dropped" if report.dropped else "complete" if report.finished else "active"

        def placeholder() -> ProbeOut:  # the trainer does not read it; the real answer comes with the replay
            return ProbeOut(probe_id=report.probe_id, state=state, tokens=report.tokens_added,
                            oldest_version=report.version, newest_version=report.version,
                            submitted_step=report.step, forced=report.forced)

        return self._write("report_probe", run_id, (report,), idempotency_key, placeholder)

    def next_probe_batch(
        self, run_id: str, *, step: int | None = None, idempotency_key: str | None = None
    ) -> ProbeBatchOut | None:
        key = idempotency_key or uuid.uuid4().hex
        with self._lock:
            reachable = self._reachable()  # a recovery may hand back a batch whose answer was lost
            ready = self._ready_batches.get(run_id)
            if ready:
                return ready.popleft()
            if not reachable:
                return None
            try:
                return self.inner.next_probe_batch(run_id, step=step, idempotency_key=key)
            except ControllerUnavailable as e:
                self._down(e)
                self._lost_batches.append((run_id, key))  # it may have been created: ask again on recovery
                return None

    def submit_audit(self, run_id: str, audit_id: int, audit: AuditIn, *,
                     idempotency_key: str | None = None) -> AuditOut:
        return self._write("submit_audit", run_id, (audit_id, audit), idempotency_key,
                           lambda: AuditOut(audit_id=audit_id, state="pending", ranks_received=0))

    def report_step(self, run_id: str, metrics: StepMetricsIn, *, idempotency_key: str | None = None) -> None:
        self._write("report_step", run_id, (metrics,), idempotency_key, lambda: None)

    def telemetry(self, run_id: str, since_step: int = 0) -> TelemetryOut:
        def unavailable() -> TelemetryOut:
            raise ControllerUnavailable("controller unavailable: telemetry cannot be read")

        return self._read(lambda: self.inner.telemetry(run_id, since_step), unavailable)


def controller_metrics(controller: Any) -> dict[str, float]:
    """``controller/*`` gauges of a ``ResilientController``; nothing for other controllers."""
    fn = getattr(controller, "metrics", None)
    return fn() if callable(fn) else {}


def drain_controller(controller: Any, timeout_s: float = 30.0) -> int:
    fn = getattr(controller, "drain", None)
    return int(fn(timeout_s)) if callable(fn) else 0
