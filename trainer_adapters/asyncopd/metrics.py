"""AsyncOPD's systems metrics (Appendix G): training throughput, pipeline overlap, staleness.

Every accumulator here is bounded: it keeps running totals (or counts per value), never one entry per
update or per interval, so a run of any length holds the same state.

- Throughput: response tokens used by learner updates ``j > warmup`` over ``t_J - t_warmup`` (the paper
  discards the first five updates).
- Overlap: merged busy time of teacher and train, plus the worker-normalized merged busy time of
  rollout, over the wall interval from the first to the last recorded stage interval. 1 is a serial
  schedule; 3 is every stage busy all the time.
- Staleness: learner version at consumption minus the behavior version of each consumed sample.
- Event checks: the scheduler's permit and sync-gate invariants, recomputed online from its event log.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def merged_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``[start, end]`` intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s  # type: ignore[operator]
    return total


class _Lane:
    """Union of one lane's busy intervals, merged as they arrive (each lane is one thread: starts ascend)."""

    __slots__ = ("closed", "cur_s", "cur_e", "first")

    def __init__(self, start: float, end: float) -> None:
        self.closed, self.cur_s, self.cur_e, self.first = 0.0, start, end, start

    def add(self, start: float, end: float) -> None:
        if start < self.cur_s:
            raise ValueError(f"lane intervals must be recorded in start order: {start} < {self.cur_s}")
        if start > self.cur_e:
            self.closed += self.cur_e - self.cur_s
            self.cur_s, self.cur_e = start, end
        else:
            self.cur_e = max(self.cur_e, end)

    @property
    def busy(self) -> float:
        return self.closed + self.cur_e - self.cur_s


class Timeline:
    """Thread-safe busy time per stage lane: ``rollout/<worker>``, ``teacher``, ``train``.

    Each lane keeps its merged busy total and its open interval only (O(1) per lane)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lanes: dict[str, _Lane] = {}

    def record(self, lane: str, start: float, end: float) -> None:
        with self._lock:
            cur = self.lanes.get(lane)
            if cur is None:
                self.lanes[lane] = _Lane(start, end)
            else:
                cur.add(start, end)

    def busy(self) -> dict[str, float]:
        with self._lock:
            return {name: lane.busy for name, lane in self.lanes.items()}

    def overlap(self) -> dict[str, float]:
        """``pipeline/overlap`` and the per-stage busy times it sums (seconds)."""
        with self._lock:
            lanes = {k: (v.first, v.cur_e, v.busy) for k, v in self.lanes.items()}
        if not lanes:
            return {"pipeline/overlap": 0.0, "pipeline/wall_s": 0.0}
        wall = max(e for _, e, _ in lanes.values()) - min(s for s, _, _ in lanes.values())
        rollout = [b for k, (_, _, b) in lanes.items() if k.startswith("rollout/")]
        busy = {
            "rollout": sum(rollout) / len(rollout) if rollout else 0.0,
            "teacher": lanes["teacher"][2] if "teacher" in lanes else 0.0,
            "train": lanes["train"][2] if "train" in lanes else 0.0,
        }
        out = {f"pipeline/busy_{k}_s": v for k, v in busy.items()}
        out["pipeline/wall_s"] = wall
        out["pipeline/overlap"] = sum(busy.values()) / wall if wall > 0 else 0.0
        return out


class ThroughputMeter:
    """Response tokens per second of learner updates after ``warmup`` updates (paper: 5)."""

    def __init__(self, warmup: int = 5) -> None:
        self.warmup = warmup
        self.updates = 0
        self.tokens_after_warmup = 0
        self.t_warmup: float | None = None  # t_{warmup}: the time of the last warm-up update
        self.t_last: float | None = None

    def record(self, n_tokens: int, t: float | None = None) -> None:
        t = time.perf_counter() if t is None else t
        self.updates += 1
        if self.updates > self.warmup:
            self.tokens_after_warmup += int(n_tokens)
        elif self.updates == self.warmup:
            self.t_warmup = t
        self.t_last = t

    def throughput(self) -> float | None:
        """None until more than ``warmup`` updates are recorded."""
        if self.updates <= self.warmup:
            return None
        if self.warmup == 0:
            raise ValueError("warmup must be >= 1: t_0 is the time after the first update")
        assert self.t_warmup is not None and self.t_last is not None
        span = self.t_last - self.t_warmup
        return self.tokens_after_warmup / span if span > 0 else None


def staleness_summary(values: Iterable[int] | Mapping[int, int]) -> dict[str, object]:
    """Mean, max and histogram (``{staleness: count}``) of per-sample staleness, from the values or from
    their counts per value (what the scheduler keeps)."""
    hist = Counter({int(k): int(v) for k, v in values.items()}) if isinstance(values, Mapping) \
        else Counter(int(v) for v in values)
    n = sum(hist.values())
    if not n:
        return {"mean": 0.0, "max": 0, "histogram": {}}
    return {"mean": sum(k * c for k, c in hist.items()) / n, "max": int(max(hist)),
            "histogram": {int(k): int(hist[k]) for k in sorted(hist)}}


@dataclass
class LogEvent:
    """One entry of the scheduler's ordered event log (tests check orderings, never timings)."""

    kind: str  # submit | sync_start | weights_received | sync_done | release | discard | consume | update
    version: int
    detail: dict[str, Any] = field(default_factory=dict)


class EventChecks:
    """The scheduler's invariants, folded over its event log as it is written (O(1) state).

    ``max_unconsumed``: training requests submitted minus the permits given back (``B`` per completed
    sync, or what a ``release`` / ``discard`` event names), maximized over the log; the capacity bound says
    it never exceeds ``(tau + 1) * B``. ``gate_violations``: syncs during which the feeder used more permits
    acquired after the sync started (tickets above the start snapshot) for training requests than were
    available then: a permit released by the sync was used before every worker had the new weights. A
    probe's ticket is not counted: the feeder gives it back at once, unused, so it never holds one.
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.unconsumed = self.peak = self.violations = 0
        self._in_sync: list[int] | None = None  # [available at start, tickets issued before it, new tickets since]

    def feed(self, ev: LogEvent) -> None:
        if ev.kind == "submit" and not ev.detail["probe"]:
            self.unconsumed += 1
            self.peak = max(self.peak, self.unconsumed)
        if (ev.kind == "submit" and not ev.detail["probe"] and self._in_sync is not None
                and ev.detail["ticket"] > self._in_sync[1]):
            self._in_sync[2] += 1  # a probe's ticket went straight back to the available permits: not counted
        elif ev.kind == "sync_start":
            self._in_sync = [int(ev.detail["available"]), int(ev.detail["acquired"]), 0]
        elif ev.kind in ("release", "discard"):
            self.unconsumed -= int(ev.detail["n"])
        elif ev.kind == "sync_done":
            self.unconsumed -= int(ev.detail.get("released", self.batch_size))
            if self._in_sync is not None and self._in_sync[2] > self._in_sync[0]:
                self.violations += 1
            self._in_sync = None

    def result(self) -> dict[str, int]:
        return {"max_unconsumed": self.peak, "gate_violations": self.violations}
