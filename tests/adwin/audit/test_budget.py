"""The decision budget: decisions stay within their share of the FLOPs (a later round paid for before it
starts), the first comes early, the budget off audits every ready batch, costlier decisions come rarer, and the
state survives a checkpoint."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from adwin.audit.budget import KINDS, BudgetError, DecisionBudget, FlopsModel, RunShape, simulate
from adwin.bench.compare.stats import estimate_flops
from adwin.config import load_config


def _budget(b: float | None, *, n_s: int = 266_000, n_t: int = 266_000, p: int = 8, s: int = 5, cap: int = 8,
            pool_max: int = 4, shape: RunShape | None = None, drift: bool = True) -> DecisionBudget:
    """Priors as a client would pass them: the run's own probe length and extension (upper bounds in a run)."""
    shape = shape or _make_run()
    return DecisionBudget(b, FlopsModel(n_s, n_t), probe_batch=p, staleness_limit=s, offer_cap=cap,
                          pool_max=pool_max, prior_probe_tokens=shape.probe_tokens,
                          prior_extension_tokens=shape.extension_tokens, drift=drift)


def _make_run(steps: int = 40) -> RunShape:
    """`make run`'s shape: 32 x 4 rollouts (20-token prompts, window 64), probes of ~130 tokens."""
    return RunShape(steps=steps, train_tokens=128 * (20 + 64), probe_tokens=130, extension_tokens=46,
                    extension_steps=3, available=100)


def _one_decision(budget: DecisionBudget, shape: RunShape) -> float:
    """The FLOPs of the largest decision the budget makes: a full pool, drift on every probe (an upper bound)."""
    n = budget.pool_limit() * budget.probe_batch
    return n * budget.flops.probe(shape.extension_tokens, shape.probe_tokens, 1.0)


shapes = st.builds(
    RunShape, steps=st.integers(10, 200), train_tokens=st.floats(1e3, 1e6), probe_tokens=st.floats(50, 1e4),
    extension_tokens=st.floats(0, 8e3), extension_steps=st.integers(1, 6), available=st.integers(1, 1024))


@settings(max_examples=150, deadline=None)
@given(shape=shapes, b=st.floats(0.005, 0.5), p=st.integers(1, 64), s=st.integers(1, 8), cap=st.integers(1, 128),
       pool_max=st.integers(1, 8), n_s=st.integers(10**5, 10**10), ratio=st.floats(0.25, 8.0), drift=st.booleans())
def test_a_later_round_is_paid_for_before_it_starts_so_only_the_first_can_overshoot(
        shape: RunShape, b: float, p: int, s: int, cap: int, pool_max: int, n_s: int, ratio: float,
        drift: bool) -> None:
    budget = _budget(b, n_s=n_s, n_t=max(1, int(n_s * ratio)), p=p, s=s, cap=cap, pool_max=pool_max, shape=shape,
                     drift=drift)
    out = simulate(budget, shape)
    first_round = p * budget.flops.probe(shape.extension_tokens, shape.probe_tokens, 1.0 if drift else 0.0)
    assert budget.decision_flops() <= budget.allowance() + first_round * (1 + 1e-9)
    assert 0.0 <= out["decision/flops_share"] < 1.0


@pytest.mark.parametrize("b", [None, 0.2, 0.1, 0.02, 0.005])
def test_the_first_decision_comes_as_early_as_without_a_budget(b: float | None) -> None:
    shape = _make_run()
    first = simulate(_budget(b), shape)["first_decision"]
    assert first == simulate(_budget(None), shape)["first_decision"] == shape.extension_steps - 1


def test_budget_off_offers_every_step_and_audits_each_ready_batch_alone() -> None:
    shape = _make_run()
    budget = _budget(None, cap=8)
    out = simulate(budget, shape)
    assert set(out["probes_per_decision"]) == {8}
    assert len(out["decision_steps"]) == len(set(out["decision_steps"]))  # a batch is ready per step, audited then
    assert budget.allow_offers() == 8 and budget.pool_size(3, 0) == 1 and budget.drift_rows(24) == 24


def test_a_tight_budget_decides_less_often_than_a_loose_one_and_stays_under_its_share() -> None:
    shape = _make_run(steps=120)
    counts = []
    for b in (0.1, 0.03, 0.01):
        out = simulate(_budget(b), shape)
        counts.append(len(out["decision_steps"]))
        assert out["decision/flops_share"] <= b + _one_decision(_budget(b), shape) / (120 * FlopsModel(
            266_000, 266_000).train(shape.train_tokens))
    assert counts[0] > counts[1] > counts[2] >= 1


@pytest.mark.parametrize("change", ["teacher", "probes"])
def test_a_bigger_teacher_or_longer_probes_lower_the_cadence(change: str) -> None:
    base = _make_run(steps=200)
    costly = RunShape(**{**base.__dict__, "probe_tokens": base.probe_tokens * 4, "extension_tokens":
                         base.extension_tokens * 4}) if change == "probes" else base
    n_t = 266_000 * (8 if change == "teacher" else 1)
    cheap_run = simulate(_budget(0.05, shape=base), base)
    costly_run = simulate(_budget(0.05, n_t=n_t, shape=costly), costly)
    assert costly_run["decision/cadence"] > cheap_run["decision/cadence"]
    assert len(costly_run["decision_steps"]) < len(cheap_run["decision_steps"])


def test_a_budget_that_does_not_bind_changes_nothing() -> None:
    shape = _make_run(steps=60)
    off = simulate(_budget(None), shape)
    assert off["decision/flops_share"] < 0.1
    on = simulate(_budget(0.1), shape)
    assert (on["decision_steps"], on["probes_per_decision"]) == (off["decision_steps"], off["probes_per_decision"])


def test_a_binding_budget_pools_later_decisions_up_to_what_offers_and_staleness_allow() -> None:
    shape = _make_run(steps=80)
    for cap, limit in ((4, 1), (8, 2), (16, 4), (64, 4)):
        budget = _budget(0.01, cap=cap)
        assert budget.pool_limit() == limit
        sizes = simulate(budget, shape)["probes_per_decision"]
        assert budget.pressure() > limit  # the budget binds hard enough to pool up to the limit
        assert sizes[0] == 8 and max(sizes[1:]) == limit * 8  # the first early and small, then pooled


def test_more_pressure_pools_more_batches() -> None:
    pools = []
    for b in (0.3, 0.1, 0.05, 0.03, 0.01):
        budget = _budget(b, cap=16)
        budget.record_train(_make_run().train_tokens)
        pools.append(budget.pool())
    assert pools == sorted(pools) and pools[0] == 1 and pools[-1] == 4  # 4: pool_limit at 16 offers per step


def test_held_batches_are_audited_before_their_oldest_probe_passes_the_staleness_limit() -> None:
    budget = _budget(0.01, cap=16)  # binds: pools of 4 batches
    budget.record_train(_make_run().train_tokens)
    budget.record_offers(budget.allow_offers())
    budget.record_decision("audit", 8 * 130, probes=8)  # the first decision
    while not budget.allow_offers():  # until the credit opens the next round
        budget.record_train(_make_run().train_tokens)
    assert budget.round_size == 32
    budget.record_offers(16)  # half the round offered so far
    assert budget.pool_size(1, oldest_staleness=2) == 0  # hold for the rest of the pool
    assert budget.pool_size(1, oldest_staleness=5) == 1  # at S: audit what is held
    budget.record_offers(16)
    assert budget.pool_size(4, oldest_staleness=0) == 4
    budget.release(16)
    assert budget.pool_size(2, oldest_staleness=0) == 2  # nothing more in flight to join them


def test_the_drift_diagnostics_read_one_batch_of_a_pool() -> None:
    assert _budget(0.1, cap=16).drift_rows(32) == 8


def test_state_round_trips_through_json_and_the_resumed_budget_answers_alike() -> None:
    a = _budget(0.05)
    feed = [(9000.0, 4), (11000.0, 0), (10000.0, 8), (9500.0, 0), (10200.0, 0)]
    for i, (tokens, audited) in enumerate(feed):
        a.record_train(tokens, seconds=0.5)
        a.record_offers(a.allow_offers())
        a.record_decision("extension", 40.0 * (i + 1), seconds=0.01)
        if audited:
            a.record_decision("scoring", audited * 130.0, seconds=0.02)
            a.record_decision("audit", audited * 130.0, seconds=0.1, probes=audited)
    b = _budget(0.05)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.metrics() == a.metrics()
    for tokens in (9000.0, 12000.0, 50000.0, 9000.0):
        for x in (a, b):
            x.record_train(tokens)
            x.record_offers(x.allow_offers())
        assert (a.credit(), a.pool_size(1, 1), a.metrics()) == (b.credit(), b.pool_size(1, 1), b.metrics())


def test_metrics_report_both_shares_the_cadence_and_each_kind() -> None:
    budget = _budget(0.1)
    budget.record_train(1000.0, seconds=3.0)
    budget.record_decision("audit", 100.0, seconds=1.0, probes=1)
    m = budget.metrics()
    t, d = FlopsModel(266_000, 266_000).train(1000.0), 6.0 * 266_000 * 100.0
    assert m["decision/flops_share"] == pytest.approx(d / (t + d))
    assert m["decision/seconds_share"] == pytest.approx(1.0 / 4.0)
    assert m["decision/learner_share"] == 0.0  # a worker's audit: nothing on the learner's thread
    budget.record_learner(0.5)  # e.g. the learner scored the probe batch and waited for the audit
    assert budget.metrics()["decision/learner_share"] == pytest.approx(0.5 / 3.5)
    assert m["decision/flops_share_audit"] == pytest.approx(m["decision/flops_share"])
    assert {f"decision/flops_share_{k}" for k in KINDS} | {"decision/cadence", "decision/pool"} <= set(m)
    assert math.isfinite(m["decision/cadence"]) and m["decision/cadence"] > 0


@settings(max_examples=100, deadline=None)
@given(n_s=st.integers(1, 10**11), n_t=st.integers(1, 10**11), tokens=st.floats(0, 1e9))
def test_a_trained_token_costs_what_a_probe_token_costs_through_extension_scoring_and_audit(
        n_s: int, n_t: int, tokens: float) -> None:
    m = FlopsModel(n_s, n_t)
    parts = m.decision("extension", tokens) + m.decision("scoring", tokens) + m.decision("audit", tokens)
    assert m.train(tokens) == pytest.approx(parts)
    assert m.decision("drift", tokens) == pytest.approx(m.decision("scoring", tokens))


@settings(max_examples=100, deadline=None)
@given(n_s=st.integers(2, 10**11), n_t=st.integers(1, 10**11), frac=st.floats(1e-6, 1.0), tokens=st.floats(0, 1e9))
def test_a_lora_student_pays_input_gradients_everywhere_and_weight_gradients_on_its_adapters(
        n_s: int, n_t: int, frac: float, tokens: float) -> None:
    n_a = max(1, min(n_s, round(frac * n_s)))
    full, lora = FlopsModel(n_s, n_t), FlopsModel(n_s, n_t, n_a)
    assert lora.decision("audit", tokens) == pytest.approx((4.0 * n_s + 2.0 * n_a) * tokens)
    assert lora.train(tokens) == pytest.approx(full.train(tokens) - 2.0 * (n_s - n_a) * tokens)
    assert FlopsModel(n_s, n_t, n_s).train(tokens) == pytest.approx(full.train(tokens))  # all trainable: 6 N_s
    for kind in ("extension", "scoring", "drift"):  # forwards: the adapters change nothing
        assert lora.decision(kind, tokens) == full.decision(kind, tokens)
    with pytest.raises(BudgetError, match="n_trainable"):
        FlopsModel(n_s, n_t, n_s + 1)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0, 1e5), st.floats(0, 1e6), st.floats(0, 1e5), st.floats(0, 1e5)),
                      min_size=1, max_size=8),
       n_s=st.integers(1, 10**10), n_t=st.integers(1, 10**10), p=st.integers(1, 64))
def test_estimate_flops_charges_what_the_budget_charges(steps: list[tuple[float, float, float, float]], n_s: int,
                                                        n_t: int, p: int) -> None:
    history = [{"rollout/prompt_tokens": pr, "rollout/sync_tokens": re, "probe/tokens": ext, "audit/probe_tokens": au}
               for pr, re, ext, au in steps]
    budget = DecisionBudget(0.1, FlopsModel(n_s, n_t), probe_batch=p, staleness_limit=5, offer_cap=p,
                            prior_probe_tokens=100.0, prior_extension_tokens=50.0)
    mean_prompt = sum(h[0] for h in steps) / (4 * len(steps))
    for pr, re, ext, au in steps:  # each audited probe is charged the mean prompt (estimate_flops' rule)
        budget.record_train(pr + re)
        budget.record_decision("extension", ext)
        budget.record_decision("scoring", au + mean_prompt * p)
        budget.record_decision("audit", au + mean_prompt * p, probes=p)
    f = estimate_flops(history, n_s, n_t, probe_batch=p, samples_per_step=4)
    assert f["flops_sync"] == pytest.approx(budget.train_flops)
    assert f["flops_probe"] == pytest.approx(budget.decision_flops())


@pytest.mark.parametrize(("kwargs", "name"), [({"budget": 1.0}, "budget"), ({"budget": 0.0}, "budget"),
                                              ({"probe_batch": 0}, "probe_batch"), ({"pool_max": 0}, "pool_max"),
                                              ({"prior_probe_tokens": -1.0}, "prior_probe_tokens")])
def test_a_budget_built_with_an_impossible_value_names_it(kwargs: dict, name: str) -> None:
    args = {"budget": 0.1, "probe_batch": 8, "staleness_limit": 5, "offer_cap": 8, "prior_probe_tokens": 100.0,
            "prior_extension_tokens": 50.0} | kwargs
    with pytest.raises(BudgetError, match=name):
        DecisionBudget(flops=FlopsModel(1, 1), **args)


def test_an_unknown_decision_kind_is_refused_before_anything_is_counted() -> None:
    budget = _budget(0.1)
    with pytest.raises(BudgetError, match="kind"):
        budget.record_decision("eval", 1.0)  # type: ignore[arg-type]
    assert budget.decision_flops() == 0.0 and budget.decisions == 0


def test_the_budget_combines_with_the_other_cadence_knobs() -> None:
    cfg = load_config(None, {"audit.every": 3})  # one ready batch in 3, among those the budget lets through
    assert cfg.audit.every == 3 and cfg.audit.budget == 0.1
    assert load_config(None, {"audit.skip_margin": 0.2}).audit.budget == 0.1  # skip_margin combines
    for value in (0.0, 1.0, -0.1):
        with pytest.raises(ValidationError, match="budget"):
            load_config(None, {"audit.budget": value})
    with pytest.raises(ValidationError, match="pool_max"):
        load_config(None, {"audit.pool_max": 0})


def _round(budget: DecisionBudget, *, learner_s: float) -> int:
    """Offer a round, then audit it whole as one decision that took ``learner_s`` of the learner's seconds."""
    offered = budget.allow_offers()
    budget.record_offers(offered)
    if offered:
        budget.record_learner(learner_s)
        budget.record_decision("audit", offered * 130.0, probes=offered)
    return offered


def _seconds_gated(gate: bool) -> DecisionBudget:
    # FLOPs never bind (a tiny model, a loose budget): only the learner's clock can hold a round
    return dataclasses.replace(_budget(0.5, n_s=10, n_t=10, cap=8), gate_seconds=gate)


def test_the_seconds_gate_holds_rounds_while_the_learner_spent_more_than_its_share_of_its_wall() -> None:
    gated, flops_only = _seconds_gated(True), _seconds_gated(False)
    offers = {True: [], False: []}
    for budget in (gated, flops_only):
        for _ in range(30):
            budget.record_train(10_000.0, seconds=1.0)
            offers[budget.gate_seconds].append(_round(budget, learner_s=4.0))  # each decision: 4 s of the learner
    assert all(o == 8 for o in offers[False])  # FLOPs alone: a round every step
    assert offers[True][0] == 8 and sum(o > 0 for o in offers[True]) < 10  # the first at once, then held
    # at 0.5 decisions may take as many learner seconds as training: a later round (4 s) starts only once the
    # credit covers it, so after the first round's head start the share never passes the budget
    assert gated.metrics()["decision/learner_share"] <= 0.5 + 1e-9
    assert gated.metrics()["decision/pressure_seconds"] > 1.0 and flops_only.metrics()["decision/pressure_seconds"] == 0


def test_the_seconds_gate_leaves_a_caller_that_reports_no_training_seconds_to_the_flops() -> None:
    budget = _seconds_gated(True)
    for _ in range(10):
        budget.record_train(10_000.0, seconds=0.0)
        assert _round(budget, learner_s=4.0) == 8  # not stopped after its first round


def test_decision_rounds_are_gated_by_the_learners_clock_by_default_and_the_knob_turns_it_off() -> None:
    from adwin.probes.settings import decision_budget

    kw = {"probe_batch": 8, "staleness_limit": 4, "offers_per_step": 8, "n_student": 10, "n_teacher": 10,
          "max_prompt_len": 20, "max_response_len": 64, "min_window": 8, "drift": False}
    assert decision_budget(load_config(None, {}).audit, **kw).gate_seconds
    assert not decision_budget(load_config(None, {"audit.budget_seconds": False}).audit, **kw).gate_seconds
