"""The evidence a decision needs, from the noise scale and effective dimension an audit measures: N* samples reach
the signal z the resolution asks for, and the decision budget pools that many, within its share, rarer."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parent))  # tests/adwin/audit/synthetic_pool.py
from synthetic_pool import synthetic_vectors  # noqa: E402

from adwin.audit.budget import DecisionBudget, FlopsModel, RunShape, simulate  # noqa: E402
from adwin.audit.estimators import cross_gram  # noqa: E402
from adwin.audit.sizing import EvidenceSizer, batches_needed, samples_needed  # noqa: E402
from adwin.audit.truth import noise_scale, signal_z  # noqa: E402

TOKENS = [64, 64, 128, 256, 512, 1024]  # noise energy 2,048 a sample, isotropic over 400 dimensions: d = 400


def _mean_z(n: int, signal: float, draws: int = 40) -> float:
    zs = [signal_z(cross_gram(synthetic_vectors(n, [0.9] * 5, signal=signal, tokens=TOKENS, seed=s)))
          for s in range(draws)]
    return float(np.mean(zs))


def test_the_samples_needed_reach_the_signal_z_asked_for_and_a_third_of_them_do_not() -> None:
    signal = math.sqrt(2048 / 100)  # B = 100
    h = cross_gram(synthetic_vectors(400, [0.9] * 5, signal=signal, tokens=TOKENS, seed=99))
    b, d = noise_scale(h)  # measured, as an audit would
    assert 70 < b < 140 and 200 < d < 600
    need = samples_needed(b, d, min_z=3.0, resolve_samples=0.0)  # z alone: about 3 B sqrt(2 / d) = 21
    assert 12 < need < 35
    assert 2.0 < _mean_z(math.ceil(need), signal) < 4.5
    assert _mean_z(max(2, math.ceil(need / 3)), signal) < 1.6


def test_the_samples_needed_are_the_larger_of_the_noise_scale_and_the_z_terms() -> None:
    assert samples_needed(40.0, 400.0, min_z=3.0, resolve_samples=1.0) == 40.0  # N >= B binds
    assert samples_needed(40.0, 8.0, min_z=3.0, resolve_samples=1.0) == pytest.approx(60.0)  # 3 * 40 * sqrt(2/8)
    assert samples_needed(40.0, None, min_z=3.0, resolve_samples=1.0) == pytest.approx(120.0)  # d unknown: 2
    assert samples_needed(math.inf, 10.0, min_z=3.0, resolve_samples=1.0) == math.inf  # no mean seen
    assert batches_needed(40.0, probe_batch=8, depth=2) == 3 and batches_needed(0.0, probe_batch=8, depth=2) == 1


def _run() -> RunShape:
    return RunShape(steps=60, train_tokens=128 * (20 + 64), probe_tokens=130, extension_tokens=46,
                    extension_steps=3, available=100)


def _budget(sizer: EvidenceSizer | None, pool_max: int = 4) -> DecisionBudget:
    shape = _run()
    return DecisionBudget(0.1, FlopsModel(266_000, 266_000), probe_batch=8, staleness_limit=5, offer_cap=16,
                          pool_max=pool_max, prior_probe_tokens=shape.probe_tokens,
                          prior_extension_tokens=shape.extension_tokens, sizer=sizer)


def test_the_budget_pools_the_batches_the_noise_scale_needs_rarer_and_within_its_share() -> None:
    plain = simulate(_budget(None), _run())
    sizer = EvidenceSizer(probe_batch=8, min_z=3.0, resolve_samples=1.0, depth=1)
    sizer.observe(24.0, 400.0)  # B = 24 from 8-sample audits: 24 samples a decision, 3 batches of 8
    assert sizer.batches == 3
    sized = _budget(sizer)
    out = simulate(sized, _run())
    assert set(out["probes_per_decision"][1:]) == {24}  # after the first (never delayed) decision
    assert set(plain["probes_per_decision"][1:]) != {24}
    assert len(out["decision_steps"]) < len(plain["decision_steps"])  # rarer ...
    assert out["decision/flops_share"] <= 0.1 + 1e-9  # ... within the budget's share
    assert out["decision/samples_needed"] == 24.0 and out["decision/resolvable"] == 1.0


def test_evidence_the_budget_cannot_pool_is_reported_unresolvable_and_capped() -> None:
    sizer = EvidenceSizer(probe_batch=8, min_z=3.0, resolve_samples=1.0, depth=2)
    sizer.observe(400.0, 400.0)  # 400 samples over 2 audits: 25 batches each, beyond pool_max 4
    budget = _budget(sizer)
    assert budget.pool() == budget.pool_limit() == 4
    assert budget.metrics()["decision/resolvable"] == 0.0


def test_the_sizers_target_survives_a_checkpoint() -> None:
    sizer = EvidenceSizer(probe_batch=8, depth=2)
    sizer.observe(50.0, 20.0)
    budget = _budget(sizer)
    fresh = _budget(dataclasses.replace(sizer, samples=math.nan, batches=1))
    fresh.load_state_dict(budget.state_dict())
    assert (fresh.sizer.samples, fresh.sizer.batches) == (sizer.samples, sizer.batches) and sizer.batches > 1
