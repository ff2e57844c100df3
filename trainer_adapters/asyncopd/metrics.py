"""AsyncOPD's systems metrics (Appendix G): training throughput, pipeline overlap, staleness.

- Throughput: response tokens used by learner updates ``j > warmup`` over ``t_J - t_warmup`` (the paper
  discards the first five updates).
- Overlap: merged busy time of teacher and train, plus the worker-normalized merged busy time of
  rollout, over the wall interval from the first to the last recorded stage interval. 1 is a serial
  schedule; 3 is every stage busy all the time.
- Staleness: learner version at consumption minus the behavior version of each consumed sample.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence


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


class Timeline:
    """Thread-safe busy intervals per stage lane: ``rollout/<worker>``, ``teacher``, ``train``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lanes: dict[str, list[tuple[float, float]]] = {}

    def record(self, lane: str, start: float, end: float) -> None:
        with self._lock:
            self.lanes.setdefault(lane, []).append((start, end))

    def busy(self) -> dict[str, float]:
        with self._lock:
            return {lane: merged_length(iv) for lane, iv in self.lanes.items()}

    def overlap(self) -> dict[str, float]:
        """``pipeline/overlap`` and the per-stage busy times it sums (seconds)."""
        with self._lock:
            lanes = {k: list(v) for k, v in self.lanes.items()}
        all_iv = [iv for ivs in lanes.values() for iv in ivs]
        if not all_iv:
            return {"pipeline/overlap": 0.0, "pipeline/wall_s": 0.0}
        wall = max(e for _, e in all_iv) - min(s for s, _ in all_iv)
        rollout = [merged_length(iv) for k, iv in lanes.items() if k.startswith("rollout/")]
        busy = {
            "rollout": sum(rollout) / len(rollout) if rollout else 0.0,
            "teacher": merged_length(lanes.get("teacher", [])),
            "train": merged_length(lanes.get("train", [])),
        }
        out = {f"pipeline/busy_{k}_s": v for k, v in busy.items()}
        out["pipeline/wall_s"] = wall
        out["pipeline/overlap"] = sum(busy.values()) / wall if wall > 0 else 0.0
        return out


class ThroughputMeter:
    """Response tokens per second of learner updates after ``warmup`` updates (paper: 5)."""

    def __init__(self, warmup: int = 5) -> None:
        self.warmup = warmup
        self.tokens: list[int] = []
        self.times: list[float] = []

    def record(self, n_tokens: int, t: float | None = None) -> None:
        self.tokens.append(int(n_tokens))
        self.times.append(time.perf_counter() if t is None else t)

    def throughput(self) -> float | None:
        """None until more than ``warmup`` updates are recorded."""
        w = self.warmup
        if len(self.tokens) <= w:
            return None
        if w == 0:
            raise ValueError("warmup must be >= 1: t_0 is the time after the first update")
        span = self.times[-1] - self.times[w - 1]
        return sum(self.tokens[w:]) / span if span > 0 else None


def staleness_summary(values: Sequence[int]) -> dict[str, object]:
    """Mean, max and histogram (``{staleness: count}``) of per-sample staleness."""
    if not values:
        return {"mean": 0.0, "max": 0, "histogram": {}}
    hist = Counter(int(v) for v in values)
    return {"mean": sum(values) / len(values), "max": int(max(values)),
            "histogram": {int(k): int(hist[k]) for k in sorted(hist)}}
