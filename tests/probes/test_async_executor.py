"""The async probe executor with thread workers against the real controller: non-blocking rounds, weight
sync at step boundaries, version tags across syncs, forced completion at S (the one blocking wait), worker
death. Non-blocking is shown with events and counters: a gated extender holds its round until released."""

from __future__ import annotations

import threading

import pytest
from client_rounds import advance

from adwin.controller import Controller
from adwin.controller.schemas import OfferIn, PolicyIn, ProbeOfferItem, RunIn
from adwin.probes.async_executor import AdvanceStats, AsyncProbeExecutor
from adwin.probes.pool import Extension, Probe, ProbePool
from adwin.probes.workers import ThreadWorker

MAX_LEN = 12
WAIT = 10.0  # generous bound for an event that must happen; never a timing assertion


class GatedExtender:
    """Emits token 7 (logprob -1.0) up to the budget, but only once ``gate`` is set; records weight loads."""

    def __init__(self, fail_first: int = 0) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()  # a round started (and now waits on the gate)
        self.calls = 0
        self.loaded: list[object] = []
        self.fail_first = fail_first

    def __call__(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(WAIT), "the test never released the gate"
        if self.calls <= self.fail_first:
            raise RuntimeError("worker crashed")
        return Extension([[7] * n for n in budgets], [[-1.0] * n for n in budgets], [False] * len(budgets))

    def load(self, weights: object) -> None:
        self.loaded.append(weights)


def _setup(s: int = 3, p: int = 1, max_active: int = 32) -> tuple[Controller, str]:
    ctl = Controller()
    run = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[2, 4], max_len=MAX_LEN),
                                 probe_batch_size=p, staleness_limit=s, offers_per_step=4,
                                 max_active_probes=max_active))
    return ctl, run.run_id


def _offer(ctl: Controller, run_id: str, pool: ProbePool, step: int, ids: list[str]) -> None:
    offers = [ProbeOfferItem(sample_id=i, prompt_id=f"p-{i}", response_len=2, version=step) for i in ids]
    assert ctl.offer_probes(run_id, OfferIn(step=step, offers=offers)).accepted == ids
    for i in ids:
        pool.add(Probe(i, [1, 5], [9, 9], [step, step], [-0.1, -0.2], "default", submitted_step=step))


def _executor(pool: ProbePool, ext: GatedExtender, **kw: object) -> tuple[AsyncProbeExecutor, list[int]]:
    """Thread executor whose weight snapshots are the version numbers themselves (what the worker loads)."""
    published: list[int] = []
    holder: dict[str, AsyncProbeExecutor] = {}

    def snapshot() -> int:
        published.append(holder["ex"].version)
        return holder["ex"].version

    ex = AsyncProbeExecutor(pool, lambda: ThreadWorker(ext, ext.load), snapshot=snapshot, **kw)  # type: ignore[arg-type]
    holder["ex"] = ex
    return ex, published


def _drain(ex: AsyncProbeExecutor) -> None:
    for slot in ex.slots:
        if slot.future is not None:
            slot.future.exception(timeout=WAIT)  # wait for the round to end, whatever its outcome


def test_advance_returns_while_the_worker_is_still_extending() -> None:
    ctl, run_id = _setup(s=5)
    pool = ProbePool(MAX_LEN)
    ext = GatedExtender()
    ex, _ = _executor(pool, ext)
    _offer(ctl, run_id, pool, 0, ["a", "b"])
    stats = advance(ex, ctl, run_id, 1)  # returns although the round cannot finish before the gate opens
    assert ext.entered.wait(WAIT) and not ext.gate.is_set()
    assert stats.submitted == 2 and stats.in_flight == 2 and stats.blocked_s == 0.0 and not stats.reports
    assert pool.get("a").response_ids == [9, 9]  # nothing applied yet
    again = advance(ex, ctl, run_id, 2)  # the next step does not wait either, nor double-submit
    assert again.submitted == 0 and again.in_flight == 2 and ext.calls == 1
    ext.gate.set()
    _drain(ex)
    applied = advance(ex, ctl, run_id, 3)
    assert {r.probe_id for r in applied.reports if r.tokens_added} == {"a", "b"}
    # the round ran with the weights of version 1 (published before it was submitted) even though it
    # was applied at version 3; the next round starts from version 3
    assert applied.submitted == 2
    _drain(ex)
    advance(ex, ctl, run_id, 3)
    versions = pool.get("a").versions  # the next round (version 3) may already be back: only a prefix is fixed
    assert versions[:10] == [0, 0] + [1] * 4 + [3] * 4 and set(versions[10:]) <= {3}
    ex.close()


def test_workers_move_to_the_published_version_before_their_next_round() -> None:
    ctl, run_id = _setup(s=5)
    pool = ProbePool(MAX_LEN)
    ext = GatedExtender()
    ext.gate.set()
    ex, published = _executor(pool, ext)
    _offer(ctl, run_id, pool, 0, ["a"])
    for version in (1, 2):
        ex.publish(version)  # after optimizer step version-1
        advance(ex, ctl, run_id, version)
        _drain(ex)
    advance(ex, ctl, run_id, 2)  # collect the version-2 round without publishing anything new
    assert published == [1, 2]  # one snapshot per step boundary
    assert ext.loaded == [1, 2]  # each version loaded once, before the round that uses it
    probe = pool.get("a")
    assert probe.versions[:10] == [0, 0] + [1] * 4 + [2] * 4  # keep-mode: one probe, three versions
    assert probe.behavior_logprobs[:10] == [-0.1, -0.2] + [-1.0] * 8
    ex.close()


def test_forced_completion_at_s_is_the_one_wait_and_is_measured() -> None:
    s = 2
    ctl, run_id = _setup(s=s)
    pool = ProbePool(MAX_LEN)
    ext = GatedExtender()
    ex, _ = _executor(pool, ext)
    _offer(ctl, run_id, pool, 0, ["a"])
    advance(ex, ctl, run_id, 1)  # round in flight, gated
    assert ext.entered.wait(WAIT)
    returned = threading.Event()
    out: list[AdvanceStats] = []

    def step_at_s() -> None:
        out.append(advance(ex, ctl, run_id, s))  # staleness reaches S: must complete "a" before returning
        returned.set()

    t = threading.Thread(target=step_at_s)
    t.start()
    assert not returned.wait(0.3)  # still waiting on the gated round (the check cannot pass by timing luck)
    ext.gate.set()
    assert returned.wait(WAIT)
    t.join()
    stats = out[0]
    probe = pool.get("a")
    assert probe.finished and probe.forced and len(probe.response_ids) == MAX_LEN
    assert probe.staleness(s) == s and stats.forced == 1 and stats.blocked_s > 0.0
    assert probe.versions == [0, 0] + [1] * 4 + [s] * (MAX_LEN - 6)  # awaited round, then the forced one
    batch = ctl.next_probe_batch(run_id)
    assert batch is not None and batch.probe_ids == ["a"]
    ex.close()


def test_a_dead_thread_worker_is_replaced_and_its_probes_reissued_from_their_prefix() -> None:
    ctl, run_id = _setup(s=5)
    pool = ProbePool(MAX_LEN)
    ext = GatedExtender(fail_first=1)
    ext.gate.set()
    ex, _ = _executor(pool, ext)
    _offer(ctl, run_id, pool, 0, ["a", "b"])
    advance(ex, ctl, run_id, 1)
    _drain(ex)
    dead = ex.slots[0].worker
    stats = advance(ex, ctl, run_id, 2)  # collects the failure, replaces the worker, re-issues both probes
    assert not dead.alive() and ex.slots[0].worker is not dead
    assert (stats.restarts, stats.reissued, stats.lost) == (1, 2, 0)
    assert stats.submitted == 2  # already handed to the new worker from their recorded prefixes
    _drain(ex)
    advance(ex, ctl, run_id, 3)
    assert pool.get("a").versions[:6] == [0, 0] + [2] * 4  # the failed version-1 round left no trace
    assert ctl.telemetry(run_id).probes["dropped"] == 0
    ex.close()


@pytest.mark.parametrize(("policy", "fail_first", "max_reissues"), [("drop", 1, 2), ("reissue", 99, 1)])
def test_probes_of_failed_rounds_are_dropped_with_a_counter(policy: str, fail_first: int, max_reissues: int,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    ctl, run_id = _setup(s=10)
    pool = ProbePool(MAX_LEN)
    ext = GatedExtender(fail_first=fail_first)
    ext.gate.set()
    ex, _ = _executor(pool, ext, fault_policy=policy, max_reissues=max_reissues)
    _offer(ctl, run_id, pool, 0, ["a"])
    lost = 0
    for version in range(1, 5):
        lost += advance(ex, ctl, run_id, version).lost
        _drain(ex)
    assert lost == 1 and "a" not in pool
    assert ctl.telemetry(run_id).probes["dropped"] == 1
    assert any("dropped" in r.message for r in caplog.records)
    ex.close()


def test_two_workers_share_the_active_probes_without_overlap() -> None:
    ctl, run_id = _setup(s=5)
    pool = ProbePool(MAX_LEN)
    exts = [GatedExtender(), GatedExtender()]
    made = iter(exts)

    def spawn() -> ThreadWorker:
        ext = next(made)
        return ThreadWorker(ext, ext.load)

    ex = AsyncProbeExecutor(pool, spawn, workers=2, snapshot=lambda: "w")
    _offer(ctl, run_id, pool, 0, ["a", "b", "c"])
    stats = advance(ex, ctl, run_id, 1)
    assert all(e.entered.wait(WAIT) for e in exts)  # both rounds run at the same time
    held = [set(slot.job.probe_ids) for slot in ex.slots if slot.job is not None]
    assert stats.submitted == 3 and len(held) == 2 and held[0].isdisjoint(held[1]) and set.union(*held) == {"a", "b", "c"}
    for e in exts:
        e.gate.set()
    _drain(ex)
    advance(ex, ctl, run_id, 2)
    assert all(pool.get(pid).versions[:6] == [0, 0] + [1] * 4 for pid in "abc")
    assert all(e.loaded == ["w"] for e in exts)  # each replica loaded version 1 once
    ex.close()
