"""Degraded mode of ``ResilientController`` over an in-process controller that can be switched off."""

from __future__ import annotations

from typing import Any

import pytest

from adwin.controller import Controller, ControllerUnavailable
from adwin.controller.schemas import (
    AuditIn,
    OfferIn,
    PolicyIn,
    ProbeOfferItem,
    ProbeReportIn,
    RunIn,
    StepMetricsIn,
)
from adwin.runtime.resilient_controller import ResilientController


class Flaky:
    """Forwards to ``inner`` unless ``down``; ``land_then_fail`` applies the call, then loses the answer."""

    def __init__(self, inner: Controller) -> None:
        self.inner, self.down, self.land_then_fail, self.calls = inner, False, False, 0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)

        def call(*a: Any, **k: Any) -> Any:
            self.calls += 1
            if self.down:
                raise ControllerUnavailable("connection refused")
            out = fn(*a, **k)
            if self.land_then_fail:
                raise ControllerUnavailable("read timeout after the write landed")
            return out
        return call


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _setup(probe_batch: int = 2) -> tuple[Controller, Flaky, ResilientController, Clock, str]:
    inner = Controller()
    flaky = Flaky(inner)
    clock = Clock()
    rc = ResilientController(flaky, backoff=1.0, max_backoff=4.0, clock=clock)
    run = rc.register_run(RunIn(run_id="r", policy=PolicyIn(candidates=[4, 8], max_len=16),
                                probe_batch_size=probe_batch, offers_per_step=4, lookahead=0)).run_id
    return inner, flaky, rc, clock, run


def _offer(step: int, n: int) -> OfferIn:
    return OfferIn(step=step, offers=[ProbeOfferItem(sample_id=f"s{step}-{i}", prompt_id=f"p{i}", response_len=2,
                                                     version=step) for i in range(n)])


def test_outage_keeps_last_window_buffers_writes_and_replays_them_once_in_order() -> None:
    inner, flaky, rc, clock, run = _setup()
    w0 = rc.get_window(run, 0)
    rc.report_step(run, StepMetricsIn(step=0, metrics={"loss/total": 1.0}), idempotency_key="k0")
    flaky.down = True
    w1 = rc.get_window(run, 1)
    assert (w1.window, w1.step) == (w0.window, 1)
    assert rc.metrics()["controller/degraded"] == 1.0
    for t in (1, 2):
        rc.report_step(run, StepMetricsIn(step=t, metrics={"loss/total": float(t)}), idempotency_key=f"k{t}")
    assert rc.probe_plan(run, 2).active == [] and rc.offer_probes(run, _offer(2, 3)).declined == 3
    calls = flaky.calls
    rc.get_window(run, 2)
    assert flaky.calls == calls, "not due for a retry: no network call"
    flaky.down = False
    clock.now += 1.0
    rc.get_window(run, 3)  # due: replays the backlog first, then answers live
    assert [s["step"] for s in inner.telemetry(run).steps] == [0, 1, 2]
    assert rc.replayed == 2 and not rc._pending and not rc.degraded
    assert rc.metrics()["controller/degraded"] == 1.0  # degraded at some point since the last read
    assert rc.metrics()["controller/degraded"] == 0.0


def test_write_that_landed_before_the_answer_was_lost_is_counted_once() -> None:
    inner, flaky, rc, clock, run = _setup()
    rc.offer_probes(run, _offer(0, 1))
    flaky.land_then_fail = True
    rc.report_probe(run, ProbeReportIn(probe_id="s0-0", step=1, tokens_added=5, version=1))  # no caller key
    flaky.land_then_fail = False
    clock.now += 1.0
    rc.get_window(run, 1)  # replay with the same generated key: the controller already has it
    assert inner.telemetry(run).probes["tokens_added"] == 5
    assert rc.replayed == 1


def test_lost_probe_batch_is_recovered_and_its_audit_replayed() -> None:
    inner, flaky, rc, clock, run = _setup(probe_batch=1)
    rc.get_window(run, 0)
    assert rc.offer_probes(run, _offer(0, 1)).accepted == ["s0-0"]
    rc.report_probe(run, ProbeReportIn(probe_id="s0-0", step=1, tokens_added=2, version=1, finished=True))
    flaky.land_then_fail = True
    assert rc.next_probe_batch(run, idempotency_key="b1") is None  # created by the controller, answer lost
    flaky.land_then_fail, flaky.down = False, True
    clock.now += 1.0
    assert rc.next_probe_batch(run, idempotency_key="b2") is None  # still down
    flaky.down = False
    clock.now += 10.0
    batch = rc.next_probe_batch(run, idempotency_key="b3")
    assert batch is not None and batch.probe_ids == ["s0-0"]
    flaky.down = True
    out = rc.submit_audit(run, batch.audit_id, AuditIn(cosines={4: 0.9, 8: 0.95}), idempotency_key="a1")
    assert out.state == "pending" and out.decision is None
    flaky.down = False
    assert rc.drain(timeout_s=30) == 0
    audits = inner.telemetry(run).audits
    assert [(a["audit_id"], a["state"]) for a in audits] == [(batch.audit_id, "decided")]
    assert rc.get_window(run, 2).window == 4  # the replayed audit decided the window


def test_replayed_write_refused_for_good_is_dropped_not_retried_forever() -> None:
    inner, flaky, rc, clock, run = _setup()
    flaky.down = True
    rc.report_step(run, StepMetricsIn(step=0, metrics={"x": 1.0}), idempotency_key="ok")
    rc.submit_audit(run, 99, AuditIn(cosines={4: 0.5}), idempotency_key="unknown-audit")
    rc.report_step(run, StepMetricsIn(step=1, metrics={"x": 2.0}), idempotency_key="ok2")
    flaky.down = False
    assert rc.drain(timeout_s=30) == 0
    assert rc.rejected == 1 and [s["step"] for s in inner.telemetry(run).steps] == [0, 1]


def test_drain_is_bounded_when_the_controller_never_returns() -> None:
    _, flaky, rc, clock, run = _setup()
    rc.get_window(run, 0)
    flaky.down = True
    rc.report_step(run, StepMetricsIn(step=0, metrics={"x": 1.0}))
    rc._clock = __import__("time").monotonic  # real time for the bounded wait
    assert rc.drain(timeout_s=0.3) == 1
    with pytest.raises(ControllerUnavailable):
        rc.telemetry(run)


def test_no_window_before_the_first_answer_fails_loudly() -> None:
    _, flaky, rc, _, run = _setup()
    flaky.down = True
    with pytest.raises(ControllerUnavailable, match="first window"):
        rc.get_window(run, 0)


def test_probes_that_missed_rounds_past_the_staleness_limit_are_dropped_and_reported() -> None:
    from adwin.probes.client import ProbeClient
    from adwin.probes.pool import Probe, ProbePool

    inner, _, rc, _, run = _setup()
    rc.offer_probes(run, _offer(0, 3))
    pool = ProbePool(16)
    pool.add(Probe("s0-0", [1], [5], [0], [-1.0], "default", submitted_step=0))  # unfinished, version 0
    pool.add(Probe("s0-1", [1], [5], [3], [-1.0], "default", submitted_step=0))  # fresh enough
    pool.add(Probe("s0-2", [1], [5], [0], [-1.0], "default", submitted_step=0, finished=True))  # waits for a batch
    client = ProbeClient(rc, run, pool, staleness_limit=2)
    assert client.drop_overstale(version=3) == 1
    assert "s0-0" not in pool and "s0-1" in pool and "s0-2" in pool
    assert inner.telemetry(run).probes["dropped"] == 1
    assert client.drop_overstale(version=3) == 0
