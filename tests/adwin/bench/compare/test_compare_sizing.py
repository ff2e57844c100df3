"""The suite's sizing (``adwin.bench.compare.sizing``): the long tasks at the learning curve's steps, the short tasks
at the most seeds that fit, a cut said out loud when the steps do not fit; the CPU, quick and GPU plans as printed."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import pytest

from adwin.bench.compare import sizing as compare_sizing
from adwin.bench.compare.plan import SIZING, SUITE_TASKS, Sizing
from adwin.bench.compare.setup import setup
from adwin.bench.compare.sizing import (
    CPU_BUDGET_MIN,
    GPU_LONG_TASK_MIN,
    SHORT_SEEDS,
    size_suite,
    steps_to_move,
)

LONGS = ("chain-long", "chain-late-long")


def _estimate(short_run_min: float, long_step_min: float):
    """A cost model of the suite: a short task costs its seeds x ``short_run_min``, a long one its steps x
    ``long_step_min``; the wall is the sum (no GPU: every task's wall alike)."""

    def estimate(sizes: Mapping[str, Sizing]) -> dict[str, Any]:
        walls = {t: 60 * (s.steps * long_step_min if t in LONGS else (s.seeds or 2) * short_run_min)
                 for t, s in sizes.items()}
        return {"wall_s": sum(walls.values()), "task_wall_s": walls}

    return estimate


@pytest.fixture
def curve(monkeypatch) -> None:
    """A curve, and a budget of 120 min: the arithmetic below is the sizing's, whatever the shipped budget."""
    monkeypatch.setattr(compare_sizing, "CURVE", {"chain-long": (30, 40), "chain-late-long": (None, 45)})
    monkeypatch.setattr(compare_sizing, "CPU_BUDGET_MIN", 120.0)


def test_the_long_tasks_run_the_curves_steps_and_the_short_tasks_the_most_seeds_that_fit(curve) -> None:
    assert steps_to_move("chain-long") == (30, True) and steps_to_move("chain-late-long") == (45, False)
    # 2 x 30 + 2 x 45 = 150 min of long steps... too much at 1 min a step; at 0.5 min: 37.5 min, leaving 82.5
    sizes, notes = size_suite("default", "cpu", SUITE_TASKS, _estimate(short_run_min=6.0, long_step_min=0.5))
    assert sizes["chain-long"].steps == 30 and sizes["chain-late-long"].steps == 45
    assert sizes["chain-long"].prompts_per_step == SIZING["default"]["long"].prompts_per_step
    assert {sizes[t].seeds for t in ("chain", "chain-drift", "chain-late")} == {4}  # 3 x 4 x 6 = 72 <= 82.5 < 90
    assert "moved lines_right beyond its CI" in notes[0] and "did not move closing_right" in notes[1]
    assert "the short tasks at 4 seeds" in notes[2] and "120-min budget" in notes[2]
    sizes, notes = size_suite("default", "cpu", SUITE_TASKS, _estimate(short_run_min=1.0, long_step_min=0.5))
    assert sizes["chain"].seeds == SHORT_SEEDS[0] == 5


def test_steps_that_do_not_fit_are_cut_to_what_fits_and_the_plan_says_so(curve) -> None:
    sizes, notes = size_suite("default", "cpu", SUITE_TASKS, _estimate(short_run_min=5.0, long_step_min=2.0))
    # 3 tasks x 2 seeds x 5 = 30 min; 90 min left for 2 x (30 + 45) = 150 min of long steps: cut to 3/5 of them
    assert {sizes[t].seeds for t in ("chain", "chain-drift", "chain-late")} == {SHORT_SEEDS[-1]}
    assert sizes["chain-long"].steps == 18 and sizes["chain-late-long"].steps == 27
    assert _estimate(5.0, 2.0)(sizes)["wall_s"] <= 120 * 60
    assert notes[-1].startswith("sizing: DOES NOT FIT") and "chain-long 18, chain-late-long 27 steps instead" in notes[-1]


def test_quick_and_tiny_keep_their_fixed_sizing(curve) -> None:
    for mode in ("quick", "tiny"):
        sizes, notes = size_suite(mode, "cpu", SUITE_TASKS, _estimate(100.0, 100.0))
        assert sizes["chain-long"] == SIZING[mode]["long"] and sizes["chain"] == SIZING[mode]["short"]
        assert notes == [f"sizing: {mode}: the fixed smoke sizing (adwin.bench.compare.plan.SIZING), not the curve's "
                         "steps"]


def test_on_a_gpu_each_long_task_must_fit_its_own_minutes(curve) -> None:
    def estimate(sizes: Mapping[str, Sizing]) -> dict[str, Any]:
        walls = {t: 60 * (s.steps * 0.4 if t in LONGS else 100.0) for t, s in sizes.items()}  # short tasks: no limit
        return {"wall_s": sum(walls.values()), "task_wall_s": walls}

    sizes, notes = size_suite("default", "cuda", SUITE_TASKS, estimate)
    assert sizes["chain"].seeds == SHORT_SEEDS[0] and sizes["chain"].eval_problems == 1024
    assert sizes["chain-long"].prompts_per_step is None  # the preset's 128 rollouts: a GPU batches them at once
    assert sizes["chain-long"].steps == 25 and sizes["chain-late-long"].steps == 25  # 25 x 0.4 = 10 min: fits
    assert "DOES NOT FIT" in notes[-1] and f"{GPU_LONG_TASK_MIN:.0f} min per long task" in notes[-1]


def _args(**over: Any) -> argparse.Namespace:
    base = {"profile": "default", "tasks": None, "suite": True, "quick": False, "methods": None, "seeds": None,
            "steps": None, "config": None, "set": [], "assets_seed": 0, "out": "unused", "no_plots": True,
            "jobs": None, "device": "cpu"}
    return argparse.Namespace(**(base | over))


def test_the_cpu_suite_gives_the_long_tasks_their_curves_steps_and_three_seeds_within_four_hours() -> None:
    run = setup(_args())
    lines = run.plan_lines("default")
    assert run.planned["wall_s"] <= CPU_BUDGET_MIN * 60 <= 4 * 60 * 60
    assert lines[0].startswith(f"planned: 5 task(s), {run.planned['runs']} runs") and "2 job(s)" in lines[0]
    assert not any("DOES NOT FIT" in line for line in lines)
    cfg = {t: c for t, c, _ in run.shaped}
    for task in LONGS:
        assert any(line.startswith(f"sizing: {task}: ") for line in lines)
        assert cfg[task].steps == steps_to_move(task)[0] and len(run.seeds_of[task]) >= 3
    for task in ("chain", "chain-drift", "chain-late"):  # the short tasks as before: 20 steps, 1,024 problems
        assert cfg[task].steps == 20 and cfg[task].eval.n_problems == 1024 and len(run.seeds_of[task]) >= 2
    assert any("the short tasks at" in line and "seeds, the most of 5" in line for line in lines)


def test_plan_prints_the_plan_and_runs_nothing(tmp_path, capsys) -> None:
    from adwin.cli import main

    out = tmp_path / "out"
    assert main(["bench", "compare", "--suite", "--plan", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    run = setup(_args())
    assert printed.startswith(run.plan_lines("default")[0][:40]) and "min at 2 job(s)" in printed
    for task, cfg, chosen in run.shaped:
        rollouts = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
        assert (f"{task}: {cfg.steps} steps of {rollouts} rollouts x {len(run.seeds_of[task])} seed(s), "
                f"{len(chosen)} methods") in printed
    assert not out.exists()


def test_the_quick_suite_plans_at_most_ten_minutes() -> None:
    run = setup(_args(quick=True))
    assert run.planned["wall_s"] <= 10 * 60 and run.notes[0].startswith("sizing: quick")
    assert {len(s) for s in run.seeds_of.values()} == {1}


def test_the_gpu_suite_runs_every_method_of_a_task_at_once_within_ten_minutes_a_long_task() -> None:
    run = setup(_args(device="cuda"))
    assert run.base.model.device == "cuda"
    assert run.planned["jobs"] == max(len(m) for _, _, m in run.shaped) == 8  # the goal's eight methods at once
    for task in LONGS:
        assert run.planned["task_wall_s"][task] <= GPU_LONG_TASK_MIN * 60
    lines = run.plan_lines("default")
    assert "on one GPU, 8 runs at once" in lines[0] and "UNMEASURED" in lines[0]
    cfg = dict((t, c) for t, c, _ in run.shaped)["chain-long"]
    assert cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt == 128 and cfg.probes.batch_size == 8
    assert len(run.seeds_of["chain"]) == SHORT_SEEDS[0]


def test_steps_or_seeds_given_on_the_command_line_replace_the_sizing_and_the_plan_says_so() -> None:
    run = setup(_args(steps=3, seeds="1"))
    assert {c.steps for _, c, _ in run.shaped} == {3} and {len(s) for s in run.seeds_of.values()} == {1}
    assert run.notes[-1] == "sizing: --steps 3 and --seeds 1 given: they replace the sizing's for every task"
