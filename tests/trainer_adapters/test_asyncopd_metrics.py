"""AsyncOPD systems metrics (Appendix G): merged busy time, overlap, throughput after warm-up, staleness."""

from __future__ import annotations

import pytest

from adwin.trainer_adapters.asyncopd.metrics import (
    EventChecks,
    LogEvent,
    ThroughputMeter,
    Timeline,
    merged_length,
    staleness_summary,
)


def test_merged_length_counts_overlapping_intervals_once() -> None:
    assert merged_length([]) == 0.0
    assert merged_length([(0, 2), (1, 3), (5, 6)]) == 4.0
    assert merged_length([(5, 6), (0, 10)]) == 10.0


def test_overlap_sums_stage_busy_times_with_rollout_normalized_by_workers() -> None:
    tl = Timeline()
    tl.record("rollout/0", 0, 10)  # worker 0 busy all the time, worker 1 half: rollout counts 0.75
    tl.record("rollout/1", 0, 5)
    tl.record("teacher", 2, 4)
    tl.record("teacher", 3, 6)  # merged: 2..6
    tl.record("train", 6, 10)
    out = tl.overlap()
    assert out["pipeline/wall_s"] == 10
    assert out["pipeline/busy_rollout_s"] == 7.5 and out["pipeline/busy_teacher_s"] == 4
    assert out["pipeline/overlap"] == pytest.approx((7.5 + 4 + 4) / 10)


def test_serial_schedule_has_overlap_one() -> None:
    tl = Timeline()
    for i, lane in enumerate(["rollout/0", "teacher", "train"] * 2):
        tl.record(lane, i, i + 1)
    assert tl.overlap()["pipeline/overlap"] == pytest.approx(1.0)


def test_throughput_discards_warmup_updates() -> None:
    meter = ThroughputMeter(warmup=5)
    for j in range(1, 6):
        meter.record(1000, float(j))  # warm-up: never counted
    assert meter.throughput() is None
    meter.record(30, 7.0)
    meter.record(30, 8.0)
    assert meter.throughput() == pytest.approx(60 / (8.0 - 5.0))


def test_staleness_summary_has_mean_max_and_histogram() -> None:
    s = staleness_summary([0, 1, 1, 3])
    assert s == {"mean": 1.25, "max": 3, "histogram": {0: 1, 1: 2, 3: 1}}


def checks_of(events: list[LogEvent], batch_size: int = 1) -> dict[str, int]:
    checks = EventChecks(batch_size)
    for ev in events:
        checks.feed(ev)
    return checks.result()


def test_event_checks_catch_a_permit_used_during_a_sync() -> None:
    def sub(ticket: int) -> LogEvent:
        return LogEvent("submit", 0, {"probe": False, "ticket": ticket})

    start = LogEvent("sync_start", 1, {"available": 0, "acquired": 1})
    # ticket 2 was issued after the sync started while no permit was available: a released one was used
    assert checks_of([sub(1), start, sub(2), LogEvent("sync_done", 1)]) == {"max_unconsumed": 2, "gate_violations": 1}
    # ticket 1 was taken before the sync started and only logged during it: legitimate
    assert checks_of([start, sub(1), LogEvent("sync_done", 1), sub(2)]) == {"max_unconsumed": 1, "gate_violations": 0}
    # probes take a ticket and give it back unused at once: any number of them during a sync uses no permit
    probe = [LogEvent("submit", 0, {"probe": True, "ticket": t}) for t in (2, 3, 4)]
    assert checks_of([sub(1), start, *probe, LogEvent("sync_done", 1)]) == {"max_unconsumed": 1, "gate_violations": 0}
    assert checks_of([sub(1), start, *probe, sub(5), LogEvent("sync_done", 1)])["gate_violations"] == 1


def test_timeline_merges_each_lane_as_it_goes_and_refuses_out_of_order_starts() -> None:
    tl = Timeline()
    for s, e in [(0, 1), (0.5, 2), (3, 4), (3, 3.5), (6, 7)]:
        tl.record("train", s, e)
    assert tl.busy()["train"] == merged_length([(0, 1), (0.5, 2), (3, 4), (3, 3.5), (6, 7)])
    with pytest.raises(ValueError, match="start order"):
        tl.record("train", 5, 8)


def test_staleness_summary_of_counts_equals_that_of_the_values() -> None:
    values = [0, 2, 1, 1, 3, 0, 0]
    assert staleness_summary({0: 3, 1: 2, 2: 1, 3: 1}) == staleness_summary(values)
