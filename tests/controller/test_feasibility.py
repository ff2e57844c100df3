"""controller/feasibility.py: a run whose probes can never form a batch is refused, naming fields and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_harness import finish, offers, run_spec
from hypothesis import given
from hypothesis import strategies as st

from adwin.config import TrainConfig, load_config
from adwin.controller import Controller
from adwin.controller.api import InvalidInput
from adwin.controller.feasibility import expiry_warning, infeasibility, max_alive_probes, spec_infeasibility
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.loop.parts import run_spec as train_run_spec

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@given(p=st.integers(1, 200), k=st.integers(0, 20), s=st.integers(1, 12), rollouts=st.none() | st.integers(0, 30))
def test_a_batch_is_feasible_exactly_when_p_fits_the_probes_alive_within_s(p, k, s, rollouts) -> None:
    per_step = k if rollouts is None else min(k, rollouts)
    alive = per_step * (s + 1)  # offered at versions v-S..v are the only ones a batch at v may hold
    problem = infeasibility(audited=True, candidates=[4, 8], max_len=16, probe_batch_size=p, offers_per_step=k,
                            staleness_limit=s, rollouts_per_step=rollouts)
    assert (problem is None) == (p <= alive)
    if problem is not None:
        assert "probe_batch_size" in problem and (f"<= {alive}" in problem or "offers_per_step >= 1" in problem)
    assert infeasibility(audited=False, candidates=[4, 8], max_len=16, probe_batch_size=p, offers_per_step=k,
                         staleness_limit=s, rollouts_per_step=rollouts) is None


def test_the_issues_trl_numbers_give_48_probes_alive() -> None:
    assert max_alive_probes(64, 5, rollouts_per_step=8) == 48  # probe_count=64, TRL batch 8, S=5


def test_the_largest_feasible_batch_really_forms_at_the_controller() -> None:
    """Even with max_active_probes below P: complete probes free their slot."""
    ctrl = Controller()
    k, s = 2, 2
    rid = ctrl.register_run(run_spec(probe_batch_size=max_alive_probes(k, s), offers_per_step=k,
                                     staleness_limit=s, lookahead=0, max_active_probes=k)).run_id
    for step in range(s + 1):
        accepted = ctrl.offer_probes(rid, offers(step, k, prefix=f"v{step}-")).accepted
        for pid in accepted:
            finish(ctrl, rid, pid, step=step)
    batch = ctrl.next_probe_batch(rid, step=s)
    assert batch is not None and len(batch.probe_ids) == k * (s + 1)


def test_no_candidate_below_the_horizon_is_named_with_the_largest_workable_candidate() -> None:
    fields = dict(audited=True, max_len=16, probe_batch_size=2, offers_per_step=4, staleness_limit=5)
    problem = infeasibility(candidates=[16], **fields)
    assert problem is not None and "policy.candidates" in problem and "at most 15" in problem
    assert infeasibility(candidates=[8, 16], **fields) is None  # 8 truncates: the audit has a choice


def test_register_refuses_an_unfillable_batch_with_a_422_naming_the_fields(api) -> None:
    spec = run_spec(probe_batch_size=64, offers_per_step=4, staleness_limit=5)
    with pytest.raises(InvalidInput, match=r"probe_batch_size=64.*at most 24 .*offers_per_step=4.*staleness_limit=5"):
        api.register_run(spec)
    with pytest.raises(InvalidInput, match="add a candidate of at most 31"):
        api.register_run(run_spec(policy={"candidates": [32], "max_len": 32}))
    # unaudited policies never need a batch
    assert api.register_run(run_spec(policy={"name": "fixed", "window": 4, "max_len": 32},
                                     probe_batch_size=64, offers_per_step=0)).run_id


def test_the_runin_defaults_are_feasible_for_an_adwin_run() -> None:
    spec = RunIn(policy=PolicyIn(candidates=[4, 8], max_len=16))
    assert spec_infeasibility(spec.model_dump(mode="json"), audited=True) is None  # P=64 by 4 offers x 6 steps was not
    assert Controller().register_run(spec).run_id


@pytest.mark.parametrize("path", [None, *CONFIGS], ids=lambda p: "defaults" if p is None else p.name)
def test_the_shipped_configs_and_the_trainer_defaults_can_audit(path: Path | None) -> None:
    cfg = TrainConfig() if path is None else load_config(path)
    assert Controller().register_run(train_run_spec(cfg)).run_id


def test_expiry_warns_above_a_small_fraction_with_cause_and_fix() -> None:
    assert expiry_warning(1, 40, probe_batch_size=8, staleness_limit=5) is None
    assert expiry_warning(3, 4, probe_batch_size=8, staleness_limit=5) is None  # too few to judge
    msg = expiry_warning(46, 48, probe_batch_size=64, staleness_limit=5)
    assert msg is not None and "probe_batch_size=64" in msg and "staleness_limit=5" in msg and "lower" in msg
