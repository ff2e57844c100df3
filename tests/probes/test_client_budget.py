"""The decision budget in the one probe client's run state and config: its state survives a checkpoint, and a
config whose pooled round cannot fit ``probes.max_active`` is refused at load (the drivers' tests:
tests/adwin/loop/test_trainer_budget.py, tests/trainer_adapters/test_adapters_budget.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_fixtures import tiny_overrides

from adwin.audit.budget import DecisionBudget, FlopsModel
from adwin.config import load_config


def test_the_budget_state_round_trips_through_a_checkpoints_run_state() -> None:
    from adwin.loop.accounting import TokenLedger
    from adwin.loop.learner import FaultCounter
    from adwin.probes.pool import ProbePool
    from adwin.runtime.resume import restore_run_state, run_state
    from adwin.tasks.prompts import BuiltinPrompts

    def fresh() -> DecisionBudget:
        return DecisionBudget(0.1, FlopsModel(10, 20), probe_batch=2, staleness_limit=4, offer_cap=4,
                              prior_probe_tokens=10.0, prior_extension_tokens=5.0)

    before = fresh()
    before.record_train(100.0, 0.5)
    before.record_offers(before.allow_offers())
    before.record_decision("extension", 7.0, 0.1)
    before.record_decision("audit", 20.0, 0.2, probes=2)
    extra = run_state(ProbePool(8), TokenLedger(8), BuiltinPrompts(0), FaultCounter(3), None, before)
    after = fresh()
    restore_run_state(extra, ProbePool(8), TokenLedger(8), BuiltinPrompts(0), FaultCounter(3), None, after)
    assert after.state_dict() == before.state_dict() and after.metrics() == before.metrics()


def test_a_pooled_round_that_cannot_fit_max_active_is_refused_at_load(tmp_path: Path) -> None:
    shape = {"probes.staleness_limit": 4, "probes.offers_per_step": 4, "audit.pool_max": 4}
    with pytest.raises(ValueError, match=r"probes\.max_active.*audit\.pool_max"):
        load_config(None, tiny_overrides(tmp_path, **shape, **{"probes.max_active": 7}))
    load_config(None, tiny_overrides(tmp_path, **shape, **{"probes.max_active": 8}))  # 4 batches of P=2 fit
    load_config(None, tiny_overrides(tmp_path, **shape, **{"probes.max_active": 7, "audit.budget": None}))
