"""AsyncOPD's probe lane: a probe is generated and handed to the hooks within a version or two of its submission,
never behind the training requests queued before it (stub stages, no timing in the assertions)."""

from __future__ import annotations

import pytest
from asyncopd_stubs import WAIT, Recorder, StubEngine, StubLearner, StubTeacher, prompt_source

from adwin.trainer_adapters.asyncopd.items import StreamItem
from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler, SchedulerConfig
from adwin.trainer_adapters.hooks import RequestPlan, StaticWindowHooks

pytestmark = pytest.mark.timeout(60)


class ProbeEachVersion(StaticWindowHooks):
    """The first request submitted at each version is a probe (as an offer budget per version spends itself);
    records the dispatcher's version when each probe is handed over."""

    def __init__(self, window: int, max_len: int) -> None:
        super().__init__(window, max_len)
        self._probed: set[int] = set()
        self.handed_at: dict[str, int] = {}

    def plan_request(self, request_id: str, prompt_id: str, version: int) -> RequestPlan:
        with self._lock:
            probe = version not in self._probed
            self._probed.add(version)
        return RequestPlan(self.max_len if probe else self.window, probe, self.window)

    def on_probe_complete(self, item: StreamItem, version: int) -> None:
        super().on_probe_complete(item, version)
        self.handed_at[item.request_id] = version


def test_probes_are_generated_and_handed_over_within_two_versions_of_submission() -> None:
    # tau = 6: up to 14 training requests queue ahead; one slot makes a queued probe wait for every one of them
    cfg = SchedulerConfig(batch_size=2, queue_depth=6, max_response_len=12, worker_batch=1, teacher_batch=3,
                          wait_timeout_s=WAIT)
    hooks = ProbeEachVersion(3, 12)
    sched = AsyncOPDScheduler(cfg, prompt_source([3]), [StubEngine()], StubTeacher(), StubLearner(), hooks)
    rec = Recorder().attach(sched)
    sched.run(12)
    submitted = sum(1 for e in rec.events if e.kind == "submit" and e.detail["probe"])
    early = hooks.completed  # the last training request is submitted by version 5: every probe completes
    assert submitted >= 5 and len(early) == submitted and {len(it.tokens) for it in early} == {3}
    first_token_age = [it.behavior_version - it.submitted_version for it in early]
    handed_age = [hooks.handed_at[it.request_id] - it.submitted_version for it in early]
    assert max(first_token_age) <= 1, first_token_age
    assert max(handed_age) <= 2, handed_age
    assert all(not it.is_probe for it in rec.consumed)
