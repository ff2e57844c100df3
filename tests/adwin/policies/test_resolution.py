"""window.unresolved, window.signal_z, window.resolve_samples: an audit whose evidence cannot resolve the full
gradient's signal is marked and the window follows the fallback; one that can is decided by the rule, unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "audit"))  # tests/adwin/audit/synthetic_pool.py
from synthetic_pool import synthetic_vectors  # noqa: E402

from adwin.audit.estimators import cross_gram  # noqa: E402
from adwin.audit.evidence import evidence_of_gram  # noqa: E402
from adwin.policies.adaptive import AdaptiveWindow  # noqa: E402
from adwin.policies.base import WindowConfigError  # noqa: E402
from adwin.policies.registry import build_policy, policy_from_state  # noqa: E402
from adwin.policies.resolution import UNRESOLVED, judge  # noqa: E402

CANDS, HORIZON, THR = [64, 128, 256, 512, 1024], 2048, 0.7
TOKENS = [64, 64, 128, 256, 512, 1024]  # every response runs to the horizon: noise energy 2,048 a sample
ALIGNED = [0.9, 0.95, 0.97, 0.98, 0.99]  # truth: 64


class Audit:
    """What the controller hands the policy: the estimators of one audit's (pooled) samples."""

    def __init__(self, h: np.ndarray, estimator: str = "batch") -> None:
        ev = evidence_of_gram(h, CANDS, estimator=estimator, level=None)
        self.cosines, self.cosine_ci, self.noise_floor = ev.cosines, ev.cosine_ci, ev.noise_floor
        self.signal_z, self.noise_scale, self.samples = ev.signal_z, ev.measures.get("noise_scale"), ev.samples


def _audit(signal: float, n: int = 16, seed: int = 0) -> Audit:
    return Audit(cross_gram(synthetic_vectors(n, ALIGNED, signal=signal, tokens=TOKENS, seed=seed)))


def _paper(initial: int = 512) -> AdaptiveWindow:
    return AdaptiveWindow(CANDS, THR, HORIZON, initial=initial, unresolved="decide")


# signal 4: the noise scale B = 2048 / 16 = 128, far above 16 samples (the batch cosines read noise);
# signal 60: B = 0.57, far below them (the batch cosines read the gradients)
NOISY, STRONG = 4.0, 60.0


@pytest.mark.parametrize("fallback, window", [("hold", 512), ("horizon", HORIZON), ("noise_rule", None)])
def test_an_audit_of_far_fewer_samples_than_the_noise_scale_is_unresolved_and_follows_the_fallback(
        fallback: str, window: int | None) -> None:
    audit = _audit(NOISY)
    assert audit.noise_scale is None or audit.noise_scale > 4 * audit.samples
    if window is None:  # the shortest candidate whose pure-noise reading (about sqrt(w / 2048)) clears 0.7
        window = min([c for c in CANDS if audit.noise_floor[c] >= THR], default=HORIZON)
        assert window in (1024, HORIZON)
    paper = _paper()
    paper.observe(audit)
    assert paper.resolution.resolved is False  # marked, though the paper's rule decides on the cosines anyway
    policy = AdaptiveWindow(CANDS, THR, HORIZON, initial=512, unresolved=fallback)
    policy.observe(audit)
    assert policy.resolution.resolved is False and policy.window(0) == window


@pytest.mark.parametrize("fallback", UNRESOLVED)
def test_an_audit_with_a_strong_signal_is_resolved_and_decided_by_the_rule(fallback: str) -> None:
    audit = _audit(STRONG)
    policy = AdaptiveWindow(CANDS, THR, HORIZON, initial=512, unresolved=fallback)
    policy.observe(audit)
    paper = _paper()
    paper.observe(audit)
    assert policy.resolution.resolved is True and policy.window(0) == paper.window(0) == 64
    assert policy.resolution.samples == 16 and policy.resolution.noise_scale < 1.0


def test_pure_noise_holds_the_window_over_many_audits_where_the_papers_rule_moves() -> None:
    held, paper = AdaptiveWindow(CANDS, THR, HORIZON, initial=256, unresolved="hold"), _paper(initial=256)
    moved = 0
    for seed in range(6):
        audit = _audit(0.0, n=8, seed=seed)
        held.observe(audit)
        moved += paper.observe(audit)
        assert held.resolution.resolved is False and held.window(0) == 256
    assert moved  # the batch cosines of pure noise move the paper's rule towards their noise reading


def test_enough_signal_z_but_too_few_samples_for_the_noise_scale_is_unresolved() -> None:
    assert judge(5.0, 40.0, 48.0, min_z=3.0, resolve_samples=1.0).resolved is True
    assert judge(5.0, 60.0, 48.0, min_z=3.0, resolve_samples=1.0).resolved is False  # N < B
    assert judge(5.0, 60.0, 48.0, min_z=3.0, resolve_samples=0.0).resolved is True  # the N/B criterion off
    assert judge(2.0, 1.0, 48.0, min_z=3.0, resolve_samples=1.0).resolved is False  # z below its threshold
    assert judge(5.0, None, 48.0, min_z=3.0, resolve_samples=1.0).resolved is True  # no B measured: z alone
    assert judge(None, None, None, min_z=3.0, resolve_samples=1.0).resolved is None  # nothing measured: not judged


def test_an_audit_that_measured_no_signal_is_not_judged_and_the_rule_decides() -> None:
    policy = AdaptiveWindow(CANDS, THR, HORIZON, initial=512, unresolved="horizon")
    policy.observe({64: 0.9, 128: 0.95, 256: 0.97, 512: 0.98, 1024: 0.99})  # cosines alone (no per-sample vectors)
    assert policy.resolution.resolved is None and policy.window(0) == 64


def test_the_fallback_and_criteria_travel_through_options_and_state() -> None:
    opts = {"unresolved": float(UNRESOLVED.index("noise_rule")), "signal_z": 2.5, "resolve_samples": 0.5}
    p = build_policy("adwin", max_len=HORIZON, candidates=CANDS, options=opts)
    assert (p.unresolved, p.signal_z, p.resolve_samples) == ("noise_rule", 2.5, 0.5)
    q = policy_from_state(p.state_dict())
    assert (q.unresolved, q.signal_z, q.resolve_samples) == ("noise_rule", 2.5, 0.5)
    with pytest.raises(WindowConfigError, match="unresolved"):
        build_policy("adwin", max_len=HORIZON, candidates=CANDS, options={"unresolved": 7.0})
    with pytest.raises(WindowConfigError, match="resolve_samples"):
        AdaptiveWindow(CANDS, THR, HORIZON, resolve_samples=-1.0)
