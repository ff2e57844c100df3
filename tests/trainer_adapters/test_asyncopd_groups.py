"""The scheduler's lag (``sync_every``) and OAPL's prompt groups (``groups``), with stub stages.

Stub tokens encode the engine version that produced them (``version * 1000 + index``), so which inference
policy sampled a token is read from the token itself, not from the scheduler's own bookkeeping.
"""

from __future__ import annotations

import pytest
from asyncopd_stubs import WAIT, StubEngine, StubLearner, StubTeacher, prompt_source

from adwin.trainer_adapters.asyncopd.groups import GroupBuffer, group_version
from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut
from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler, LogEvent, SchedulerConfig
from adwin.trainer_adapters.hooks import StaticWindowHooks

pytestmark = pytest.mark.timeout(60)


class RecordingLearner(StubLearner):
    """Keeps the items of every batch and the inference version the scheduler held at each update."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[list[StreamItem]] = []
        self.sched: AsyncOPDScheduler | None = None
        self.inference: list[int] = []
        self.events: list[LogEvent] = []  # the scheduler's event log, through its sink

    def update(self, items: list[StreamItem], version: int) -> dict[str, float]:
        self.items.append(list(items))
        assert self.sched is not None
        self.inference.append(self.sched.inference_version)
        return super().update(items, version)


def make(*, B: int, G: int, tau: int, L: int, groups: bool, hold=None, hooks=None, lengths=(3, 4, 2)):
    cfg = SchedulerConfig(batch_size=B, queue_depth=tau, samples_per_prompt=G, max_response_len=16, worker_batch=4,
                          teacher_batch=3, wait_timeout_s=WAIT, sync_every=L, groups=groups)
    learner = RecordingLearner()
    engine = StubEngine(hold)
    events: list[LogEvent] = []
    sched = AsyncOPDScheduler(cfg, prompt_source(list(lengths)), [engine], StubTeacher(), learner,
                              hooks or StaticWindowHooks(8, 16), event_sink=events.append)
    learner.events = events
    learner.sched = sched
    return sched, engine, learner


def sampled_by(item: StreamItem) -> set[int]:
    return {tok // 1000 for tok in item.tokens}


def test_weights_reach_the_workers_every_L_updates_and_the_window_is_read_only_then() -> None:
    hooks = StaticWindowHooks(8, 16)
    sched, engine, learner = make(B=2, G=1, tau=1, L=3, groups=False, hooks=hooks)
    out = sched.run(7)
    assert engine.loaded == [3, 6], "the inference policy is synced after updates 3 and 6 only"
    assert hooks.syncs == [0, 3, 6]
    assert learner.inference == [0, 0, 0, 3, 3, 3, 6]
    for batch, inf in zip(learner.items, learner.inference, strict=True):
        # keep-mode (IS): an item may straddle a sync, but no token is newer than the workers' weights
        assert all(max(sampled_by(it)) <= inf for it in batch)
    assert out["sync_every"] == 3 and out["discarded"] is None
    cap = 2 * 2
    assert out["checks"]["max_unconsumed"] <= cap and out["checks"]["gate_violations"] == 0
    assert out["permits"]["max_outstanding"] <= cap


def test_groups_from_two_inference_policies_are_never_mixed_and_a_sync_clears_the_buffer() -> None:
    # request 5 samples one token under weights 0, then waits until the workers hold weights 2: the sync to
    # 2 cuts it, so its group (requests 4 and 5) must be thrown away, never trained on
    def hold(item: StreamItem, version: int) -> bool:
        return item.seq == 5 and len(item.tokens) == 1 and version < 2

    sched, engine, learner = make(B=4, G=2, tau=2, L=2, groups=True, hold=hold)
    out = sched.run(6)
    assert engine.loaded == [2, 4, 6]
    assert learner.inference == [0, 0, 2, 2, 4, 4]
    for batch, inf in zip(learner.items, learner.inference, strict=True):
        by_group: dict[int, list[StreamItem]] = {}
        for it in batch:
            by_group.setdefault(it.group, []).append(it)
        assert len(by_group) == 2 and all(len(g) == 2 for g in by_group.values()), "whole groups of G only"
        for members in by_group.values():
            assert {v for it in members for v in sampled_by(it)} == {inf}, \
                "every token of a group comes from the inference policy the workers hold at the update"
            assert len({it.prompt_id for it in members}) == 1
    trained = {it.seq for batch in learner.items for it in batch}
    assert not {4, 5} & trained, "the group cut by the sync is discarded whole"
    cut = engine.seen[5]
    assert cut.finish_reason == "stale" and sampled_by(cut) == {0}, \
        "the worker stops generating a cut request at the sync instead of continuing it under new weights"
    assert out["discarded"]["items"] >= 2 and out["discarded"]["groups"] >= 1
    cap = (2 + 1) * 4
    assert out["checks"]["max_unconsumed"] <= cap and out["checks"]["gate_violations"] == 0
    discards = [e for e in learner.events if e.kind == "discard"]
    assert discards and any(5 in e.detail["seqs"] for e in discards)


def test_a_probe_leaves_its_group_and_the_rest_of_the_group_is_still_trained() -> None:
    hooks = StaticWindowHooks(8, 16, probe_every=3)  # requests 3, 6, 9, ... are probes
    sched, _, learner = make(B=4, G=2, tau=1, L=1, groups=True, hooks=hooks)
    sched.run(3)
    consumed = [it for batch in learner.items for it in batch]
    assert consumed and not any(it.is_probe for it in consumed)
    assert any(len([o for o in consumed if o.group == it.group]) == 1 for it in consumed), \
        "a group that lost a member to a probe is trained with the members it has"
    assert all(len(batch) <= 4 for batch in learner.items)


# ------------------------------------------------------------------------------------------ GroupBuffer


def item(seq: int, group: int, versions: list[int], *, stale: bool = False) -> StreamItem:
    it = StreamItem(f"r{seq}", seq, f"p{group}", [1], "default", 8, 8, False, versions[0] if versions else 0,
                    group=group)
    for i, v in enumerate(versions):
        it.append(TokenOut(v * 1000 + i, -0.5), v)
    it.finish_reason = "stale" if stale else "eos"
    return it


def test_group_version_is_the_single_sampler_or_none() -> None:
    assert group_version([item(0, 0, [3, 3]), item(1, 0, [3])]) == 3
    assert group_version([item(0, 0, [3, 4])]) is None  # keep-mode breakpoint inside an item
    assert group_version([item(0, 0, [3]), item(1, 0, [4])]) is None  # two samplers in one group
    assert group_version([item(0, 0, [3]), item(1, 0, [3], stale=True)]) is None


def test_buffer_hands_out_complete_groups_of_the_current_policy_and_discards_the_rest() -> None:
    buf = GroupBuffer()
    for g in range(4):
        buf.expect(g, 2)
    buf.add(item(0, 0, [1, 1]))
    assert buf.take(1, 1) == (None, []), "an incomplete group waits"
    buf.add(item(1, 0, [1]))
    buf.add(item(2, 1, [0]))
    buf.add(item(3, 1, [0]))  # complete, clean, but sampled by the previous inference policy
    buf.add(item(4, 2, [1]))
    buf.add(item(5, 2, [0, 1]))  # straddles a sync
    buf.add(item(6, 3, [1]))
    groups, dropped = buf.take(2, 1)
    assert groups is None, "one clean group of version 1 is not two"
    assert sorted(it.seq for it in dropped) == [2, 3, 4, 5]
    buf.add(item(7, 3, [1]))
    groups, dropped = buf.take(2, 1)
    assert dropped == [] and [[it.seq for it in g] for g in groups] == [[0, 1], [6, 7]]
    assert buf.pending() == 0 and (buf.discarded_groups, buf.discarded_items) == (2, 4)
    with pytest.raises(ValueError, match="no prompt group"):
        buf.add(item(8, -1, [1]))
