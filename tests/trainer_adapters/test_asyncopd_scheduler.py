"""AsyncOPD scheduler core with stub stages: permits, sync gate, keep-mode, FIFO, probes, shutdown.

Orderings are checked on the scheduler's event log (through its sink) and on stage-side records, never on timings; every
wait is bounded (``WAIT``) and the scheduler's own ``wait_timeout_s`` turns a hang into an error.
"""

from __future__ import annotations

import queue
import threading
import tracemalloc

import pytest
from asyncopd_stubs import WAIT, Recorder, StubEngine, StubLearner, StubTeacher, prompt_source

from adwin.trainer_adapters.asyncopd.items import StreamItem
from adwin.trainer_adapters.asyncopd.permits import PermitPool
from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler, SchedulerConfig
from adwin.trainer_adapters.hooks import StaticWindowHooks, SyncDecision

pytestmark = pytest.mark.timeout(60)


def make(lengths, *, B=2, tau=1, workers=1, worker_batch=4, hold=None, on_load=None, learner=None,
         teacher=None, hooks=None, max_len=16, window=8):
    cfg = SchedulerConfig(batch_size=B, queue_depth=tau, max_response_len=max_len, worker_batch=worker_batch,
                          teacher_batch=3, wait_timeout_s=WAIT)
    engines = [StubEngine(hold, on_load) for _ in range(workers)]
    hooks = hooks or StaticWindowHooks(window, max_len)
    sched = AsyncOPDScheduler(cfg, prompt_source(lengths), engines, teacher or StubTeacher(),
                              learner or StubLearner(), hooks)
    return sched, engines, Recorder().attach(sched)


def outstanding_trace(sched: AsyncOPDScheduler, rec: Recorder) -> list[int]:
    """Training requests submitted minus permits given back by completed syncs, after every event."""
    B, n, trace = sched.cfg.batch_size, 0, []
    for ev in rec.events:
        if ev.kind == "submit" and not ev.detail["probe"]:
            n += 1
        elif ev.kind == "sync_done":
            n -= B
        trace.append(n)
    return trace


# ------------------------------------------------------------------------------------------- permits


def test_permit_pool_keeps_accounting_and_defers_releases_while_gate_closed() -> None:
    pool = PermitPool(3)
    assert all(pool.acquire(timeout=0) for _ in range(3))
    assert not pool.acquire(timeout=0)
    pool.close_gate()
    pool.release(2)
    s = pool.stats()
    assert (s.available, s.deferred, s.outstanding) == (0, 2, 1)
    assert not pool.acquire(timeout=0), "a permit released during a sync must not be usable before the gate opens"
    pool.open_gate()
    assert pool.acquire(timeout=0) and pool.stats().available == 1
    with pytest.raises(RuntimeError):
        pool.release(5)


def test_permit_bound_is_never_exceeded_and_binds() -> None:
    seen: dict[str, object] = {}

    def before_update(version: int) -> None:
        if version == 0:  # the learner is slow: the feeder must stall at exactly (tau + 1) * B
            assert sched.permits.wait_until_blocked(WAIT), "the feeder never blocked on the permit bound"
            seen["stats"] = sched.permits.stats()
            seen["submitted"] = sum(1 for e in list(rec.events) if e.kind == "submit")

    sched, _, rec = make([3], B=2, tau=1, workers=2, learner=StubLearner(before_update))
    out = sched.run(5)
    cap = (1 + 1) * 2
    s = seen["stats"]
    assert (s.outstanding, s.available) == (cap, 0)
    assert seen["submitted"] == cap
    assert out["permits"]["max_outstanding"] == cap
    assert max(outstanding_trace(sched, rec)) <= cap
    assert out["checks"] == {"max_unconsumed": cap, "gate_violations": 0}
    assert out["updates"] == 5 and out["version"] == 5


def test_probes_hold_no_permit_and_never_join_a_training_batch() -> None:
    hooks = StaticWindowHooks(4, 16, probe_every=3)
    learner = StubLearner()
    sched, _, rec = make([3, 5, 2, 6], B=2, tau=1, hooks=hooks, learner=learner)
    out = sched.run(6)
    assert hooks.completed, "no probe reached the hooks"
    assert all(it.is_probe and it.max_tokens == 16 for it in hooks.completed)
    probe_seqs = {it.seq for it in hooks.completed}
    assert not probe_seqs & {s for b in learner.batches for s in b}
    assert all(not it.is_probe and it.max_tokens == 4 for it in rec.consumed)
    assert max(outstanding_trace(sched, rec)) <= sched.permits.capacity
    assert out["probes_completed"] == len(hooks.completed)
    # a training request is capped by the window, a probe runs to EOS (its length) below the horizon
    assert all(it.response_len <= 4 for it in rec.consumed)
    assert {it.finish_reason for it in hooks.completed} <= {"eos", "horizon"}


# ----------------------------------------------------------------------------------------- sync gate


def test_sync_gate_keeps_released_permits_back_until_workers_have_weights() -> None:
    during: list[object] = []

    def on_load(version: int) -> None:
        # The dispatcher released B permits and is waiting for this worker. Without the gate the feeder
        # would take them, submit, and block again: wait until it blocks, then look at the permits. From sync 4 on
        # the feeder has submitted all 5 updates' requests and stopped: nothing to block.
        if version <= 3:
            assert sched.permits.wait_until_blocked(WAIT)
            during.append((version, sched.permits.stats()))

    sched, _, rec = make([3], B=2, tau=1, on_load=on_load)
    out = sched.run(5)
    assert out["checks"]["gate_violations"] == 0
    assert [v for v, _ in during] == [1, 2, 3]
    for _, s in during:
        assert s.deferred == 2 and s.available == 0 and not s.gate_open
    kinds = [(e.kind, e.version) for e in rec.events]
    for v in (1, 2, 3):  # during a sync only permits that were already available can be used
        start, done = kinds.index(("sync_start", v)), kinds.index(("sync_done", v))
        snap = rec.events[start].detail  # permits taken after the sync started came from those available
        late = [e for e in rec.events[start:done] if e.kind == "submit" and e.detail["ticket"] > snap["acquired"]]
        assert len(late) <= snap["available"]
        assert ("weights_received", v) in kinds[start:done]
    assert max(outstanding_trace(sched, rec)) <= sched.permits.capacity


def test_window_is_read_at_each_sync_boundary_and_stamped_on_requests() -> None:
    class Growing(StaticWindowHooks):
        def on_sync(self, version: int) -> SyncDecision:
            self.window = 2 + version
            return super().on_sync(version)

    hooks = Growing(2, 16)
    sched, _, rec = make([16], B=2, tau=0, hooks=hooks)
    sched.run(4)
    assert hooks.syncs == [0, 1, 2, 3, 4]
    for it in rec.consumed:  # tau = 0: every request is submitted after the previous sync
        assert it.window == 2 + it.submitted_version == it.max_tokens == it.response_len
        assert it.finish_reason == "window"


def test_only_the_runs_last_update_polls_the_audit_as_last() -> None:
    class Recording(StaticWindowHooks):
        def __init__(self) -> None:
            super().__init__(8, 16)
            self.lasts: list[bool] = []

        def poll_audit(self, version: int, *, last: bool = False) -> dict[str, float]:
            self.lasts.append(last)
            return super().poll_audit(version, last=last)

    hooks = Recording()
    sched, _, _ = make([16], B=2, tau=1, hooks=hooks)
    sched.run(3)
    assert hooks.lasts == [False, False, True]  # a decision budget's held batches are released after it


# ----------------------------------------------------------------------------------------- keep-mode


def test_keep_mode_keeps_prefix_and_records_version_breakpoint() -> None:
    def hold(it: StreamItem, version: int) -> bool:
        if it.seq == 2:  # the long request pauses at token 4 until the first sync
            return len(it.tokens) == 4 and version < 1
        return it.seq > 2 and version < 1  # later requests start only after the first sync

    sched, engines, rec = make([3, 3, 6, 3], B=2, tau=1, hold=hold)
    out = sched.run(3)
    long_item = engines[0].seen[2]
    assert long_item.tokens == [0, 1, 2, 3, 1004, 1005], "keep-mode must keep the prefix, not regenerate it"
    assert long_item.token_versions == [0, 0, 0, 0, 1, 1]
    assert long_item.version_breakpoints == [(4, 1)]
    assert long_item.behavior_version == 0 and long_item.newest_version == 1
    assert long_item in rec.consumed
    assert out["breakpoint_samples"] >= 1
    for it in rec.consumed:  # breakpoints agree with the version encoded in every token
        versions = [t // 1000 for t in it.tokens]
        assert versions == it.token_versions
        assert it.version_breakpoints == [(i, versions[i]) for i in range(1, len(versions))
                                          if versions[i] != versions[i - 1]]
    consumed_at = {seq: v for v, b in zip(sched.learner.versions, sched.learner.batches, strict=True) for seq in b}
    assert consumed_at[2] == 1 and out["staleness"]["max"] >= 1


def test_staleness_is_learner_version_minus_oldest_token_version() -> None:
    sched, _, rec = make([3], B=2, tau=3)
    out = sched.run(6)
    assert out["staleness"]["histogram"], "staleness must be recorded per consumed sample"
    assert sum(out["staleness"]["histogram"].values()) == len(rec.consumed) == 12
    assert out["staleness"]["max"] <= 3, "permits bound staleness by tau (in updates)"
    hist = out["staleness"]["histogram"]
    assert out["staleness"]["mean"] == pytest.approx(sum(k * v for k, v in hist.items()) / 12)


def test_forced_probe_completes_at_once_with_current_weights() -> None:
    holder: list[AsyncOPDScheduler] = []

    class Forcing(StaticWindowHooks):
        def on_sync(self, version: int) -> SyncDecision:
            d = super().on_sync(version)
            if version >= 1:  # the staleness limit: force every probe still in flight
                d.force_complete = holder[0].probes.in_flight()
            return d

    hooks = Forcing(3, 12, probe_every=4)

    def hold(it: StreamItem, version: int) -> bool:
        probe = engines[0].seen.get(3)
        if it.is_probe:  # stalls at 2 tokens until it is forced
            return len(it.tokens) == 2 and not it.force
        # the first training requests wait until the probe has its 2 tokens (no race on admission)
        return it.seq < 3 and (probe is None or len(probe.tokens) < 2)

    sched, engines, rec = make([3, 3, 3, 12], B=2, tau=1, hooks=hooks, hold=hold, worker_batch=8)
    holder.append(sched)
    sched.run(3)
    assert hooks.completed and hooks.completed[0].forced
    probe = hooks.completed[0]
    assert probe.seq == 3 and probe.response_len == 12 and probe.finish_reason == "eos"
    # it resumed only once forced, and ran to the end in one go under a single (current) version
    (idx, v), = probe.version_breakpoints
    assert idx == 2 and v >= 1 and set(probe.token_versions[2:]) == {v}
    assert probe.request_id not in sched.probes.in_flight()


# ------------------------------------------------------------------------------------ FIFO, shutdown


def test_queues_are_fifo_from_submission_to_learner() -> None:
    teacher, learner = StubTeacher(), StubLearner()
    sched, _, rec = make([2], B=3, tau=2, worker_batch=3, teacher=teacher, learner=learner)
    sched.run(5)
    flat = [s for b in learner.batches for s in b]
    assert flat == list(range(15))
    assert teacher.order == sorted(teacher.order)


@pytest.mark.parametrize("probe_every", [0, 3])
def test_a_run_submits_only_the_training_requests_its_updates_consume(probe_every: int) -> None:
    """The feeder stops at ``steps * B`` training requests: none is generated for no update (probes aside)."""

    def before_update(version: int) -> None:
        if version == 3:  # the last update: let an unbounded feeder take every permit it can first
            sched.permits.wait_until_blocked(1.0)

    hooks = StaticWindowHooks(4, 16, probe_every=probe_every)
    sched, _, rec = make([3, 5], B=2, tau=3, hooks=hooks, learner=StubLearner(before_update))
    out = sched.run(4)
    training = [e.detail["seq"] for e in rec.events if e.kind == "submit" and not e.detail["probe"]]
    assert sorted(training) == sorted(it.seq for it in rec.consumed)
    assert len(training) == 8 and out["submitted"] == 8 + sum(
        1 for e in rec.events if e.kind == "submit" and e.detail["probe"])


def test_run_stops_every_thread_and_leaves_no_waiter() -> None:
    before = set(threading.enumerate())
    sched, _, rec = make([3, 9], B=2, tau=2, workers=2)
    sched.run(3)
    assert not [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert sched.stop.is_set()


@pytest.mark.parametrize("where", ["learner", "teacher"])
def test_a_failing_stage_stops_the_run_with_its_error(where: str) -> None:
    before = set(threading.enumerate())
    kw = {"learner": StubLearner(fail_at=1)} if where == "learner" else {"teacher": StubTeacher(fail_after=3)}
    sched, _, rec = make([3], B=2, tau=1, **kw)
    with pytest.raises((RuntimeError, ValueError), match="diverged|teacher down"):
        sched.run(4)
    assert not [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_a_stuck_pipeline_times_out_instead_of_hanging() -> None:
    sched, _, rec = make([3], B=2, tau=1, hold=lambda it, v: True)
    sched.cfg.wait_timeout_s = 0.3
    with pytest.raises(TimeoutError, match="stuck"):
        sched.run(1)


# ------------------------------------------------------------------------------------- bounded state


class ForgetfulHooks(StaticWindowHooks):
    """Static hooks that keep nothing per probe or per sync (their bookkeeping is the hooks', not ours)."""

    def on_sync(self, version: int) -> SyncDecision:
        return SyncDecision(version, self.window)

    def on_probe_complete(self, item: StreamItem, version: int) -> None:
        return None


def retained_sizes(sched: AsyncOPDScheduler) -> dict[str, int]:
    """Length of every sized attribute of the scheduler and of its accumulators, by attribute path."""
    sizes: dict[str, int] = {}
    for owner, obj in [("sched", sched), ("timeline", sched.timeline), ("throughput", sched.throughput),
                       ("checks", sched.checks), ("permits", sched.permits), ("probes", sched.probes)]:
        for name, val in vars(obj).items():
            if isinstance(val, (list, dict, set, tuple, queue.Queue)) or hasattr(val, "__len__"):
                sizes[f"{owner}.{name}"] = val.qsize() if isinstance(val, queue.Queue) else len(val)
    return sizes


@pytest.mark.parametrize("probe_every", [0, 3])
def test_retained_state_does_not_grow_with_the_number_of_updates(probe_every: int) -> None:
    """What the scheduler keeps after 20 and after 200 updates is the same size: the per-update deltas
    went to the sinks, the staleness to counts per value, the event log into the online checks."""
    sizes, mem = {}, {}
    for steps in (20, 200):
        tracemalloc.start()
        cfg = SchedulerConfig(batch_size=2, queue_depth=2, max_response_len=16, worker_batch=4, teacher_batch=3,
                              wait_timeout_s=WAIT)
        sched = AsyncOPDScheduler(cfg, prompt_source([3, 5, 2, 6]), [StubEngine(record=False)],
                                  StubTeacher(record=False), StubLearner(record=False),
                                  ForgetfulHooks(4, 16, probe_every=probe_every))
        out = sched.run(steps)
        sched.last_update = None  # the one delta handed out last is as large as any update's: not growth
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert out["updates"] == steps and out["checks"]["gate_violations"] == 0
        assert sum(out["staleness"]["histogram"].values()) == 2 * steps
        assert out["probes_completed"] >= (steps // 4 if probe_every else 0)
        sizes[steps], mem[steps] = retained_sizes(sched), current
    cap = sched.permits.capacity + sched.cfg.worker_batch  # what can be in flight at once
    assert sizes[200].keys() == sizes[20].keys()
    assert all(n <= cap for n in sizes[200].values()), sizes[200]
    # ten times the updates (1,800 more items): far less than one item's worth of memory per extra update
    assert mem[200] - mem[20] < 180 * 200, mem
