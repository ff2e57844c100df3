"""The probes' own lane through the AsyncOPD pipeline, beside the training FIFO.

A probe's age is counted in learner versions from its submission (the controller records the version it was
offered at), and it must be audited within the staleness limit ``S``. In the training FIFO a probe would wait
behind up to ``(tau + 1) * B`` training requests before its first token and behind every completed training
item before the dispatcher saw it, i.e. about ``tau`` updates of its ``S`` gone before it was generated. So probes
take this lane instead: rollout workers admit them ahead of training requests, the teacher stage hands them
back apart from the training items, and the dispatcher takes every scored probe at once between updates
(``take_scored``), never behind a training batch. Training requests keep their FIFO order; probes hold no learner
permit, so the lane changes no permit or staleness bound of training.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

from adwin.trainer_adapters.asyncopd.items import StreamItem


class ProbeLane:
    """Probes from submission to the dispatcher: admitted first, scored, handed over between updates."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[StreamItem] = queue.Queue()  # submitted, admitted before any training request
        self._scored: queue.Queue[StreamItem] = queue.Queue()  # scored by the teacher, for the dispatcher
        self._lock = threading.Lock()
        self._in_flight: dict[str, StreamItem] = {}  # submitted, not handed to the dispatcher yet
        self.completed = 0

    def submit(self, item: StreamItem) -> None:
        with self._lock:
            self._in_flight[item.request_id] = item
        self.inbox.put(item)

    def admit(self) -> StreamItem | None:
        """The next probe waiting for a rollout slot, or None."""
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return None

    def scored(self, item: StreamItem) -> None:
        self._scored.put(item)

    def force(self, request_ids: Iterable[str]) -> None:
        """Mark in-flight probes for completion now (the staleness limit); unknown ids are done already."""
        with self._lock:
            for rid in request_ids:
                it = self._in_flight.get(rid)
                if it is not None:
                    it.force = True

    def in_flight(self) -> list[str]:
        with self._lock:
            return list(self._in_flight)

    def take_scored(self) -> list[StreamItem]:
        """Every probe scored so far, in scoring order, without waiting."""
        out: list[StreamItem] = []
        while True:
            try:
                out.append(self._scored.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            for it in out:
                self._in_flight.pop(it.request_id, None)
            self.completed += len(out)
        return out
