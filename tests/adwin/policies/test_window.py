from __future__ import annotations

import pytest

from adwin.policies.adaptive import AdaptiveWindow
from adwin.policies.base import WindowConfigError
from adwin.policies.registry import build_policy, parse_policy_spec, policy_from_state
from adwin.policies.schedules import FixedWindow, FullRollout, LinearWindow


def test_window_shrinks_when_cosine_clears_threshold():
    p = AdaptiveWindow([128, 256, 512], threshold=0.7, max_len=1024)
    assert p.window(0) == 512  # initial = largest candidate
    changed = p.observe({128: 0.75, 256: 0.9, 512: 0.99})
    assert changed and p.window(1) == 128


def test_window_is_shortest_admissible_candidate_not_first_crossing():
    p = AdaptiveWindow([128, 256, 512], threshold=0.7, max_len=1024)
    p.observe({128: 0.5, 256: 0.71, 512: 0.6})
    assert p.window(1) == 256


def test_window_expands_to_full_horizon_when_no_candidate_clears():
    p = AdaptiveWindow([128, 256], threshold=0.7, max_len=1024, initial=128)
    p.observe({128: 0.2, 256: 0.69})
    assert p.window(2) == 1024


def test_threshold_is_inclusive():
    p = AdaptiveWindow([128, 256], threshold=0.7, max_len=512)
    p.observe({128: 0.7, 256: 0.9})
    assert p.window(1) == 128


def test_audit_object_with_cosines_attribute_is_accepted():
    class R:
        cosines = {64: 0.9, 128: 1.0}

    p = AdaptiveWindow([64, 128], max_len=128)
    p.observe(R())
    assert p.window(0) == 64


def test_nan_cosines_are_rejected_and_window_stays():
    p = AdaptiveWindow([64, 128], max_len=128, initial=128)
    with pytest.raises(ValueError, match="not finite"):
        p.observe({64: float("nan"), 128: 1.0})
    assert p.window(0) == 128


def test_unknown_candidate_in_audit_is_rejected():
    p = AdaptiveWindow([64, 128], max_len=256)
    with pytest.raises(WindowConfigError, match="unknown candidates"):
        p.observe({32: 0.9})


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"candidates": []}, "candidates"),
        ({"candidates": [128, 64]}, "strictly increasing"),
        ({"candidates": [0, 64]}, r"candidates\[0\]"),
        ({"candidates": [64, 2048], "max_len": 1024}, "max_len"),
        ({"candidates": [64], "threshold": 0.0}, "threshold"),
        ({"candidates": [64], "threshold": 1.5}, "threshold"),
        ({"candidates": [64], "initial": 4096, "max_len": 1024}, "initial"),
    ],
)
def test_invalid_adaptive_config_names_the_field(kwargs, field):
    kw = {"max_len": 1024, **kwargs}
    with pytest.raises(WindowConfigError, match=field):
        AdaptiveWindow(**kw)


def test_linear_window_grows_and_caps_at_max_len():
    p = LinearWindow(256, 256, 1000)
    assert [p.window(t) for t in range(5)] == [256, 512, 768, 1000, 1000]


def test_fixed_and_full_ignore_audits():
    f, full = FixedWindow(64), FullRollout(512)
    assert not f.observe({64: 0.0}) and not full.observe({64: 0.0})
    assert f.window(9) == 64 and full.window(9) == 512


@pytest.mark.parametrize(
    "policy",
    [
        AdaptiveWindow([32, 64, 128], threshold=0.8, max_len=256, initial=64),
        FixedWindow(48),
        LinearWindow(16, 8, 200),
        FullRollout(300),
    ],
)
def test_policy_state_round_trips(policy):
    if isinstance(policy, AdaptiveWindow):
        policy.observe({32: 0.1, 64: 0.9, 128: 1.0})
    clone = policy_from_state(policy.state_dict())
    assert clone.state_dict() == policy.state_dict()
    assert [clone.window(t) for t in range(4)] == [policy.window(t) for t in range(4)]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("adwin", {"name": "adwin"}),
        ("full", {"name": "full"}),
        ("fixed:64", {"name": "fixed", "window": 64}),
        ("linear:32:32", {"name": "linear", "start": 32, "step": 32}),
    ],
)
def test_policy_spec_parses(spec, expected):
    assert parse_policy_spec(spec) == expected


@pytest.mark.parametrize("spec", ["fixed", "fixed:x", "linear:1", "bogus", "adwin:3"])
def test_bad_policy_spec_is_a_clear_error(spec):
    with pytest.raises(WindowConfigError, match="window_policy"):
        parse_policy_spec(spec)


def test_build_policy_requires_fields():
    with pytest.raises(WindowConfigError, match="window is required"):
        build_policy("fixed", max_len=10)
