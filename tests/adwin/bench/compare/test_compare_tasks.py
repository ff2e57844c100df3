"""Paired statistics and cross-task regret of ``adwin bench compare --tasks``, and the multi-task smoke run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from adwin.bench.compare.command import final_eval_scores
from adwin.bench.compare.setup import parse_tasks
from adwin.bench.compare.tasks import bootstrap_mean_ci, measures_of, paired_stats, regrets, samples_needed
from adwin.cli import main


def test_evaluation_sized_by_samples_needed_gives_the_promised_halfwidth() -> None:
    """Two independent coin-flip methods (the worst case), n·k·S = samples_needed(0.03) outcomes each:
    the paired-difference CI half-width comes out at about 0.03."""
    n = samples_needed(0.03)
    rng = np.random.default_rng(1)
    widths = []
    for _ in range(5):
        a, b = rng.integers(0, 2, n).astype(float), rng.integers(0, 2, n).astype(float)
        widths.append(bootstrap_mean_ci(a - b, seed=int(rng.integers(1 << 30)))["halfwidth"])
    assert 0.027 < float(np.mean(widths)) <= 0.031
    assert samples_needed(0.015) > 3.9 * n  # a quarter of the width needs four times the samples


def test_pairing_removes_problem_difficulty_from_the_difference() -> None:
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0, 1, 400)  # per-problem accuracy, very spread
    runs = [{"method": "full", "seed": 0, "eval_scores": {"accuracy": list(difficulty)}},
            {"method": "fixed-8", "seed": 0, "eval_scores": {"accuracy": list(np.clip(difficulty + 0.05, 0, 1))}}]
    stats = paired_stats(runs, ["full", "fixed-8"])
    diff, acc = stats["fixed-8"]["diff_to_full"], stats["fixed-8"]["value"]
    assert diff["lo"] <= diff["mean"] <= diff["hi"] and diff["lo"] > 0  # the shift is resolved
    assert diff["halfwidth"] < acc["halfwidth"] / 5  # far narrower than the unpaired accuracy CI
    assert stats["full"]["diff_to_full"]["halfwidth"] == 0.0


def test_seeds_are_averaged_per_problem_and_unequal_problem_counts_refuse() -> None:
    runs = [{"method": "full", "seed": s, "eval_scores": {"accuracy": v}} for s, v in ((0, [1.0, 0.0]), (1, [0.0, 0.0]))]
    assert paired_stats(runs, ["full"])["full"]["value"]["mean"] == pytest.approx(0.25)
    runs.append({"method": "full", "seed": 2, "eval_scores": {"accuracy": [1.0]}})
    with pytest.raises(ValueError, match="same"):
        paired_stats(runs, ["full"])


def test_regret_is_distance_to_each_tasks_best_and_worst_case_is_the_maximum() -> None:
    acc = {"chain": {"full": 0.5, "fixed-32": 0.6, "adwin-0.7": 0.55},
           "chain-late": {"full": 0.7, "fixed-32": 0.2, "adwin-0.7": 0.65}}
    r = regrets(acc)
    assert r["fixed-32"]["per_task"] == {"chain": 0.0, "chain-late": pytest.approx(0.5)}
    assert r["fixed-32"]["worst"] == pytest.approx(0.5) and r["adwin-0.7"]["worst"] == pytest.approx(0.05)


def test_final_scores_are_the_last_evaluation_per_problem_and_a_wrong_count_refuses() -> None:
    from adwin.loop.evaluate import EvalRows

    initial = EvalRows(0, 2, {"accuracy": [0.0] * 6, "lines_right": [0.0] * 6})
    final = EvalRows(0, 2, {"accuracy": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0], "lines_right": [0.5, 0.25, 1, 1, 0, 0]})
    assert final_eval_scores([initial, final]) == {"accuracy": [0.5, 1.0, 0.0], "lines_right": [0.375, 1.0, 0.0]}
    with pytest.raises(RuntimeError, match="eval.every"):
        final_eval_scores([final])
    assert final_eval_scores([final], evaluations=1)["accuracy"] == [0.5, 1.0, 0.0]  # the start-of-run one was shared
    with pytest.raises(RuntimeError, match="eval.every"):
        final_eval_scores([initial, final], evaluations=1)
    with pytest.raises(RuntimeError, match="answer"):  # no accuracy: a prompt without an answer
        final_eval_scores([EvalRows(0, 1, {"lines_right": [1.0]})], evaluations=1)


def test_paired_statistics_are_taken_per_measure_that_every_run_has() -> None:
    runs = [{"method": "full", "seed": 0, "eval_scores": {"accuracy": [0.0, 0.0], "lines_right": [0.1, 0.2]}},
            {"method": "adwin-0.7", "seed": 0, "eval_scores": {"accuracy": [1.0, 0.0], "lines_right": [0.3, 0.2]}}]
    assert measures_of(runs) == ["accuracy", "lines_right"]
    lines = paired_stats(runs, ["full", "adwin-0.7"], "lines_right")
    assert lines["adwin-0.7"]["value"]["mean"] == pytest.approx(0.25)
    assert lines["adwin-0.7"]["diff_to_full"]["mean"] == pytest.approx(0.1)
    runs[0]["eval_scores"].pop("lines_right")
    assert measures_of(runs) == ["accuracy"]  # a measure one run lacks is not paired


def test_unknown_task_is_refused_naming_the_known_ones() -> None:
    assert parse_tasks("chain-late, chain,chain-late") == ["chain-late", "chain"]
    with pytest.raises(ValueError, match="chain, chain-drift, chain-late"):
        parse_tasks("chain,chian")


def test_tiny_compare_across_two_tasks_writes_regret_page(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    rc = main(["bench", "compare", "--profile", "tiny", "--tasks", "chain,chain-late",
               "--methods", "full,fixed-8,adwin-0.7", "--out", str(tmp_path / "out")])
    assert rc == 0
    (folder,) = (tmp_path / "out").iterdir()
    suite = json.loads((folder / "suite.json").read_text())
    # fixed-8 is the second rung of both tasks' tiny ladder (4, 8, 12): one row by rung, one by value
    assert set(suite["regret"]) == {"full", "fixed-8", "fixed-rung2", "adwin-0.7"}
    assert suite["regret"]["fixed-rung2"] == suite["regret"]["fixed-8"]
    assert set(suite["regret"]["full"]["per_task"]) == {"chain", "chain-late"}
    assert min(v["per_task"]["chain"] for v in suite["regret"].values()) == 0.0
    assert suite["token_ratio_mean"]["full"] == pytest.approx(1.0)
    for task in ("chain", "chain-late"):
        res = json.loads((folder / task / "results.json").read_text())
        assert res["meta"]["task"] == task and {r["task"] for r in res["runs"]} == {task}
        assert all(len(r["eval_scores"]["accuracy"]) == 4 for r in res["runs"])  # the tiny budget's 4 problems
        assert res["methods"]["fixed-8"]["paired"]["accuracy"]["diff_to_full"]["n"] == 4
        assert res["methods"]["fixed-8"]["paired"]["lines_right"]["diff_to_full"]["n"] == 4  # every built-in task
        assert ("closing_right" in res["methods"]["full"]["paired"]) == (task == "chain-late")
        assert (folder / task / "audits.png").read_bytes()[:4] == b"\x89PNG"
    page = (folder / "index.html").read_text()
    assert len(suite["goal_lines"]) == 4 and all(line.endswith("MET") for line in suite["goal_lines"])
    assert "worst-case regret" in page and "chain-late/index.html" in page and not math.isnan(
        suite["regret"]["adwin-0.7"]["worst"])
