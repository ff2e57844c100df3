"""The decision budget through the AsyncOPD hooks and the generic client (the one probe client under both):
fresh offers stop at the open round, held ready batches are audited as one pooled job (the others closed as
skipped into it), the learner update's training compute and ``decision/*`` flow through; the generic client
refuses a budget it cannot count."""

from __future__ import annotations

import pytest
from test_window_hooks import Done, FakeAuditor

from adwin.audit.budget import DecisionBudget, FlopsModel
from adwin.audit.job import AuditSettings
from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.trainer_adapters.generic import WindowClient
from adwin.trainer_adapters.hooks import ControllerWindowHooks


def _hooks(budget: float | None, *, offers: int = 4, staleness: int = 4) -> tuple[Controller, str, ControllerWindowHooks]:
    ctrl = Controller()
    run = ctrl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[4, 8], max_len=16), probe_batch_size=2,
                                  offers_per_step=offers, staleness_limit=staleness)).run_id
    hooks = ControllerWindowHooks(ctrl, run, max_len=16)
    hooks.client.settings = AuditSettings(candidates=[4, 8])
    hooks.client.budget = DecisionBudget(budget, FlopsModel(1000, 1000), probe_batch=2, staleness_limit=staleness,
                                         offer_cap=offers, prior_probe_tokens=18.0, prior_extension_tokens=16.0)
    return ctrl, run, hooks


def _fresh(hooks: ControllerWindowHooks, version: int, n: int) -> list[str]:
    hooks.on_sync(version)
    return [f"r{version}-{i}" for i in range(n) if hooks.plan_request(f"r{version}-{i}", "p", version).is_probe]


def test_fresh_offers_stop_at_the_open_round_and_a_free_budget_offers_every_version() -> None:
    _, _, tight = _hooks(0.01)
    _, _, free = _hooks(None)
    tight_offers = [len(_fresh(tight, v, 4)) for v in range(3)]
    free_offers = [len(_fresh(free, v, 4)) for v in range(3)]
    assert tight_offers[0] == 2 and sum(tight_offers) == 2  # the first round (P) at once, none paid for since
    assert free_offers == [4, 4, 4]


def test_held_ready_batches_are_audited_as_one_pooled_job_and_the_others_close_as_skipped_into_it() -> None:
    ctrl, run, hooks = _hooks(0.2, offers=8)
    fake = FakeAuditor({4: 0.9, 8: 1.0})
    hooks.client.auditor = fake
    b = hooks.client.budget
    first = _fresh(hooks, 0, 2)
    for pid in first:
        hooks.on_probe_complete(Done(pid), 0)
    hooks.poll_audit(1)  # the first decision takes the first ready batch
    b.rounds, b.round_size, b.round_left = 2, 6, 6  # a pooled round of 3 batches is open
    ids = [f"q{i}" for i in range(6)]
    hooks.on_sync(1)
    assert all(hooks.client.offer_fresh(pid, "p", 1) for pid in ids)
    for pid in ids[:4]:
        hooks.on_probe_complete(Done(pid, behavior_version=1, newest_version=1), 1)
    m = hooks.poll_audit(2)
    assert fake.seen == [2] and "audit/pooled_batches" not in m  # 2 of 3 batches in: held
    for pid in ids[4:]:
        hooks.on_probe_complete(Done(pid, behavior_version=1, newest_version=1), 2)
    m = hooks.poll_audit(2)
    assert fake.seen == [2, 6] and m["audit/pooled_batches"] == 3.0
    audits = ctrl.telemetry(run).audits
    pooled = [a for a in audits if "pooled_into" in (a["stats"] or {})]
    target = {int(a["stats"]["pooled_into"]) for a in pooled}
    assert len(pooled) == 2 and len(target) == 1
    assert next(a for a in audits if a["audit_id"] in target)["stats"]["probes"] == 6.0
    assert m["decision/decisions"] == 2.0 and b.probes_audited == 8


def _held_round(budget: float | None) -> tuple[Controller, str, ControllerWindowHooks, FakeAuditor]:
    """The first decision made, then 2 ready batches of a 3-batch pooled round held (with a budget)."""
    ctrl, run, hooks = _hooks(budget, offers=8)
    fake = FakeAuditor({4: 0.9, 8: 1.0})
    hooks.client.auditor = fake
    for pid in _fresh(hooks, 0, 2):
        hooks.on_probe_complete(Done(pid), 0)
    hooks.poll_audit(1)
    if budget is not None:
        b = hooks.client.budget
        b.rounds, b.round_size, b.round_left = 2, 6, 6
    hooks.on_sync(1)
    for pid in (ids := [f"q{i}" for i in range(4)]):
        assert hooks.client.offer_fresh(pid, "p", 1)
    for pid in ids:
        hooks.on_probe_complete(Done(pid, behavior_version=1, newest_version=1), 1)
    return ctrl, run, hooks, fake


def test_the_last_poll_releases_held_batches_unaudited_and_leaves_none_pending() -> None:
    ctrl, run, hooks, fake = _held_round(0.2)
    m = hooks.poll_audit(2, last=True)
    assert fake.seen == [2] and m["audit/released"] == 2.0  # no audit run for a decision no update would use
    audits = ctrl.telemetry(run).audits
    assert not [a for a in audits if a["state"] == "pending"]
    released = audits[-2:]
    assert all(a["kind"] == "skipped" and "pooled_into" not in a["stats"] for a in released)


def test_the_last_poll_without_a_budget_still_audits_every_ready_batch() -> None:
    hooks = _held_round(None)[2]
    fake = hooks.client.auditor
    m = hooks.poll_audit(2, last=True)
    assert "audit/released" not in m and fake.seen == [2, 2]


def test_closing_the_generic_client_releases_the_batches_its_budget_held() -> None:
    ctrl, run, hooks, fake = _held_round(0.2)
    client = WindowClient(ctrl, RunIn(policy=PolicyIn(candidates=[4, 8], max_len=16)))
    client.probe_client, client.last_step = hooks.client, 2  # the generic client around the held round's probes
    hooks.poll_audit(2)  # held: 2 of 3 batches of the round
    assert [a for a in ctrl.telemetry(run).audits if a["state"] == "pending"]
    assert client.close(timeout_s=1.0) == 0
    assert fake.seen == [2] and not [a for a in ctrl.telemetry(run).audits if a["state"] == "pending"]


def test_closing_the_generic_client_without_a_budget_starts_no_audit() -> None:
    ctrl, _, hooks, fake = _held_round(None)
    client = WindowClient(ctrl, RunIn(policy=PolicyIn(candidates=[4, 8], max_len=16)))
    client.probe_client, client.last_step = hooks.client, 2  # two batches ready, none audited yet
    assert client.close(timeout_s=1.0) == 0
    assert fake.seen == [2], "training is over: no decision left to steer"


def test_poll_audit_records_the_updates_training_compute_and_reports_decision_metrics() -> None:
    _, _, hooks = _hooks(0.1)
    hooks.on_sync(0)
    hooks.offer_complete([Done("t0", is_probe=False, finish_reason="eos", response_len=5)], 0)
    m = hooks.poll_audit(1)
    b = hooks.client.budget
    assert b.steps == 1 and b.train_flops == FlopsModel(1000, 1000).train(2 + 5)
    assert {"decision/flops_share", "decision/seconds_share", "decision/learner_share", "decision/budget"} <= set(m)
    assert b.learner_seconds > 0.0  # the poll ran on the learner's thread and was timed


def test_the_generic_client_refuses_a_budget_it_cannot_count_and_gates_offers_with_one_it_can() -> None:
    run = RunIn(policy=PolicyIn(candidates=[2, 4], max_len=8), probe_batch_size=2, offers_per_step=4)
    with pytest.raises(ValueError, match="model_params"):
        WindowClient(Controller(), run, audit=AuditConfig(budget=0.1))
    client = WindowClient(Controller(), run, audit=AuditConfig(budget=0.01), model_params=(1000, 1000))
    client.window(0)
    client.record_step(40, 0.1)
    ids = client.offer(0, [[1, 2]] * 4, [[3, 4]] * 4, version=0, window=2)
    assert len(ids) == 2  # the first round: P probes, however many the controller would take
    assert client.offer(1, [[1, 2]] * 4, [[3, 4]] * 4, version=1, window=2) == []  # nothing paid for since
    assert "decision/flops_share" in client.metrics()


@pytest.mark.timeout(240)
def test_an_asyncopd_run_under_a_tight_budget_offers_fewer_probes_and_logs_decision_metrics(tmp_path) -> None:
    from test_asyncopd_pipeline import tiny_cfg, tiny_parts

    from adwin.config import AsyncOPDSection
    from adwin.trainer_adapters.asyncopd.run import run_asyncopd

    opts = AsyncOPDSection(queue_depth=1, rollout_workers=1, worker_batch=8, teacher_batch=8, wait_timeout_s=60)
    outs = {b: run_asyncopd(tiny_cfg(tmp_path / str(b), steps=6, **{"audit.budget": b}), Controller(),
                            parts=tiny_parts(), options=opts) for b in (0.05, None)}
    tight, free = outs[0.05], outs[None]
    assert tight["probes"]["audits"] >= 1  # the first decision is never delayed
    assert tight["probes"]["accepted"] < free["probes"]["accepted"]
    assert all("decision/flops_share" in row for row in tight["logged"])
    assert tight["logged"][-1]["decision/budget"] == 0.05 and "decision/budget" not in free["logged"][-1]
