"""``audit.budget`` in the sync trainer: a tight budget offers and audits less, keeps ``decision/flops_share`` within
one decision of the budget, pools ready batches into one audit (the controller sees the others closed as skipped
into it), does not delay the first decision and releases what it holds at the last step unaudited;
``audit.budget: null`` audits every ready batch on its own, the last step's too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop import trainer as trainer_module
from adwin.loop.probing import ProbeSide
from adwin.loop.trainer import train

# S=4 and 4 offers per step let a decision pool up to 4 batches of P=2 (``pool_limit``)
SHAPE = {"probes.backend": "inline", "probes.staleness_limit": 4, "probes.offers_per_step": 4, "eval.every": 0}


def _run(tmp: Path, budget: float | None, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Controller, ProbeSide]:
    sides: list[ProbeSide] = []
    opened = trainer_module.open_probe_side

    def keep(*a: Any, **k: Any) -> ProbeSide:
        sides.append(opened(*a, **k))
        return sides[-1]

    monkeypatch.setattr(trainer_module, "open_probe_side", keep)
    cfg = load_config(None, tiny_overrides(tmp, steps=16, name=f"b{budget}", **SHAPE, **{"audit.budget": budget}))
    controller = Controller()
    return train(cfg, controller), controller, sides[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    mp = pytest.MonkeyPatch()
    try:
        yield {b: _run(tmp_path_factory.mktemp(str(b)), b, mp) for b in (0.3, None)}
    finally:
        mp.undo()


def _total(history: list[dict[str, float]], key: str) -> float:
    return sum(h.get(key, 0.0) for h in history)


def test_a_tight_budget_offers_and_audits_less_than_none(runs: dict[str, Any]) -> None:
    (tight, _, _), (free, _, _) = runs[0.3], runs[None]
    assert _total(tight.history, "probe/accepted") < _total(free.history, "probe/accepted")
    assert _total(tight.history, "audit/submitted") < _total(free.history, "audit/submitted")


def test_the_flops_share_stays_within_one_decision_of_the_budget(runs: dict[str, Any]) -> None:
    res, _, side = runs[0.3]
    b = side.budget
    assert b is not None and b.decisions >= 2
    one = b.pool_limit() * b.probe_batch * b.probe_cost(b.pool_limit())  # the largest decision, in FLOPs
    assert res.history[-1]["decision/flops_share"] <= 0.3 + one / (b.train_flops + b.decision_flops())
    assert res.history[-1]["decision/flops_share"] == pytest.approx(b.metrics()["decision/flops_share"])


def test_the_first_decision_comes_as_early_as_without_a_budget(runs: dict[str, Any]) -> None:
    first = {b: next(i for i, h in enumerate(r.history) if h.get("audit/submitted")) for b, (r, _, _) in runs.items()}
    assert first[0.3] <= first[None]


def test_pooled_audits_carry_k_batches_and_close_the_others_as_skipped_into_it(runs: dict[str, Any]) -> None:
    res, controller, side = runs[0.3]
    audits = controller.telemetry(res.run_id).audits
    pooled = [a for a in audits if "pooled_into" in (a["stats"] or {})]
    assert pooled, "a budget that binds at S=4 pools ready batches"
    decided = {a["audit_id"]: a for a in audits if a["kind"] != "skipped"}
    p = side.budget.probe_batch
    for target in {int(a["stats"]["pooled_into"]) for a in pooled}:
        k = 1 + sum(int(a["stats"]["pooled_into"]) == target for a in pooled)
        assert decided[target]["stats"]["probes"] == k * p  # the union of its k batches, audited as one
    assert not [a for a in audits if a["state"] == "pending"]


def test_no_budget_audits_every_ready_batch_on_its_own(runs: dict[str, Any]) -> None:
    res, controller, side = runs[None]
    audits = controller.telemetry(res.run_id).audits
    assert audits and all(a["kind"] != "skipped" for a in audits)
    assert all(a["stats"]["probes"] == side.budget.probe_batch for a in audits)
    assert "decision/budget" not in res.history[-1] and "decision/flops_share" in res.history[-1]


def test_the_last_step_releases_held_batches_unaudited_and_dispatches_none(runs: dict[str, Any]) -> None:
    res, controller, _ = runs[0.3]
    last = res.history[-1]
    assert last.get("audit/released", 0.0) > 0, "a budget that binds at S=4 holds batches at the last step"
    assert "audit/pooled_batches" not in last and not last.get("audit/submitted")
    audits = controller.telemetry(res.run_id).audits
    released = audits[-int(last["audit/released"]):]
    assert all(a["kind"] == "skipped" and "pooled_into" not in a["stats"] for a in released)
    assert not [a for a in audits if a["state"] == "pending"]


def test_without_a_budget_the_last_step_still_audits(runs: dict[str, Any]) -> None:
    res, _, _ = runs[None]
    assert res.history[-1].get("audit/submitted") and "audit/released" not in res.history[-1]


def test_a_learner_slowed_by_its_decisions_is_held_by_the_seconds_gate(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from adwin.probes.client import ProbeClient

    real = ProbeClient._audit

    def slow(self: ProbeClient, *a: Any, **k: Any) -> dict[str, float]:
        time.sleep(0.05)  # a learner that waits on its decisions far longer than it trains (FLOPs do not see it)
        return real(self, *a, **k)

    monkeypatch.setattr(ProbeClient, "_audit", slow)
    runs = {}
    for gate in (True, False):  # a loose FLOPs budget: only the learner's clock can bind
        cfg = load_config(None, tiny_overrides(tmp_path, steps=10, name=f"g{gate}", **SHAPE,
                                               **{"audit.budget": 0.5, "audit.budget_seconds": gate}))
        runs[gate] = train(cfg, Controller()).history
    on, off = runs[True], runs[False]
    assert on[0]["probe/accepted"] > 0  # the first round is never held
    assert _total(on, "probe/accepted") < _total(off, "probe/accepted")
    assert on[-1]["decision/learner_share"] < off[-1]["decision/learner_share"]
    assert on[-1]["decision/pressure_seconds"] > 1.0 and off[-1]["decision/pressure_seconds"] == 0.0
