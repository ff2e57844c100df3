"""``adwin bench probes --profile tiny``: the five variants run side by side, the fixed-window baseline first at the
window it is given, each finished run's row on disk as it is written, and the table adds up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adwin.cli import main


def test_bench_probes_runs_every_variant_on_the_tiny_profile(tiny_home: Path, ray_cluster: None, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tiny_home))
    out = tmp_path / "bench.json"
    rc = main(["bench", "probes", "--profile", "tiny", "--steps", "3", "--json", str(out),
               "--set", "eval.n_problems=2", "--set", "rollout.prompts_per_step=2", "--set", "rollout.max_response_len=32",
               "--set", "window.candidates=[8,16]", "--set", "probes.batch_size=2", "--fixed-window", "8",
               "--out", str(tmp_path / "runs")])
    assert rc == 0
    res = json.loads(out.read_text())["results"]
    assert list(res) == ["fixed", "inline", "rollout", "thread", "ray"]  # the baseline first
    kept = [json.loads(x) for x in (tmp_path / "runs" / "rows.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in kept] == list(res) and kept[0]["wall_s"] == res["fixed"]["wall_s"]
    assert res["fixed"]["ratio"] == 1.0 and res["fixed"]["probe_tokens"] == 0 and res["fixed"]["blocked_s"] == 0
    assert res["inline"]["probe_tokens"] > 0 and res["inline"]["audits"] >= 1
    assert res["inline"]["blocked_s"] > 0  # inline rounds run in the step: all of it is blocking time
    assert res["rollout"]["rider_rows"] > 0 and res["rollout"]["audits"] >= 1  # rounds rode the rollout calls
    assert all(res[v]["rider_rows"] == 0 for v in res if v != "rollout")
    assert res["fixed"]["probe_decode_steps"] == 0 and res["inline"]["probe_decode_steps"] > 0
    assert all(0 < r["rollout_decode_steps"] <= 16 for r in res.values())  # never past the largest window
    assert all(r["wall_s"] > 0 and r["lost"] == 0 for r in res.values())
    assert all(0 <= r["learner_share"] < 1 and r["lag_max"] <= 2 for r in res.values())  # lag bounded by S=2
    rows = [json.loads(x) for x in (tmp_path / "runs" / "bench-fixed" / "metrics.jsonl").read_text().splitlines()]
    assert {r["window/current"] for r in rows} == {8}  # --fixed-window
    assert "x fixed" in capsys.readouterr().out


def test_the_baseline_runs_at_the_configs_initial_window_unless_told(tmp_path: Path) -> None:
    import argparse

    from adwin.bench.probes import _config, add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--set", "window.initial=64"])
    assert _config(args, "fixed", tmp_path).window.window == 64
    assert _config(args, "fixed", tmp_path, fixed_window=32).window.window == 32
    assert _config(args, "rollout", tmp_path).probes.backend == "rollout"


def test_padding_cost_times_the_three_calls_per_cache_kind() -> None:
    from tiny_models import make_tiny_llama

    from adwin.bench.riding import CACHES, padding_cost

    model = make_tiny_llama(vocab_size=64, seed=1).train()
    res = padding_cost(model, rows=4, prompt_len=3, probe_rows=2, probe_len=12, window=4, repeats=1)
    assert list(res) == list(CACHES) and model.training  # the model's mode is given back
    for r in res.values():
        assert min(r["alone"], r["riding"], r["separate"]) > 0
        assert r["riding_x"] == r["riding"] / r["alone"] and r["ms_per_step_alone"] == 1000 * r["alone"] / 4


def test_bench_probes_padding_prints_its_table(tiny_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tiny_home))
    out = tmp_path / "padding.json"
    assert main(["bench", "probes", "--profile", "tiny", "--padding", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())["padding"]) == {"dynamic", "static"}
    assert "riding / alone" in capsys.readouterr().out
