"""window.noise_hold, window.signal_z and window.grow_to: the confidence rule moves only on audits that carry
information, and grows to where the point estimate says (docs/decisions.md, "The shortest admissible window")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adwin.policies.adaptive import AdaptiveWindow
from adwin.policies.base import PolicyFields, WindowConfigError
from adwin.policies.registry import build_policy, policy_from_state

CANDS, THR, MAX = [32, 64, 128], 0.7, 256


class Audit:
    def __init__(self, ci: dict[int, tuple[float, float]], z: float = 10.0, noise: dict[int, float] | None = None,
                 cosines: dict[int, float] | None = None) -> None:
        self.cosine_ci = ci
        self.cosines = cosines or {c: (lo + hi) / 2 for c, (lo, hi) in ci.items()}
        self.noise_floor = noise or {}
        self.extra = {"signal_z": z}


interval = st.tuples(st.floats(-1, 1), st.floats(0, 1)).map(lambda t: (t[0], min(1.0, t[0] + t[1])))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([32, 64, 128, MAX]), st.lists(interval, min_size=3, max_size=3), st.floats(0, 2.99))
def test_an_audit_without_a_detectable_full_gradient_signal_never_moves_the_window(start, cis, z) -> None:
    p = AdaptiveWindow(CANDS, THR, MAX, initial=start, confidence=True, noise_hold=True)
    assert not p.observe(Audit(dict(zip(CANDS, cis, strict=True)), z=z)) and p.window(0) == start


def test_an_interval_around_its_noise_reading_neither_shrinks_to_nor_grows_from_its_candidate() -> None:
    sure_32 = {32: (0.75, 0.9), 64: (0.8, 0.95), 128: (0.9, 1.0)}
    p = AdaptiveWindow(CANDS, THR, MAX, confidence=True, noise_hold=True)
    p.observe(Audit(sure_32, noise={32: 0.8, 64: 0.1, 128: 0.1}))  # 32's interval holds its noise reading
    assert p.window(0) == 64
    q = AdaptiveWindow(CANDS, THR, MAX, initial=32, confidence=True, noise_hold=True)
    q.observe(Audit({32: (0.1, 0.3), 64: (0.2, 0.4), 128: (0.8, 0.9)}, noise={32: 0.2, 64: 0.0, 128: 0.0}))
    assert q.window(0) == 32  # below the threshold, but no more than noise reads
    q.observe(Audit({32: (0.3, 0.5), 64: (0.2, 0.4), 128: (0.8, 0.9)}, noise={32: 0.2, 64: 0.0, 128: 0.0}))
    assert q.window(0) == 128


def test_grow_to_point_goes_to_the_shortest_longer_candidate_whose_cosine_clears_the_threshold() -> None:
    ci = {32: (0.1, 0.3), 64: (0.6, 0.9), 128: (0.65, 0.95)}  # nothing surely above
    sure = AdaptiveWindow(CANDS, THR, MAX, initial=32, confidence=True)
    point = AdaptiveWindow(CANDS, THR, MAX, initial=32, confidence=True, grow_to="point")
    audit = Audit(ci, cosines={32: 0.2, 64: 0.75, 128: 0.8})
    sure.observe(audit)
    point.observe(audit)
    assert (sure.window(0), point.window(0)) == (MAX, 64)


def test_without_noise_hold_the_rule_is_the_confidence_rule_as_before() -> None:
    p = AdaptiveWindow(CANDS, THR, MAX, initial=32, confidence=True)
    p.observe(Audit({32: (0.1, 0.3), 64: (0.2, 0.4), 128: (0.8, 0.9)}, z=0.0, noise={32: 0.2}))
    assert p.window(0) == 128


def test_the_settings_round_trip_through_state_and_the_controllers_float_options() -> None:
    p = AdaptiveWindow(CANDS, THR, MAX, confidence=True, noise_hold=True, grow_to="point", signal_z=2.5)
    q = policy_from_state(p.state_dict())
    assert (q.noise_hold, q.grow_to, q.signal_z) == (True, "point", 2.5)
    built = build_policy("adwin", max_len=MAX, candidates=CANDS,
                         options={"confidence": 1.0, "noise_hold": 1.0, "grow_to": 1.0, "signal_z": 2.5})
    assert (built.noise_hold, built.grow_to, built.signal_z) == (True, "point", 2.5)
    with pytest.raises(WindowConfigError, match="grow_to"):
        AdaptiveWindow.from_fields(PolicyFields(MAX, CANDS, options={"grow_to": 3.0}))
    with pytest.raises(WindowConfigError, match="signal_z"):
        AdaptiveWindow(CANDS, THR, MAX, signal_z=-1.0)
