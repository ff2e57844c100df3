"""``adwin bench scale``: a smoke run on the tiny profile (1 process, 2 gloo ranks, the combine's all-reduce)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adwin.cli import main


def test_bench_scale_times_one_and_two_processes_and_sizes_the_combine(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    small = ["--set", "rollout.prompts_per_step=4", "--set", "rollout.samples_per_prompt=2",
             "--set", "eval.n_problems=2", "--set", "data.n_eval=2", "--set", "probes.batch_size=2",
             "--set", "probes.staleness_limit=2"]
    assert main(["bench", "scale", "--profile", "tiny", "--steps", "3", "--repeats", "1", "--out",
                 str(tmp_path / "runs"), "--json", str(out), *small]) == 0
    res = json.loads(out.read_text())
    one, two = res["results"]["1"], res["results"]["2"]
    assert one["steps_per_s"] > 0 and two["steps_per_s"] > 0
    assert res["ratio"] == pytest.approx(two["steps_per_s"] / one["steps_per_s"])
    assert one["windows"] == two["windows"] and len(one["windows"]) == 3  # per-sample seeding: the same run
    k1 = len(json.loads((tmp_path / "runs" / "scale-1" / "config.json").read_text())["window"]["candidates"]) + 1
    n_params = res["meta"]["n_params"]
    assert res["combine"]["fast_mb"] == pytest.approx(k1 * n_params * 4 / 2**20)  # (K+1) x n_params float32


def test_bench_scale_refuses_a_run_too_short_to_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scale", "--profile", "tiny", "--steps", "1"]) != 0
    assert "--steps must be at least 2" in capsys.readouterr().err


def test_a_failed_runs_error_keeps_the_head_and_tail_of_its_stderr_and_the_whole_in_a_file(tmp_path: Path) -> None:
    from adwin.bench.scale import _stderr_report

    stderr = "rank 1: the real cause\n" + "x" * 10_000 + "\ntorchrun: ChildFailedError summary"
    report = _stderr_report(stderr, tmp_path / "runs" / "scale-2.stderr", keep=100)
    assert "rank 1: the real cause" in report and report.endswith("ChildFailedError summary")
    assert len(report) < 400
    assert (tmp_path / "runs" / "scale-2.stderr").read_text() == stderr
    short = _stderr_report("one line", tmp_path / "short.stderr", keep=100)
    assert short.endswith("one line") and "[...]" not in short
