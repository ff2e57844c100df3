"""Deterministic stub stages for the AsyncOPD scheduler tests (no model).

The stub engine emits one token per request per step; token ``v * 1000 + i`` encodes the engine
version ``v`` that produced token ``i``, so version breakpoints can be checked against ground truth.
A request's length is its first prompt id. ``hold(item, version)`` pauses a request (no token) while
true, which is how tests pin a request across a weight sync without any timing. ``record=False``: a stub
keeps nothing per item (the bounded-memory test measures what the scheduler alone retains).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from adwin.trainer_adapters.asyncopd.items import PromptSpec, StreamItem, TokenOut
from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler, LogEvent, UpdateDelta

WAIT = 10.0  # every wait in these tests is bounded


class StubEngine:
    def __init__(self, hold: Callable[[StreamItem, int], bool] | None = None,
                 on_load: Callable[[int], None] | None = None, *, record: bool = True) -> None:
        self.version = 0
        self.hold, self.on_load, self.record = hold, on_load, record
        self.loaded: list[int] = []
        self.seen: dict[int, StreamItem] = {}

    def load_weights(self, weights: Any, version: int) -> None:
        if self.on_load is not None:
            self.on_load(version)
        assert weights == ("weights", version), "the learner's snapshot of this version must arrive"
        self.version = version
        if self.record:
            self.loaded.append(version)

    def step(self, items: Sequence[StreamItem]) -> list[TokenOut | None]:
        outs: list[TokenOut | None] = []
        for it in items:
            if self.record:
                self.seen[it.seq] = it
            if self.hold is not None and self.hold(it, self.version):
                outs.append(None)
                continue
            i = len(it.tokens)
            outs.append(TokenOut(self.version * 1000 + i, -0.5, eos=i + 1 >= it.prompt_ids[0]))
        return outs


class StubTeacher:
    def __init__(self, fail_after: int | None = None, *, record: bool = True) -> None:
        self.order: list[int] = []
        self.fail_after, self.record = fail_after, record
        self.scored = 0

    def score(self, items: list[StreamItem]) -> None:
        for it in items:
            if self.fail_after is not None and self.scored >= self.fail_after:
                raise ValueError("teacher down")
            it.teacher_logprobs = [-1.0] * it.response_len
            self.scored += 1
            if self.record:
                self.order.append(it.seq)


class StubLearner:
    def __init__(self, before_update: Callable[[int], None] | None = None, fail_at: int | None = None, *,
                 record: bool = True) -> None:
        self.batches: list[list[int]] = []
        self.versions: list[int] = []
        self.before_update, self.fail_at, self.record = before_update, fail_at, record
        self._v = 0

    def update(self, items: list[StreamItem], version: int) -> dict[str, float]:
        if self.before_update is not None:
            self.before_update(version)
        if self.fail_at is not None and version >= self.fail_at:
            raise ValueError("learner diverged")
        assert all(it.teacher_logprobs is not None for it in items), "items reach the learner scored"
        if self.record:
            self.batches.append([it.seq for it in items])
            self.versions.append(version)
        self._v = version + 1
        return {"loss/total": float(version)}

    def weights(self) -> Any:
        return ("weights", self._v)


def prompt_source(lengths: Sequence[int]) -> Callable[[], PromptSpec]:
    """Prompts whose request lengths cycle through ``lengths`` (thread-safe; the feeder calls it)."""
    it = itertools.count()
    lock = threading.Lock()

    def nxt() -> PromptSpec:
        with lock:
            i = next(it)
        return PromptSpec(f"p{i}", [lengths[i % len(lengths)], 7, 7])

    return nxt


class Recorder:
    """What the scheduler hands out, kept by the test: the ordered event log, the consumed items and the
    completed probes (the scheduler itself keeps none of them)."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []
        self.consumed: list[StreamItem] = []
        self.probes: list[StreamItem] = []
        self._lock = threading.Lock()

    def attach(self, sched: AsyncOPDScheduler) -> Recorder:
        sched.event_sinks.append(self._event)
        sched.update_sinks.append(self._update)
        return self

    def _event(self, ev: LogEvent) -> None:
        with self._lock:
            self.events.append(ev)

    def _update(self, delta: UpdateDelta) -> None:
        self.consumed += delta.items
        self.probes += delta.probes
