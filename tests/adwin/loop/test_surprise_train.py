"""The surprise policy and IW-OPD as ordinary ``adwin train`` options on tiny on-disk checkpoints."""

from __future__ import annotations

from pathlib import Path

from trainer_fixtures import tiny_overrides

from adwin.config import apply_policy_spec, load_config
from adwin.controller import Controller
from adwin.loop.trainer import train
from adwin.policies.surprise import SurpriseWindow


def test_surprise_run_applies_each_steps_observation_to_the_next_window(tmp_path: Path) -> None:
    ov = apply_policy_spec(tiny_overrides(tmp_path, steps=4, name="sur", **{
        "eval.every": 0, "window.surprise.threshold": -4.0, "window.surprise.rank": 2}), "surprise")
    cfg = load_config(None, ov)
    res = train(cfg, Controller())
    hist = res.history
    windows = [int(h["window/current"]) for h in hist]
    assert windows[0] == cfg.rollout.max_response_len
    replay = SurpriseWindow(cfg.rollout.max_response_len, min_window=cfg.window.candidates[0])
    for t, h in enumerate(hist):
        assert windows[t] == replay.window(t)
        assert h["rollout/mean_len"] <= windows[t]
        replay.observe_step(t, h)
    assert res.totals["probe_tokens"] == 0 and not any("audit/id" in h for h in hist)


def test_surprise_window_collapses_to_min_when_every_token_is_lost(tmp_path: Path) -> None:
    ov = apply_policy_spec(tiny_overrides(tmp_path, steps=3, name="lost", **{
        "eval.every": 0, "window.surprise.threshold": -1e-6, "window.surprise.rank": 1,
        "window.surprise.ema": 1.0}), "surprise")
    res = train(load_config(None, ov), Controller())
    assert [int(h["window/current"]) for h in res.history] == [16, 4, 4]
    assert all(h["rollout/surprise_position_q"] == 1.0 for h in res.history)


def test_iw_opd_option_trains_on_full_rollouts_with_weighted_loss(tmp_path: Path) -> None:
    def run(name: str, gamma: float) -> list[dict]:
        ov = apply_policy_spec(tiny_overrides(tmp_path, steps=1, name=name, **{"eval.every": 0, "loss.iw_gamma": gamma}),
                               "full")
        return train(load_config(None, ov), Controller()).history

    plain, iw = run("plain", 0.0), run("iw", 0.5)
    assert "loss/iw_weight_mean" not in plain[0] and 1.0 < iw[0]["loss/iw_weight_mean"] <= 1.5
    assert iw[0]["rollout/sync_tokens"] == plain[0]["rollout/sync_tokens"]  # same seed: the same rollouts
    assert iw[0]["loss/total"] != plain[0]["loss/total"]
    assert int(iw[0]["window/current"]) == 16
