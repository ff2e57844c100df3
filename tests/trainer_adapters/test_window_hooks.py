"""Window hooks against the in-process controller: windows at syncs, probe decisions, reports, audits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest

from adwin.audit.alignment import AuditResult
from adwin.audit.job import AuditJob, AuditOutcome, AuditSettings
from adwin.controller import Controller
from adwin.controller.schemas import AuditIn, PolicyIn, RunIn
from adwin.trainer_adapters.hooks import ControllerWindowHooks, StaticWindowHooks, WindowHooks


@dataclass
class Done:
    """A completed item as a scheduler stamps it (``StampedItem``), teacher-scored."""

    request_id: str
    prompt_id: str = "p"
    window: int = 8
    max_tokens: int = 16
    is_probe: bool = True
    finish_reason: str | None = "horizon"
    forced: bool = False
    version_breakpoints: list[tuple[int, int]] = field(default_factory=list)
    behavior_version: int = 0
    newest_version: int = 0
    response_len: int = 16
    prompt_ids: list[int] = field(default_factory=lambda: [1, 3])
    route: str = "default"

    @property
    def submitted_version(self) -> int:
        return self.behavior_version

    @property
    def tokens(self) -> list[int]:
        return [5] * self.response_len

    @property
    def logprobs(self) -> list[float]:
        return [-1.0] * self.response_len

    @property
    def teacher_logprobs(self) -> list[float]:
        return [-0.5] * self.response_len

    @property
    def token_versions(self) -> list[int]:
        n = self.response_len
        return [self.behavior_version] * (n - 1) + [self.newest_version] if n else []


@dataclass
class FakeAuditor:
    """An ``AuditRunner`` that returns fixed cosines (or raises) and records each job's probe rows."""

    cosines: dict[int, float]
    seen: list[int] = field(default_factory=list)
    error: Exception | None = None

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        self.seen.append(int(job.batch.input_ids.shape[0]))
        done: Future[AuditOutcome] = Future()
        if self.error is not None:
            done.set_exception(self.error)
        else:
            done.set_result(AuditOutcome(job.audit_id, job.version, AuditResult(list(self.cosines), self.cosines), {}))
        return done


def audited(hooks: ControllerWindowHooks, cosines: dict[int, float], **kw: object) -> FakeAuditor:
    """Give the hooks' probe client audit settings and a fake auditor (the real one: test_asyncopd_pipeline)."""
    fake = FakeAuditor(cosines, **kw)  # type: ignore[arg-type]
    hooks.client.settings = AuditSettings(candidates=list(cosines))
    hooks.client.auditor = fake
    return fake


def order_seen(hooks: ControllerWindowHooks) -> Callable[[], list[Sequence[str]]]:
    """The probe ids of each audited batch, in batch order (from the client's pool pops)."""
    batches: list[Sequence[str]] = []
    pop = hooks.client.pool.pop

    def spy(ids):  # type: ignore[no-untyped-def]
        ids = list(ids)
        batches.append(ids)
        return pop(ids)

    hooks.client.pool.pop = spy  # type: ignore[method-assign]
    return lambda: batches


def setup(**spec: object) -> tuple[Controller, str]:
    ctrl = Controller()
    run = RunIn(policy=PolicyIn(name="adwin", candidates=[4, 8], max_len=16), probe_batch_size=2,
                offers_per_step=2, staleness_limit=2, **spec)
    return ctrl, ctrl.register_run(run).run_id


def test_both_hooks_implement_the_protocol() -> None:
    ctrl, run = setup()
    assert isinstance(ControllerWindowHooks(ctrl, run, max_len=16), WindowHooks)
    assert isinstance(StaticWindowHooks(4, 16), WindowHooks)


def test_window_is_read_at_sync_and_caps_training_requests_while_probes_get_full_length() -> None:
    ctrl, run = setup()
    hooks = ControllerWindowHooks(ctrl, run, max_len=16)
    with pytest.raises(RuntimeError, match="on_sync"):
        hooks.plan_request("r0", "p", 0)
    d = hooks.on_sync(0)
    assert d.window == 8  # adwin starts at the largest candidate
    plans = [hooks.plan_request(f"r{i}", "p", 0) for i in range(4)]
    assert [p.is_probe for p in plans] == [True, True, False, False]  # offers_per_step = 2 per version
    assert [p.max_tokens for p in plans] == [16, 16, 8, 8]
    assert all(p.window == 8 for p in plans)
    hooks.on_sync(1)
    assert hooks.plan_request("r4", "p", 1).is_probe, "a new version opens a new offer budget"
    assert ctrl.telemetry(run).probes["active"] == 3


def test_max_active_probes_bounds_probes_in_flight() -> None:
    ctrl, run = setup(max_active_probes=3)
    hooks = ControllerWindowHooks(ctrl, run, max_len=16)
    probes = 0
    for v in range(4):
        hooks.on_sync(v)
        probes += sum(hooks.plan_request(f"r{v}-{i}", "p", v).is_probe for i in range(4))
    assert probes == 3
    # v0: 2 accepted; v1: 1 accepted + 1 declined; v2, v3: 1 declined each, then no more asking
    assert hooks.counts["offered"] == 6, "after a declined offer the hooks stop asking in that version"


def test_non_adwin_runs_never_offer_probes() -> None:
    ctrl, run = setup()
    hooks = ControllerWindowHooks(ctrl, run, max_len=16, probing=False)
    hooks.on_sync(0)
    assert not any(hooks.plan_request(f"r{i}", "p", 0).is_probe for i in range(5))
    assert ctrl.telemetry(run).probes.get("active", 0) == 0


def test_completed_probes_are_reported_audited_in_controller_order_and_decide_the_window() -> None:
    ctrl, run = setup()
    hooks = ControllerWindowHooks(ctrl, run, max_len=16)
    audited(hooks, {4: 0.9, 8: 0.99})
    seen = order_seen(hooks)
    hooks.on_sync(0)
    ids = [f"r{i}" for i in range(2)]
    assert all(hooks.plan_request(r, "p", 0).is_probe for r in ids)
    assert "audit/submitted" not in hooks.poll_audit(0), "no batch before P probes are complete"
    for r in reversed(ids):  # completion order differs from submission order
        hooks.on_probe_complete(Done(r, version_breakpoints=[(15, 1)], newest_version=1), 1)
    m = hooks.poll_audit(1)
    assert seen() == [ids], "the audit batch comes in the controller's submission order"
    assert m["audit/next_window"] == 4.0 and m["audit/micro_cos_4"] == pytest.approx(0.9)
    assert hooks.on_sync(2).window == 4
    tel = ctrl.telemetry(run)
    assert tel.probes["audited"] == 2 and len(tel.audits) == 1
    assert hooks.counts == {"offered": 2, "accepted": 2, "reported": 2, "audits": 1, "audited": 2, "conflicts": 0,
                            "expired": 0}


def test_probes_at_the_staleness_limit_are_listed_for_forced_completion() -> None:
    ctrl, run = setup()
    hooks = ControllerWindowHooks(ctrl, run, max_len=16)
    hooks.on_sync(0)
    hooks.plan_request("r0", "p", 0)
    assert hooks.on_sync(1).force_complete == []
    assert hooks.on_sync(2).force_complete == ["r0"]  # staleness 2 - 0 >= S = 2
    hooks.on_probe_complete(Done("r0", forced=True, newest_version=2), 2)
    assert ctrl.telemetry(run).probes["forced"] == 1


def test_step_metrics_reach_the_controller_only_when_asked() -> None:
    ctrl, run = setup()
    ControllerWindowHooks(ctrl, run, max_len=16).on_step(0, {"loss/total": 1.5})
    ControllerWindowHooks(ctrl, run, max_len=16, report_steps=False).on_step(1, {"loss/total": 2.5})
    steps = ctrl.telemetry(run).steps
    assert [s["step"] for s in steps] == [0] and steps[0]["metrics"]["loss/total"] == 1.5


def test_static_hooks_pick_every_kth_request_and_audit_in_batches() -> None:
    audits: list[int] = []
    hooks = StaticWindowHooks(4, 16, probe_every=2, probe_batch_size=2,
                              auditor=lambda items: audits.append(len(items)) or AuditIn(cosines={4: 1.0}))
    plans = [hooks.plan_request(f"r{i}", "p", 0) for i in range(4)]
    assert [p.is_probe for p in plans] == [False, True, False, True]
    hooks.on_probe_complete(Done("r1"), 0)
    assert hooks.poll_audit(0) == {}
    hooks.on_probe_complete(Done("r3"), 0)
    assert hooks.poll_audit(0) == {"audit/submitted": 1.0} and audits == [2]


def test_complete_probes_the_controller_expires_are_forgotten_not_held_forever() -> None:
    ctrl = Controller()
    run = ctrl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[4, 8], max_len=16), probe_batch_size=3,
                                  offers_per_step=1, staleness_limit=2)).run_id
    hooks = ControllerWindowHooks(ctrl, run, max_len=16)
    audited(hooks, {4: 0.9, 8: 0.99})
    hooks.on_sync(0)
    assert hooks.plan_request("r0", "p", 0).is_probe
    hooks.on_probe_complete(Done("r0"), 0)  # complete at version 0, but no batch of P=3 can form
    hooks.on_sync(1)
    assert "audit/submitted" not in hooks.poll_audit(1) and hooks.counts["expired"] == 0, "within S=2 it waits"
    hooks.on_sync(3)
    assert "audit/submitted" not in hooks.poll_audit(3)
    assert hooks.counts["expired"] == 1, "past S the controller expires it; the hooks let it go too"
    assert ctrl.telemetry(run).probes["expired"] == 1


def _training(rid: str, reason: str, n: int, window: int = 8) -> Done:
    return Done(rid, window=window, max_tokens=window, is_probe=False, finish_reason=reason, response_len=n)


@pytest.mark.parametrize(("offer_finished", "expected"), [("always", ["t-eos"]), ("at_horizon", [])])
def test_training_items_that_finished_inside_the_window_are_offered_per_the_offer_rule(offer_finished, expected) -> None:
    ctrl, run = setup(max_active_probes=8)
    hooks = ControllerWindowHooks(ctrl, run, max_len=16, offer_finished=offer_finished)
    hooks.on_sync(0)
    items = [_training("t-eos", "eos", 5), _training("t-cut", "window", 8)]  # a window-cut item is never offered
    assert hooks.offer_complete(items, 0) == len(expected)
    assert sorted(p.probe_id for p in hooks.client.pool.snapshot()) == expected
    assert ctrl.telemetry(run).probes.get("complete", 0) == len(expected)


def test_at_the_horizon_finished_and_full_length_training_items_fill_an_audit_batch() -> None:
    ctrl, run = setup(max_active_probes=8)
    hooks = ControllerWindowHooks(ctrl, run, max_len=16, offer_finished="at_horizon")
    audited(hooks, {4: 0.9, 8: 0.99})
    seen = order_seen(hooks)
    hooks.on_sync(0)
    items = [_training("h-eos", "eos", 5, window=16), _training("h-full", "horizon", 16, window=16)]
    assert hooks.offer_complete(items, 0) == 2
    assert hooks.poll_audit(0)["audit/next_window"] == 4.0 and seen() == [["h-eos", "h-full"]]


def test_hooks_refuse_an_unknown_offer_rule() -> None:
    ctrl, run = setup()
    with pytest.raises(ValueError, match="offer_finished"):
        ControllerWindowHooks(ctrl, run, max_len=16, offer_finished="sometimes")


def test_hooks_warn_once_when_most_probes_expire(caplog) -> None:
    ctrl = Controller()
    run = ctrl.register_run(RunIn(policy=PolicyIn(name="fixed", window=4, max_len=16), probe_batch_size=20,
                                  offers_per_step=8, staleness_limit=1)).run_id
    hooks = ControllerWindowHooks(ctrl, run, max_len=16, probing=True)
    audited(hooks, {4: 0.9})
    with caplog.at_level(logging.WARNING, logger="adwin.probes.client"):
        for v in (0, 3):
            hooks.on_sync(v)
            for i in range(8):
                assert hooks.plan_request(f"r{v}-{i}", "p", v).is_probe
                hooks.on_probe_complete(Done(f"r{v}-{i}", behavior_version=v, newest_version=v), v)
            hooks.poll_audit(v + 2)  # past S=1: no batch of 20 can take them
    assert hooks.counts["expired"] == 16
    warnings = [r.getMessage() for r in caplog.records if "expired before an audit batch" in r.getMessage()]
    assert len(warnings) == 1 and "probe_batch_size=20" in warnings[0]


def test_hooks_refuse_a_run_that_can_never_audit_before_the_pipeline_starts() -> None:
    from types import SimpleNamespace

    from adwin.controller.schemas import RunOut

    # a run stored before the controller checked feasibility (an older database): P=20, 1 offer x 3 steps
    spec = RunIn(run_id="old", policy=PolicyIn(candidates=[4, 8], max_len=16), probe_batch_size=20,
                 offers_per_step=1, staleness_limit=2).model_dump(mode="json")
    old = RunOut(run_id="old", name="old", created_at=0.0, policy_state={}, spec=spec)
    stub = SimpleNamespace(get_run=lambda run_id: old)
    with pytest.raises(ValueError, match="probe_batch_size=20 can never fill"):
        ControllerWindowHooks(stub, "old", max_len=16, resilient_controller=False)
    assert ControllerWindowHooks(stub, "old", max_len=16, probing=False, resilient_controller=False).probing is False


def test_a_non_finite_audit_keeps_the_window_and_any_other_refusal_propagates() -> None:
    from adwin.audit.errors import NonFiniteAuditError
    from adwin.controller.api import InvalidInput

    for error, cosines in ((NonFiniteAuditError("gram has non-finite entries"), {4: 0.9, 8: 0.99}),
                           (None, {4: float("nan"), 8: 0.99}), (None, {3: 0.9})):
        ctrl, run = setup()
        hooks = ControllerWindowHooks(ctrl, run, max_len=16)
        audited(hooks, cosines, error=error)
        hooks.on_sync(0)
        for r in ("a", "b"):
            assert hooks.plan_request(r, "p", 0).is_probe
            hooks.on_probe_complete(Done(r), 0)
        if 3 in cosines:  # an unknown candidate is a bug, not a refused audit
            with pytest.raises(InvalidInput):
                hooks.poll_audit(0)
            continue
        m = hooks.poll_audit(0)
        assert m["audit/rejected"] == 1.0 and "audit/next_window" not in m
        assert hooks.on_sync(1).window == 8
