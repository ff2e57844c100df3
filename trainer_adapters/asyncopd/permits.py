"""Queue-depth capacity bound and sync gate of the AsyncOPD scheduler (AsyncOPD Appendix G).

The coordinator owns ``(tau + 1) * B`` permits. The prompt feeder takes one permit per training
request before submitting it to rollout; the train dispatcher gives permits back only after the
learner consumed the samples. So at most ``(tau + 1) * B`` training requests are ever unconsumed
(in rollout, teacher scoring, or waiting for the learner): ``tau`` is a capacity bound, never a
learner-side drop rule, and nothing is evicted for being stale.

The sync gate lives here because it is a rule about permits: while a weight sync is in progress,
permits released by the dispatcher are *held back* and become usable only when the gate opens, i.e.
after every rollout worker has received the new weights. Permits that were already available before
the sync stay usable (the paper gates the newly released ones only).

Every counter is instrumentation for tests and telemetry; the invariant
``available + deferred + outstanding == capacity`` holds after every call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class PermitStats:
    capacity: int
    available: int
    deferred: int  # released during a sync, not usable before the gate opens
    outstanding: int  # acquired and not yet released
    max_outstanding: int
    acquired_total: int
    released_total: int
    blocked_waits: int  # times an acquirer found no permit and had to wait
    gate_open: bool


class PermitPool:
    """Counting semaphore of ``capacity`` permits with a sync gate for released permits."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"permit capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._cond = threading.Condition()
        self._available = capacity
        self._deferred = 0
        self._outstanding = 0
        self._max_outstanding = 0
        self._acquired = 0
        self._released = 0
        self._blocked = 0
        self._gate_open = True
        self._waiting = 0

    def acquire(self, timeout: float | None = None) -> int | None:
        """Take one permit -> its ticket (``acquired_total`` after this acquisition, >= 1), or None when
        ``timeout`` seconds pass first (the caller re-checks stop). Tickets order acquisitions against
        ``stats()`` snapshots: a ticket above a snapshot's ``acquired_total`` was taken after it."""
        with self._cond:
            if self._available == 0:
                self._blocked += 1
                self._waiting += 1
                self._cond.notify_all()  # wakes wait_until_blocked
                try:
                    if not self._cond.wait_for(lambda: self._available > 0, timeout):
                        return None
                finally:
                    self._waiting -= 1
            self._available -= 1
            self._outstanding += 1
            self._acquired += 1
            self._max_outstanding = max(self._max_outstanding, self._outstanding)
            self._check()
            return self._acquired

    def release(self, n: int = 1, *, unused: bool = False) -> None:
        """Give back ``n`` permits. Consumed permits released while the gate is closed are deferred.

        ``unused``: the feeder returns a permit it took for a request that turned out to be a probe
        (probes hold no permit); it never carried a sample, so the gate does not apply.
        """
        if n < 0:
            raise ValueError(f"cannot release {n} permits")
        with self._cond:
            if n > self._outstanding:
                raise RuntimeError(f"releasing {n} permits but only {self._outstanding} are outstanding")
            self._outstanding -= n
            self._released += n
            if self._gate_open or unused:
                self._available += n
            else:
                self._deferred += n
            self._check()
            self._cond.notify_all()

    def close_gate(self) -> None:
        """A weight sync starts: permits released from now on wait for ``open_gate``."""
        with self._cond:
            self._gate_open = False

    def open_gate(self) -> None:
        """Every rollout worker has the new weights: deferred permits become usable."""
        with self._cond:
            self._gate_open = True
            self._available += self._deferred
            self._deferred = 0
            self._check()
            self._cond.notify_all()

    def wait_until_blocked(self, timeout: float) -> bool:
        """Block until an acquirer waits while no permit is available (tests: the bound is binding).

        Both conditions matter: a waiter that was just notified still counts as waiting until it runs.
        """
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting > 0 and self._available == 0, timeout)

    def stats(self) -> PermitStats:
        with self._cond:
            return PermitStats(self.capacity, self._available, self._deferred, self._outstanding,
                               self._max_outstanding, self._acquired, self._released, self._blocked,
                               self._gate_open)

    def _check(self) -> None:
        if self._available + self._deferred + self._outstanding != self.capacity:  # a bookkeeping bug
            raise RuntimeError(f"permit accounting broken: {self._available} + {self._deferred} + "
                               f"{self._outstanding} != {self.capacity}")
