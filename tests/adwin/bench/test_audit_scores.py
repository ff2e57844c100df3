"""adwin.bench.audit_scores: the shares of replayed windows against a held-out truth, their intervals over runs, the
verdict's direction and the goals, on windows and truths set by hand."""

from __future__ import annotations

import numpy as np
import pytest

from adwin.bench import audit_scores as sc

CANDS, HORIZON = [64, 128, 256, 512, 1024], 2048
# not monotone: 256 is admissible, 512 is not
POP = {64: 0.2, 128: 0.5, 256: 0.75, 512: 0.6, 1024: 0.9}
TRUTH = sc.Truth(256, POP, HORIZON, 0.7, CANDS)


def test_each_share_is_the_hand_computed_one() -> None:
    w = np.array([[64, 256, 512, 2048], [256, 256, 1024, 128]])  # (runs, audits)
    s = sc.score(w, TRUTH, HORIZON)
    assert s["exact"]["share"] == pytest.approx(3 / 8)
    assert s["admissible"]["share"] == pytest.approx(5 / 8)  # 256 x3, 1,024, the horizon; not 512
    assert s["unsafe"]["share"] == pytest.approx(2 / 8)  # 64, 128
    assert s["cost"]["share"] == pytest.approx((64 + 3 * 256 + 512 + 2048 + 1024 + 128) / 8 / HORIZON)
    assert s["within_one_rung"]["share"] == pytest.approx(5 / 8)  # 256 x3, 128, 512
    assert s["windows"] == {"64": 0.125, "128": 0.125, "256": 0.375, "512": 0.125, "1024": 0.125, "2048": 0.125}
    assert s["decisions"] == 8


def test_the_interval_is_over_runs_and_covers_the_share() -> None:
    rng = np.random.default_rng(0)
    w = np.where(rng.random((40, 12)) < 0.6, 256, 64)
    s = sc.score(w, TRUTH, HORIZON, level=0.9)
    lo, hi = s["exact"]["ci"]
    assert lo < s["exact"]["share"] < hi and hi - lo < 0.1
    same = sc.score(np.full((40, 12), 256), TRUTH, HORIZON)
    assert same["exact"]["ci"] == [1.0, 1.0]  # every run alike: no spread


def test_without_a_truth_only_the_cost_is_scored() -> None:
    s = sc.score(np.full((3, 4), 512), None, HORIZON)
    assert s["exact"] is None and s["admissible"] is None and s["unsafe"] is None
    assert s["cost"]["share"] == 0.25


def test_the_paired_difference_resamples_the_same_runs() -> None:
    rng = np.random.default_rng(1)
    a = np.where(rng.random((30, 12)) < 0.5, 256, 64)
    d = sc.difference(a, a, TRUTH, HORIZON)
    assert all(d[m]["diff"] == 0.0 and d[m]["ci"] == [0.0, 0.0] for m in sc.METRICS)
    b = np.where(a == 256, 1024, a)  # the same runs, one rung up where a was exact
    d = sc.difference(a, b, TRUTH, HORIZON)
    assert d["exact"]["ci"][0] > 0 and d["cost"]["ci"][1] < 0 and d["admissible"]["diff"] == 0.0


@pytest.mark.parametrize("truth_window, noise_window, want", [
    (2048, 512, sc.LONGER), (64, 512, sc.SHORTER), (512, 512, sc.SAME), (None, 512, sc.NO_TRUTH)])
def test_the_direction_is_where_the_truth_lies_from_the_noise_reading(truth_window, noise_window, want) -> None:
    assert sc.direction(truth_window, noise_window) == want


def _case(where: str, truth: sc.Truth, noise: int, rule: np.ndarray, noise_rule: np.ndarray | None = None) -> dict:
    """``noise``: the truth half's noise-reading window; ``noise_rule``: the replayed noise rule's (default it)."""
    shape = (10, 6)
    rule_w = np.broadcast_to(rule, shape)
    noise_w = np.broadcast_to(np.full(6, noise) if noise_rule is None else noise_rule, shape)
    return {"where": where, "direction": sc.direction(truth.window, noise),
            "replay": {"8": {"adwin": sc.score(rule_w, truth, HORIZON)}},
            "versus_noise": {"8": {"adwin": sc.difference(rule_w, noise_w, truth, HORIZON)}}}


def _status(cases: list[dict]) -> dict[str, str]:
    return {g["case"]: g["status"] for g in sc.goals(cases, "adwin")}


def test_the_goals_are_met_not_met_or_without_a_checkpoint_to_judge() -> None:
    longer = sc.Truth(HORIZON, {c: 0.3 for c in CANDS}, HORIZON, 0.7, CANDS)  # only the horizon admissible
    shorter = sc.Truth(64, {c: 0.9 for c in CANDS}, HORIZON, 0.7, CANDS)
    same = sc.Truth(512, {64: 0.2, 128: 0.3, 256: 0.4, 512: 0.8, 1024: 0.9}, HORIZON, 0.7, CANDS)
    at = {"longer": _case("a", longer, 512, np.full(6, HORIZON)), "shorter": _case("b", shorter, 512, np.full(6, 64)),
          "same": _case("c", same, 512, np.full(6, 64))}
    assert _status([at["longer"], at["same"]]) == {sc.LONGER: "met", sc.SHORTER: "no checkpoint to judge"}
    assert _status([at["shorter"]]) == {sc.LONGER: "no checkpoint to judge", sc.SHORTER: "met"}
    # the noise rule's own window where the truth is longer: never admissible, always unsafe
    like_noise = _case("d", longer, 512, np.full(6, 512))
    assert _status([at["longer"], like_noise])[sc.LONGER] == "not met"
    # admissible on 5 decisions of 6, far above the noise rule, but below the truth's window on the sixth (17 %)
    truth = sc.Truth(1024, {64: 0.2, 128: 0.3, 256: 0.4, 512: 0.5, 1024: 0.9}, HORIZON, 0.7, CANDS)
    short_once = _case("f", truth, 512, np.array([512, 1024, 1024, 1024, 1024, 1024]))
    assert short_once["replay"]["8"]["adwin"]["admissible"]["share"] == pytest.approx(5 / 6)
    assert _status([short_once])[sc.LONGER] == "not met"
    # admissible throughout, but so is the noise rule, whose audits read past the truth's window
    as_noise = _case("g", truth, 512, np.full(6, 1024), noise_rule=np.full(6, 2048))
    assert as_noise["versus_noise"]["8"]["adwin"]["admissible"]["ci"] == [0.0, 0.0]
    assert _status([as_noise])[sc.LONGER] == "not met"
    # the truth's window on half the decisions, the horizon on the rest: more exact than the noise rule, but dearer
    dear = _case("e", shorter, 512, np.array([64, 2048] * 3))
    assert _status([dear])[sc.SHORTER] == "not met"
    # on the truth's window more often than the noise rule, and cheaper, but on 128 (not admissible) the rest
    dips = sc.Truth(64, {64: 0.9, 128: 0.5, 256: 0.5, 512: 0.8, 1024: 0.9}, HORIZON, 0.7, CANDS)
    cheap = _case("h", dips, 512, np.array([64, 128] * 3))
    assert cheap["versus_noise"]["8"]["adwin"]["exact"]["ci"][0] > 0 and _status([cheap])[sc.SHORTER] == "not met"
    # cheaper than the noise rule and admissible, but never on the truth's window
    assert _status([_case("i", shorter, 512, np.full(6, 128))])[sc.SHORTER] == "not met"
    # never below the truth's window and more often admissible than the noise rule, but on 1,024 (not admissible)
    # a third of the time
    peak = sc.Truth(512, {64: 0.2, 128: 0.3, 256: 0.4, 512: 0.8, 1024: 0.5}, HORIZON, 0.7, CANDS)
    assert _status([_case("j", peak, 256, np.array([512, 512, 1024] * 2))])[sc.LONGER] == "not met"
    (g,) = [g for g in sc.goals([at["longer"], like_noise], "adwin") if g["case"] == sc.LONGER]
    assert [c["met"] for c in g["checkpoints"]] == [True, False] and "admissible 0 %" in g["checkpoints"][1]["figures"]
