"""window.confidence: ADWIN changes the window only when a cosine interval is clear of the threshold."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adwin.policies.adaptive import AdaptiveWindow
from adwin.policies.base import PolicyFields
from adwin.policies.registry import build_policy, policy_from_state

CANDS, THR, MAX = [32, 64, 128], 0.7, 256


class Audit:
    def __init__(self, ci: dict[int, tuple[float, float]]) -> None:
        self.cosine_ci = ci
        self.cosines = {c: (lo + hi) / 2 for c, (lo, hi) in ci.items()}


interval = st.tuples(st.floats(-1, 1), st.floats(0, 1)).map(lambda t: (t[0], min(1.0, t[0] + t[1])))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([32, 64, 128, MAX]), st.lists(interval, min_size=3, max_size=3))
def test_the_window_moves_only_to_or_away_from_an_interval_clear_of_the_threshold(start: int, cis: list) -> None:
    p = AdaptiveWindow(CANDS, THR, MAX, initial=start, confidence=True)
    ci = dict(zip(CANDS, cis, strict=True))
    changed = p.observe(Audit(ci))
    new = p.window(0)
    assert changed == (new != start)
    if changed:
        moved_to_sure = new in ci and ci[new][0] >= THR
        left_a_sure_failure = start in ci and ci[start][1] < THR
        assert moved_to_sure or (left_a_sure_failure and new > start)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([32, 64, 128, MAX]), st.lists(st.tuples(st.floats(-1, THR - 1e-6), st.floats(THR, 1)),
                                                      min_size=3, max_size=3))
def test_intervals_that_straddle_the_threshold_never_change_the_window(start: int, cis: list) -> None:
    p = AdaptiveWindow(CANDS, THR, MAX, initial=start, confidence=True)
    assert not p.observe(Audit(dict(zip(CANDS, cis, strict=True))))
    assert p.window(0) == start and p.changes == 0


def test_clear_evidence_moves_the_window_both_ways() -> None:
    p = AdaptiveWindow(CANDS, THR, MAX, initial=128, confidence=True)
    assert p.observe(Audit({32: (0.2, 0.75), 64: (0.72, 0.9), 128: (0.9, 1.0)})) and p.window(0) == 64
    assert p.observe(Audit({32: (0.1, 0.3), 64: (0.4, 0.69), 128: (0.71, 0.9)})) and p.window(0) == 128
    assert p.observe(Audit({32: (0.1, 0.3), 64: (0.4, 0.6), 128: (0.5, 0.65)})) and p.window(0) == MAX
    assert p.changes == 3 and p.decisions == 3


def test_point_cosines_would_have_flipped_where_the_interval_keeps_the_window() -> None:
    straddling = Audit({32: (0.6, 0.8), 64: (0.65, 0.95), 128: (0.9, 1.0)})  # 32's point cosine is 0.7
    plain = AdaptiveWindow(CANDS, THR, MAX, initial=128)
    sure = AdaptiveWindow(CANDS, THR, MAX, initial=128, confidence=True)
    assert plain.observe(straddling) and plain.window(0) == 32
    assert not sure.observe(straddling) and sure.window(0) == 128


def test_an_audit_without_intervals_is_refused_naming_the_knob() -> None:
    p = AdaptiveWindow(CANDS, THR, MAX, confidence=True)
    with pytest.raises(ValueError, match="audit.ci_level"):
        p.observe({32: 0.9, 64: 0.9, 128: 0.9})


def test_confidence_comes_from_the_policy_options_and_survives_a_state_round_trip() -> None:
    p = build_policy("adwin", max_len=MAX, candidates=CANDS, options={"confidence": 1.0})
    assert isinstance(p, AdaptiveWindow) and p.confidence
    p.observe(Audit({32: (0.8, 0.9), 64: (0.9, 1.0), 128: (0.95, 1.0)}))
    q = policy_from_state(p.state_dict())
    assert isinstance(q, AdaptiveWindow) and q.confidence and q.changes == 1 and q.window(0) == 32
    assert not AdaptiveWindow.from_fields(PolicyFields(max_len=MAX, candidates=CANDS)).confidence
