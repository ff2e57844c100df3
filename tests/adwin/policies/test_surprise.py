"""Teacher-surprise horizon: the per-step measurement, the policy's EMA and clip, and the controller feeding it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adwin.config import SurpriseSection, load_config
from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn, StepMetricsIn
from adwin.policies.base import WindowConfigError
from adwin.policies.registry import build_policy, parse_policy_spec, policy_from_state
from adwin.policies.surprise import SurpriseWindow, surprise_metrics, surprise_positions

LOST, OK = -12.0, -0.5


def _rows(samples: list[tuple[int, list[float]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, L) teacher logprobs and response mask from (prompt_len, response logprobs)."""
    width = max(p + len(r) for p, r in samples) + 1
    lp = torch.full((len(samples), width), float("nan"))  # padding and prompt hold garbage
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for b, (p, r) in enumerate(samples):
        lp[b, :p] = -50.0  # prompt tokens may be very unlikely: they must not count
        lp[b, p : p + len(r)] = torch.tensor(r)
        mask[b, p : p + len(r)] = 1
    return lp, mask


def _reference_position(resp: list[float], threshold: float, rank: int) -> int:
    seen = 0
    for j, v in enumerate(resp):
        if v < threshold:
            seen += 1
            if seen == rank:
                return j + 1
    return len(resp)


def test_position_is_the_rank_th_lost_token_or_the_length() -> None:
    gen = torch.Generator().manual_seed(0)
    samples = []
    for b in range(6):
        n = 5 + 3 * b
        resp = [LOST if torch.rand((), generator=gen) < 0.4 else OK for _ in range(n)]
        samples.append((2 + b % 3, resp))
    lp, mask = _rows(samples)
    for rank in (1, 2, 3):
        pos, reached = surprise_positions(lp, mask, -9.2, rank)
        expected = [_reference_position(r, -9.2, rank) for _, r in samples]
        assert pos.tolist() == [float(e) for e in expected]
        assert reached.tolist() == [sum(v < -9.2 for v in r) >= rank for _, r in samples]


def test_threshold_is_strict_and_prompt_tokens_never_count() -> None:
    lp, mask = _rows([(3, [OK, -9.2, LOST, OK, LOST])])
    pos, _ = surprise_positions(lp, mask, -9.2, 2)
    assert pos.tolist() == [5.0]  # -9.2 itself is not lost; the prompt's -50s are ignored


def test_horizon_is_scale_times_quantile_of_positions() -> None:
    samples = [(1, [LOST] * 2 + [OK] * 8), (1, [OK] * 4), (1, [OK, LOST, OK, LOST, OK, OK])]
    lp, mask = _rows(samples)
    params = SurpriseSection(rank=2, quantile=0.5, scale=1.25)
    m = surprise_metrics(lp, mask, params)
    # positions 2, 4 (censored at the length), 4 -> median 4
    assert m["rollout/surprise_position_q"] == pytest.approx(4.0)
    assert m["rollout/surprise_horizon"] == pytest.approx(5.0)
    assert m["rollout/surprise_reached_frac"] == pytest.approx(2 / 3)
    assert m["rollout/surprise_lost_frac"] == pytest.approx(4 / 20)


def test_policy_is_an_ema_of_proposals_clipped_to_its_range() -> None:
    p = SurpriseWindow(320, min_window=32, max_window=256, ema=0.3)
    assert p.window(0) == 256  # initial: the largest allowed window
    assert p.observe_step(0, {"rollout/surprise_horizon": 100.0})
    level = 0.7 * 256 + 0.3 * 100
    assert p.window(1) == round(level)
    p.observe_step(1, {"rollout/surprise_horizon": 0.0})
    level = 0.7 * level
    assert p.window(2) == round(level)
    for t in range(2, 30):
        p.observe_step(t, {"rollout/surprise_horizon": 0.0})
    assert p.window(30) == 32  # clipped at min
    for t in range(30, 60):
        p.observe_step(t, {"rollout/surprise_horizon": 1000.0})
    assert p.window(60) == 256  # clipped at max


def test_policy_ignores_repeated_steps_and_missing_metrics() -> None:
    p = SurpriseWindow(100, min_window=1, ema=0.5)
    p.observe_step(3, {"rollout/surprise_horizon": 50.0})
    w = p.window(4)
    assert not p.observe_step(3, {"rollout/surprise_horizon": 0.0})  # step 3 again
    assert not p.observe_step(2, {"rollout/surprise_horizon": 0.0})  # an older step
    assert not p.observe_step(4, {"loss/total": 1.0})  # no observation in this step
    assert p.window(5) == w
    with pytest.raises(ValueError, match="finite"):
        p.observe_step(5, {"rollout/surprise_horizon": float("nan")})


def test_policy_state_round_trips_and_spec_parses() -> None:
    p = build_policy("surprise", max_len=320, candidates=[32, 64], options={"ema": 0.5, "max": 200})
    assert (p.min_window, p.max_window, p.ema) == (32, 200, 0.5)
    p.observe_step(0, {"rollout/surprise_horizon": 40.0})
    q = policy_from_state(p.state_dict())
    assert q.state_dict() == p.state_dict() and q.window(1) == p.window(1) == 120
    assert parse_policy_spec("surprise") == {"name": "surprise"}
    with pytest.raises(WindowConfigError, match="min"):
        build_policy("surprise", max_len=320, options={"min": 300, "max": 200})
    cfg = load_config(None, {"window.policy": "surprise", "window.surprise.min": 16})
    assert cfg.window.policy_options()["min"] == 16.0
    with pytest.raises(ValueError, match="max"):
        load_config(None, {"window.policy": "surprise", "window.surprise.max": 999})


def test_controller_feeds_step_metrics_to_the_policy_and_persists_it(tmp_path: Path) -> None:
    db = str(tmp_path / "ctl.sqlite")
    c = Controller(db)
    spec = RunIn(policy=PolicyIn(name="surprise", max_len=320, candidates=[32, 64, 128],
                                 options={"ema": 0.5, "threshold": -9.2}))
    rid = c.register_run(spec).run_id
    assert c.get_window(rid, 0).window == 320
    c.report_step(rid, StepMetricsIn(step=0, metrics={"rollout/surprise_horizon": 100.0}), idempotency_key="k0")
    assert c.get_window(rid, 1).window == 210
    # a retried report (same key) and a second part of the same step do not move the EMA again
    c.report_step(rid, StepMetricsIn(step=0, metrics={"rollout/surprise_horizon": 100.0}), idempotency_key="k0")
    c.report_step(rid, StepMetricsIn(step=0, metrics={"rollout/surprise_horizon": 0.0, "x": 1.0}))
    assert c.get_window(rid, 1).window == 210
    c.report_step(rid, StepMetricsIn(step=1, metrics={"rollout/surprise_horizon": 10.0}))
    assert c.get_window(rid, 2).window == 110
    decisions = c.telemetry(rid).decisions
    assert [(d["step"], d["window"]) for d in decisions] == [(0, 320), (1, 210), (2, 110)]
    c.close()
    reopened = Controller(db)
    assert reopened.get_window(rid, 2).window == 110
    assert reopened.get_run(rid).policy_state["level"] == pytest.approx(110.0)
    reopened.close()


def test_other_policies_ignore_step_metrics() -> None:
    c = Controller()
    rid = c.register_run(RunIn(policy=PolicyIn(name="fixed", window=64, max_len=320))).run_id
    c.report_step(rid, StepMetricsIn(step=0, metrics={"rollout/surprise_horizon": 5.0}))
    assert c.get_window(rid, 1).window == 64
