"""``adwin bench async``: the report's arithmetic, and a smoke run of the command on the tiny profile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adwin.bench.compare.asyncopd import GOAL_SPEEDUP, report, speed
from adwin.cli import build_parser


def _row(tokens: float, wall: float, scores: list[float], **extra: float) -> dict:
    return {"sync_tokens": tokens, "train_wall_s": wall, "eval_scores": {"accuracy": scores}, "accuracy_initial": 0.1,
            "mean_window": 8.0, **extra}


@pytest.mark.parametrize("stream_wall", [5.0, 20.0])
def test_report_gives_the_speedup_and_the_paired_accuracy_difference(stream_wall: float) -> None:
    rng = np.random.default_rng(3)
    sync_scores = rng.integers(0, 2, 64).astype(float)
    stream_scores = np.where(rng.random(64) < 0.2, 1 - sync_scores, sync_scores)
    rows = {"sync": _row(1000.0, 10.0, sync_scores.tolist()),
            "asyncopd-thread": _row(900.0, stream_wall, stream_scores.tolist(), staleness_mean=1.5, staleness_max=3.0,
                             overlap=1.7)}
    res = report(rows)
    c = res["against_sync"]["asyncopd-thread"]
    assert c["speedup"] == pytest.approx((900.0 / stream_wall) / (1000.0 / 10.0))
    assert res["runs"]["sync"]["tokens_per_s"] == speed(rows["sync"]) == 100.0
    assert res["runs"]["sync"]["staleness_max"] == 0.0 and res["runs"]["asyncopd-thread"]["staleness_max"] == 3.0
    d = c["accuracy_diff"]
    assert d["mean"] == pytest.approx(float((stream_scores - sync_scores).mean())) and d["lo"] <= d["mean"] <= d["hi"]
    assert d["n"] == 64
    assert c["goal"]["speedup_met"] == (c["speedup"] >= GOAL_SPEEDUP)
    assert c["goal"]["met"] == (c["goal"]["speedup_met"] and d["hi"] >= 0.0)


@pytest.mark.timeout(300)
def test_bench_async_runs_both_schedulers_on_the_tiny_profile(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[4])  # configs/default.yaml is the base preset
    args = build_parser().parse_args(["bench", "async", "--profile", "tiny", "--workers", "thread",
                                      "--out", str(tmp_path)])
    assert args._module.main(args) == 0
    (results,) = tmp_path.glob("*-tiny/results.json")
    res = json.loads(results.read_text())
    assert set(res["runs"]) == {"sync", "asyncopd-thread"} and res["meta"]["smoke"]
    for r in res["runs"].values():
        assert r["trained_tokens"] > 0 and r["tokens_per_s"] > 0 and r["accuracy"]["n"] == res["meta"]["eval_problems"]
        assert r["mean_window"] == res["meta"]["window"]
    # same updates, same samples per update, same window: the same token budget, up to where samples ended
    cap = res["meta"]["steps"] * res["meta"]["samples_per_update"] * res["meta"]["window"]
    assert all(r["trained_tokens"] <= cap for r in res["runs"].values())
    assert res["runs"]["asyncopd-thread"]["overlap"] > 0
    assert set(res["against_sync"]) == {"asyncopd-thread"}
    assert res["runs"]["sync"]["untrained_requests"] == 0
    assert 0 <= res["runs"]["asyncopd-thread"]["untrained_requests"] <= 5 * res["meta"]["samples_per_update"]
    assert "SMOKE RUN" in capsys.readouterr().out


def test_workers_option_names_the_streaming_runs_and_refuses_unknown_kinds() -> None:
    from adwin.bench.compare.asyncopd import parse_workers

    assert parse_workers("thread,ray,thread") == ["thread", "ray"]
    with pytest.raises(ValueError, match="--workers"):
        parse_workers("thread,gpu")
