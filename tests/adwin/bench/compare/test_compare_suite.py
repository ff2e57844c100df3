"""The five-task suite of ``adwin bench compare``: per-task shapes, the preset, the goals computed from
results (met and not met), the planned cost, and the tiny-profile smoke run of all five tasks."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from adwin.bench.compare.goals import goal_lines, suite_goals, truth_segments
from adwin.bench.compare.methods import all_methods, select_methods
from adwin.bench.compare.plan import (
    SIZING,
    SUITE_CONFIG,
    SUITE_TASKS,
    plan,
    plan_line,
    regime,
    scaled_initial,
    suite_measure,
    task_config,
)
from adwin.bench.compare.setup import base_overrides
from adwin.bench.compare.suite import cross_task
from adwin.bench.compare.tasks import MEASURES, regrets
from adwin.cli import main
from adwin.config import load_config, resolve_config
from adwin.tasks.suite import get_task


def _suite_base(mode: str = "default") -> Any:
    args = argparse.Namespace(set=[], suite=True)
    return load_config(resolve_config(SUITE_CONFIG).path, base_overrides(args, mode, 20))


def test_the_suite_preset_is_proportioned_like_the_paper() -> None:
    base = _suite_base()
    batch = base.rollout.prompts_per_step * base.rollout.samples_per_prompt
    assert batch == 128 and base.probes.batch_size * 16 == batch  # P = 1/16 of the training batch
    assert base.probes.offers_per_step * base.probes.staleness_limit >= base.probes.batch_size  # P can fill
    assert base.probes.max_active >= base.probes.batch_size
    defaults = load_config(None, {})
    assert base.audit.budget == defaults.audit.budget == type(base.audit)().budget  # the budget at its default
    assert base.probes.backend == defaults.probes.backend  # the default (auto) probe backend, not compare's inline
    assert "adwin bench compare --suite" in resolve_config(SUITE_CONFIG).path.read_text().splitlines()[0]


@pytest.mark.parametrize("task", SUITE_TASKS)
def test_each_task_runs_at_its_own_horizon_and_ladder(task: str) -> None:
    t = get_task(task)
    cfg = task_config(_suite_base(), task, "default", eval_problems=SIZING["default"][regime(t)].eval_problems)
    assert cfg.data.builtin_task == task and cfg.rollout.max_response_len == t.horizon
    assert list(cfg.window.candidates) == list(t.candidates)
    assert cfg.window.initial in t.candidates and cfg.window.initial <= 0.4 * t.horizon  # 128/320 of the horizon
    fixed = [m for m in all_methods(t.horizon, list(t.candidates)) if m.rung is not None]
    assert [m.overrides["window.window"] for m in fixed] == list(t.candidates)
    assert [m.suite_names()[0] for m in fixed] == [f"fixed-rung{k}" for k in range(1, len(t.candidates) + 1)]


@pytest.mark.parametrize("mode", ["default", "quick"])
def test_a_sized_batch_keeps_p_at_its_share_of_the_rollouts(mode: str) -> None:
    base = _suite_base()
    for task in SUITE_TASKS:
        size = SIZING[mode][regime(get_task(task))]
        cfg = task_config(base, task, "default", eval_problems=size.eval_problems,
                          prompts_per_step=size.prompts_per_step)
        batch = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
        assert cfg.rollout.prompts_per_step == (size.prompts_per_step or base.rollout.prompts_per_step)
        assert cfg.probes.batch_size == max(2, batch // 16)  # the preset's 1/16, at least a pair
        assert cfg.probes.offers_per_step * cfg.probes.staleness_limit >= cfg.probes.batch_size  # P can fill


def test_a_user_set_batch_wins_over_the_sizing() -> None:
    cfg = task_config(_suite_base(), "chain-long", "default", prompts_per_step=8,
                      fixed_keys=["rollout.prompts_per_step"])
    assert cfg.rollout.prompts_per_step == 32 and cfg.probes.batch_size == 8
    cfg = task_config(_suite_base(), "chain-long", "default", prompts_per_step=8, fixed_keys=["probes.batch_size"])
    assert cfg.rollout.prompts_per_step == 8 and cfg.probes.batch_size == 8


@pytest.mark.parametrize("task", SUITE_TASKS)
def test_each_regime_follows_its_own_fallback_for_unresolved_audits(task: str) -> None:
    # held out, the long tasks' initial window sits below the truth's: holding it there trains below the truth
    cfg = task_config(_suite_base(), task, "default")
    assert _suite_base().window.unresolved == "hold"
    assert cfg.window.unresolved == ("decide" if regime(get_task(task)) == "long" else "hold")
    kept = task_config(_suite_base(), task, "default", fixed_keys=["window.unresolved"])
    assert kept.window.unresolved == "hold"  # the user's --set wins


def test_the_long_preset_lets_unresolved_audits_decide() -> None:
    assert load_config(resolve_config("long").path).window.unresolved == "decide"
    assert load_config(resolve_config("default").path).window.unresolved == "hold"


def test_long_rollouts_cost_more_than_their_window_share() -> None:
    from adwin.bench.compare.plan import rollout_s

    assert rollout_s(2048, "short") == pytest.approx(2 * rollout_s(1024, "short"))  # linear on short tasks
    long = [rollout_s(w, "long") for w in (512, 1024, 2048)]
    assert long[2] / long[1] > long[1] / long[0] > 2  # attention and the KV cache over the long context


def test_a_user_set_shape_wins_over_the_tasks() -> None:
    cfg = task_config(_suite_base(), "chain-long", "default", fixed_keys=["window.candidates"])
    assert cfg.rollout.max_response_len == 2048  # the task's horizon
    assert list(cfg.window.candidates) == [32, 64, 128, 192, 256] and cfg.window.initial == 128  # the --set ladder


def test_initial_window_keeps_its_share_of_the_horizon() -> None:
    assert scaled_initial(128, 320, 2048, [64, 128, 256, 512, 1024]) == 512
    assert scaled_initial(128, 320, 320, [32, 64, 128, 192, 256]) == 128
    assert scaled_initial(8, 320, 320, [32, 64]) == 32  # none below: the shortest
    assert scaled_initial(None, 320, 2048, [64]) is None


def test_rung_names_select_each_tasks_own_window() -> None:
    short, long = all_methods(320, [32, 64, 128, 192, 256]), all_methods(2048, [64, 128, 256, 512, 1024])
    assert [m.key for m in select_methods("fixed-rung2", short, None)] == ["full", "fixed-64"]
    assert [m.key for m in select_methods("fixed-rung2", long, None)] == ["full", "fixed-128"]


def _entry(acc: float, wall: float, flops: float, diff: tuple[float, float] | None = None,
           diffs: dict[str, tuple[float, float]] | None = None, seeds: int = 1) -> dict[str, Any]:
    """A method's results with ``acc`` as every measure (accuracy and the line measures), ``flops`` both as FLOPs
    and as their ratio to full (full's are 1), and ``diff`` as every paired difference to full (``diffs``: per
    measure, in its place); its FLOPs and wall carry a 10 % spread over ``seeds``."""
    sd = 0.1 if seeds > 1 else 0.0
    e: dict[str, Any] = {"metrics": {f"{m}_final": {"mean": acc} for m in MEASURES}
                         | {"flops": {"mean": flops, "std": sd * flops, "n": seeds},
                            "train_wall_s": {"mean": wall, "std": sd * wall, "n": seeds}},
                         "ratio_to_full": {"train_wall_s": wall, "flops": flops, "rollout_tokens": flops}}
    if diff is not None:
        e["paired"] = {m: {"diff_to_full": {"mean": sum(d) / 2, "lo": d[0], "hi": d[1], "halfwidth": 0.01, "n": 128}}
                       for m in MEASURES for d in [(diffs or {}).get(m, diff)]}
    return e


# chain-long's ADWIN windows that follow the truth of ``_goals`` (1,024 for steps 0-9, then the horizon)
FOLLOWS_TRUTH = [1024] * 10 + [2048] * 10


def _results(adwin_acc: float, adwin_wall: float, long_diff: tuple[float, float],
             adwin_flops: float = 0.5, long_diffs: dict[str, tuple[float, float]] | None = None,
             adwin_windows: list[int] | None = None, seeds: int = 1) -> tuple[dict, dict]:
    """Five tasks, full / linear / the ladder's fixed windows / ADWIN; ADWIN's accuracy, wall and FLOPs given (its
    paired difference to full on the long task is ``long_diff``, per measure ``long_diffs``, on the others
    (-0.02, +0.01)); on the long task ADWIN's runs (``seeds``) trained at ``adwin_windows`` (``FOLLOWS_TRUTH``)."""
    from adwin.bench.compare.methods import Method

    per_task, methods = {}, {}
    for task in SUITE_TASKS:
        t = get_task(task)
        cands = list(t.candidates)
        chosen = [m for m in all_methods(t.horizon, cands) if m.key in
                  ("full", "linear", "adwin-0.7", *(f"fixed-{c}" for c in cands))]
        assert all(isinstance(m, Method) for m in chosen)
        res = {"full": _entry(0.50, 1.0, 1.0, seeds=seeds), "linear": _entry(0.45, 0.7, 0.7)}
        for i, c in enumerate(cands):
            res[f"fixed-{c}"] = _entry(0.40 + 0.02 * i, 0.1 * (i + 1), 0.1 * (i + 1))
        long = task == "chain-long"
        res["adwin-0.7"] = _entry(adwin_acc, adwin_wall, adwin_flops, long_diff if long else (-0.02, 0.01),
                                  long_diffs if long else None, seeds=seeds)
        runs = [{"audit_overhead_frac": 0.05}] + [
            {"method": "adwin-0.7", "seed": s, "audit_overhead_frac": 0.04 + 0.01 * s,
             "windows": adwin_windows or FOLLOWS_TRUTH} for s in range(seeds) if long]
        per_task[task] = {"methods": res, "runs": runs, "meta": {"steps": 20, "horizon": t.horizon}}
        methods[task] = chosen
    return methods, per_task


def _goals(methods: dict, per_task: dict, share: float = 0.05, truth: dict | None = None) -> dict[str, Any]:
    measures = {t: suite_measure(t) for t in per_task}
    cross = cross_task(methods, per_task, measures)
    regret = regrets(cross["measure"])
    short = [t for t in per_task if regime(get_task(t)) == "short"]
    return suite_goals(per_task, regret, share, measures, {t: 0.01 for t in per_task}, short=short,
                       truth={"chain-long": [(0, 1024), (10, 2048)]} if truth is None else truth)


def test_a_truth_that_moves_is_charged_piecewise() -> None:
    assert truth_segments([(0, 1024), (10, 2048)], 20) == [(1024, 0.5), (2048, 0.5)]
    assert truth_segments([(5, 512), (30, 64)], 20) == [(512, 1.0)]  # the first from step 0; past the run: cut
    assert truth_segments([], 20) == []


def test_goals_are_met_when_the_numbers_meet_them() -> None:
    # chain-long's truth: 1,024 (fixed-1024 at 0.5 of full's FLOPs) then the horizon: 0.75 + 0.1 allowed
    goals = _goals(*_results(adwin_acc=0.49, adwin_wall=0.35, long_diff=(-0.03, 0.01), adwin_flops=0.8))
    assert all(goals[k]["met"] for k in ("decision_share", "short_tasks", "chain_long", "regret")) and goals["met"]
    assert goals["chain_long"]["truth_flops_ratio"] == pytest.approx(0.75)
    assert set(goals["short_tasks"]["tasks"]) == {"chain", "chain-drift", "chain-late"}
    assert "fixed-32" not in goals["regret"]["rivals"]  # not on the long tasks' ladder
    assert all(line.endswith(" MET") and "NOT" not in line for line in goal_lines(goals))


@pytest.mark.parametrize(("acc", "wall", "diff", "flops", "share", "failed"), [
    (0.49, 0.35, (-0.05, -0.01), 0.8, 0.05, "chain_long"),  # resolved below full on chain-long
    (0.49, 0.35, (-0.03, 0.01), 0.9, 0.05, "chain_long"),  # above the truth's windows' 0.75 + 0.1
    (0.49, 0.45, (-0.03, 0.01), 0.8, 0.05, "short_tasks"),  # 0.45x full's wall on the short tasks: above 0.4x
    (0.44, 0.35, (-0.03, 0.01), 0.8, 0.05, "regret"),  # worst-case regret 0.06, 0.02 above the lowest's + 0.01
    (0.49, 0.35, (-0.03, 0.01), 0.8, 0.11, "decision_share"),  # one run spent 11 % on decisions
])
def test_goals_are_not_met_when_one_number_misses(acc: float, wall: float, diff: tuple[float, float], flops: float,
                                                  share: float, failed: str) -> None:
    goals = _goals(*_results(acc, wall, diff, flops), share=share)
    assert not goals[failed]["met"] and not goals["met"]
    assert [line.endswith("NOT MET") for line in goal_lines(goals)] == \
        [k == failed for k in ("decision_share", "short_tasks", "chain_long", "regret")]


def test_without_the_truth_the_cost_goal_is_not_evaluated_and_not_met() -> None:
    goals = _goals(*_results(0.49, 0.35, (-0.03, 0.01), 0.8), truth={})
    assert goals["chain_long"]["not_resolved_below"] and not goals["chain_long"]["cost_evaluated"]
    assert not goals["chain_long"]["met"] and "--truth" in goal_lines(goals)[2]


@pytest.mark.parametrize(("windows", "met"), [
    ([512] * 20, False),  # every step below the truth, at 0.3x full's FLOPs: the FLOPs bound alone would pass it
    ([512] * 2 + FOLLOWS_TRUTH[2:], True),  # 2 of 20 below: 0.10, the bound
    ([512] * 3 + FOLLOWS_TRUTH[3:], False),  # 3 of 20: 0.15
    ([2048] * 20, True),  # above the truth is the FLOPs bound's business (0.3x full's here), never unsafe
])
def test_a_run_that_trains_below_the_truths_window_fails_the_two_sided_cost_goal(windows: list[int], met: bool) -> None:
    goals = _goals(*_results(0.49, 0.35, (-0.03, 0.01), adwin_flops=0.3, adwin_windows=windows))
    lg = goals["chain_long"]
    below = sum(w < t for w, t in zip(windows, FOLLOWS_TRUTH, strict=True))
    assert lg["flops_ok"] and lg["below_truth"]["below"] == below and lg["below_truth"]["steps"] == 20
    assert lg["below_truth"]["share"] == pytest.approx(below / 20) and lg["met"] is met
    line = goal_lines(goals)[2]
    assert f"steps below the truth's window {below}/20 = {below / 20:.2f} ≤ 0.10: {'yes' if met else 'no'}" in line
    assert line.endswith(" MET") and ("NOT MET" in line) is not met


def test_the_long_quality_goal_reads_teacher_forced_line_skill_with_its_paired_ci() -> None:
    # the suite's measured case: lines_right reads ~0 for everyone, teacher-forced line skill puts ADWIN below full
    goals = _goals(*_results(0.49, 0.35, (-0.001, 0.005), 0.8,
                             long_diffs={"forced_lines": (-0.041, -0.017)}))
    lg = goals["chain_long"]
    assert lg["measures"] == ["forced_lines", "accuracy"] and not lg["not_resolved_below"] and not lg["met"]
    assert lg["diff_to_full"]["forced_lines"]["hi"] == -0.017
    assert "forced_lines -0.029 [-0.041, -0.017]" in goal_lines(goals)[2]
    # and the other way round: a prefix that wins lines_right while line skill holds does not fail the goal
    goals = _goals(*_results(0.49, 0.35, (-0.01, 0.02), 0.8, long_diffs={"lines_right": (-0.05, -0.01)}))
    assert goals["chain_long"]["not_resolved_below"] and goals["chain_long"]["met"]


def test_every_goal_states_its_power_beside_its_verdict() -> None:
    goals = _goals(*_results(0.49, 0.35, (-0.03, 0.01), 0.8, seeds=3))
    mde = 0.01 * (1.959963984540054 + 0.8416212335729143) / 1.959963984540054  # from the paired half-width 0.01
    lg, st = goals["chain_long"], goals["short_tasks"]
    for m in ("forced_lines", "accuracy"):
        assert lg["power"][m]["halfwidth"] == 0.01 and lg["power"][m]["mde80"] == pytest.approx(mde)
    assert lg["power"]["below_share"]["n"] == 60  # 3 seeds x 20 steps, binomial at the 0.10 bound
    assert lg["power"]["below_share"]["halfwidth"] == pytest.approx(1.96 * math.sqrt(0.1 * 0.9 / 60), rel=1e-3)
    assert 0 < lg["power"]["flops_ratio"]["halfwidth"] < 0.2  # 10 % spread over 3 seeds, both methods
    assert all(0 < v["power"]["wall_ratio"]["halfwidth"] < 0.1 for v in st["tasks"].values())
    assert all(v["power"]["quality"]["mde80"] == pytest.approx(mde) for v in st["tasks"].values())
    assert goals["regret"]["power"]["halfwidth"] == 0.01
    shares = [0.05] * 5 + [0.04, 0.05, 0.06]  # every task's first run, then chain-long's three ADWIN runs
    assert goals["decision_share"]["power"]["n"] == len(shares)
    assert goals["decision_share"]["power"]["halfwidth"] == pytest.approx(
        1.96 * statistics.stdev(shares) / math.sqrt(len(shares)), rel=1e-3)
    for line in goal_lines(goals):
        assert "power" in line and "±" in line
    # one seed: the FLOPs ratio has no spread, and the line says so instead of printing a number
    one = _goals(*_results(0.49, 0.35, (-0.03, 0.01), 0.8, seeds=1))
    assert math.isnan(one["chain_long"]["power"]["flops_ratio"]["halfwidth"])
    assert "FLOPs" in goal_lines(one)[2] and "no spread to resolve with" in goal_lines(one)[2]


def test_regret_within_the_lowest_ones_ci_is_met() -> None:
    # ADWIN at 0.49 against full's 0.50 everywhere: worst regret 0.01, not the lowest (full's 0), within its 0.01
    goals = _goals(*_results(0.49, 0.35, (-0.03, 0.01), 0.8))
    r = goals["regret"]
    assert r["adwin_worst_regret"] > r["lowest"] and r["adwin_worst_regret"] - r["lowest"] == pytest.approx(0.01)
    assert r["met"]


def test_adwin_on_a_long_task_whose_audits_decide_is_charged_the_horizon_after_its_first_decision() -> None:
    from adwin.bench.compare.plan import rollout_cost, rollout_s

    (adwin,) = select_methods("adwin-0.7", all_methods(2048, [64, 128, 256, 512, 1024]), None)[1:]
    probes = 2 * rollout_s(2048, "long") / 16
    held = rollout_cost(adwin, 2048, 20, "long", 512)
    assert held == pytest.approx(rollout_s(512, "long") + probes)
    decided = rollout_cost(adwin, 2048, 20, "long", 512, initial_steps=5)
    assert decided == pytest.approx((5 * rollout_s(512, "long") + 15 * rollout_s(2048, "long")) / 20 + probes)
    base = _suite_base()
    cfg = task_config(base, "chain-long", "default").model_copy(update={"steps": 20})
    kept = task_config(base, "chain-long", "default", fixed_keys=["window.unresolved"]).model_copy(update={"steps": 20})
    assert cfg.window.unresolved == "decide" and kept.window.unresolved == "hold"
    runs = [adwin]
    assert plan([("chain-long", cfg, runs)], 1, 2)["total_core_s"] > plan([("chain-long", kept, runs)], 1, 2)["total_core_s"]


def test_the_suite_on_one_task_plans_the_goals_methods(capsys) -> None:
    assert main(["bench", "compare", "--suite", "--tasks", "chain-long", "--plan"]) == 0
    assert "chain-long: 20 steps of 32 rollouts x 3 seed(s), 8 methods" in capsys.readouterr().out


def test_planned_cost_grows_with_steps_seeds_and_problems_and_names_the_runs() -> None:
    base = _suite_base()
    shaped = []
    for task in ("chain", "chain-long"):
        cfg = task_config(base, task, "default", eval_problems=64).model_copy(update={"steps": 4})
        shaped.append((task, cfg, select_methods("full,fixed-rung1", all_methods(
            cfg.rollout.max_response_len, list(cfg.window.candidates)), None)))
    one = plan(shaped, seeds=1, jobs=2)
    assert plan(shaped, seeds=2, jobs=2)["total_core_s"] == pytest.approx(2 * one["total_core_s"])
    mixed = plan(shaped, seeds={"chain": 2, "chain-long": 1}, jobs=2)  # seeds per task
    assert mixed["core_s"]["chain"] == pytest.approx(2 * one["core_s"]["chain"])
    assert mixed["core_s"]["chain-long"] == pytest.approx(one["core_s"]["chain-long"]) and mixed["runs"] == 6
    assert plan(shaped, seeds=1, jobs=1)["wall_s"] == pytest.approx(one["total_core_s"])  # one run at a time
    assert one["total_core_s"] / 2 <= one["wall_s"] < one["total_core_s"]  # two at a time, bounded by the longest
    longer = [(t, c.model_copy(update={"steps": 8}), m) for t, c, m in shaped]
    assert plan(longer, seeds=1, jobs=2)["wall_s"] > one["wall_s"]
    assert one["core_s"]["chain-long"] > one["core_s"]["chain"]  # long rollouts cost more
    assert one["runs"] == 4 and "4 runs" in plan_line(one) and "min" in plan_line(one)


def test_tiny_suite_runs_the_five_tasks_with_their_shapes(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    rc = main(["bench", "compare", "--suite", "--profile", "tiny", "--out", str(tmp_path / "out"), "--no-plots"])
    assert rc == 0  # its size is asserted below, not its wall time: a shared machine's load makes that flaky
    out = capsys.readouterr().out
    assert out.index("planned: 5 task(s), 20 runs") < out.index("decision share: max over runs")
    (folder,) = (tmp_path / "out").iterdir()
    suite = json.loads((folder / "suite.json").read_text())
    assert set(suite["regret"]["full"]["per_task"]) == set(SUITE_TASKS)
    assert set(suite["goals"]) == {"decision_share", "short_tasks", "chain_long", "regret", "met"}
    assert suite["goals"]["chain_long"]["evaluated"] and suite["goals"]["regret"]["evaluated"]
    assert set(suite["goals"]["short_tasks"]["tasks"]) == {"chain", "chain-drift", "chain-late"}
    assert not suite["goals"]["chain_long"]["cost_evaluated"]  # no --truth given: the cost bound is not read
    horizons = {}
    for task in SUITE_TASKS:
        res = json.loads((folder / task / "results.json").read_text())
        horizons[task] = res["meta"]["horizon"]
        assert {r["task"] for r in res["runs"]} == {task}
        assert res["meta"]["methods"] == ["full", "linear", f"fixed-{res['meta']['candidates'][1]}", "adwin-0.7"]
        for r in res["runs"]:
            assert r["train_wall_s"] <= r["wall_s"] and r["learner_train_s"] <= r["train_wall_s"]
            assert 0.0 <= r["audit_overhead_frac"] <= 1.0
    assert horizons["chain"] < horizons["chain-long"] == horizons["chain-late-long"]
    assert not math.isnan(suite["max_decision_share"])
    # the same tables as markdown, for docs: one row per method, the goal lines under the cross-task table
    md = (folder / "suite.md").read_text()
    assert "| method | regret chain |" in md and all(line in md for line in suite["goal_lines"])
    table, forced = (folder / "chain-long" / "results.md").read_text().split("Teacher-forced line skill")
    rows = [x for x in table.splitlines() if x.startswith("| ")]
    assert len(rows) == 1 + 4 and rows[1].startswith("| full |")
    assert [x.split(" | ")[0] for x in forced.splitlines() if x.startswith("| ") and "---" not in x][1:] == \
        ["| full", "| linear", f"| fixed-{json.loads((folder / 'chain-long' / 'results.json').read_text())['meta']['candidates'][1]}", "| adwin-0.7"]
    assert "lines right [95% CI]" in rows[0]  # the long task's line measure beside accuracy
    assert out.index("sizing: tiny") < out.index("decision share: max over runs")
    # the regret and the long goal read each task's measure; the headline is per task, the goal lines under it
    assert suite["measures"] == {t: suite_measure(t) for t in SUITE_TASKS}
    assert suite["measures"]["chain-long"] == "lines_right"  # the regret's; the goal's quality: line skill
    assert suite["goals"]["chain_long"]["measures"] == ["forced_lines", "accuracy"]
    assert suite["goals"]["chain_long"]["diff_to_full"]["forced_lines"] is not None
    head = (folder / "headline.md").read_text()
    for task in SUITE_TASKS:
        assert f"**{task}** (measure: {suite_measure(task)};" in head
    table = head.split("**chain-long**")[1].split("**chain-late-long**")[0]
    assert [x.split(" | ")[0] for x in table.splitlines() if x.startswith("| ") and "---" not in x][1:] == \
        ["| full", "| linear", f"| fixed-{res['meta']['candidates'][1]}", "| adwin-0.7"]
    assert "Δ lines_right vs full [paired 95% CI]" in table and "accuracy [95% CI]" in table
    assert "Δ forced_lines vs full [paired 95% CI]" in table  # what the chain-long goal reads
    assert all(f"- {line}" in head for line in suite["goal_lines"])


def test_labels_of_neighbouring_points_at_one_regret_take_different_heights() -> None:
    from adwin.bench.compare.suite import label_offsets

    points = [(0.05, 0.047), (0.08, 0.047), (0.17, 0.047), (0.18, 0.047), (0.48, 0.047), (0.37, 0.039)]
    offsets = label_offsets(points)
    same_row = sorted(p for p in points if p[1] == 0.047)
    for a, b in zip(same_row, same_row[1:], strict=False):
        if b[0] - a[0] < 0.15:
            assert offsets[a] != offsets[b], f"{a} and {b} would overprint"
    assert offsets[(0.48, 0.047)] == offsets[(0.37, 0.039)] == (5, 4)  # far from any neighbour: the default height


def test_truth_files_are_read_per_task_and_a_bad_one_is_refused_before_any_run(tmp_path: Path) -> None:
    from adwin.bench.compare.command import read_truth

    good = tmp_path / "truth.json"
    good.write_text(json.dumps({"meta": {"task": "chain-long"}, "checkpoints": [
        {"step": 10, "truth_window": 2048}, {"step": 0, "truth_window": 1024}, {"step": 20, "truth_window": None}]}))
    # a checkpoint whose pool identified no truth is left out: its steps are charged at the one before
    assert read_truth([str(good)]) == {"chain-long": [(0, 1024), (10, 2048)]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"checkpoints": []}))
    out = tmp_path / "out"
    assert main(["bench", "compare", "--profile", "tiny", "--tasks", "chain,chain-long", "--truth", str(bad),
                 "--out", str(out)]) == 2
    # one task outside the suite has no cross-task goals: a truth given there would be read by nothing
    assert main(["bench", "compare", "--profile", "tiny", "--truth", str(good), "--out", str(out)]) == 2
    assert not (out.exists() and any(out.iterdir()))


def test_one_suite_task_reads_its_goal_with_the_truth(tmp_path: Path, monkeypatch, capsys) -> None:
    """``--suite --tasks chain-long --truth ...``: the long task's goal alone, cost bounds included."""
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"meta": {"task": "chain-long"}, "checkpoints": [{"step": 0, "truth_window": 4096}]}))
    rc = main(["bench", "compare", "--suite", "--tasks", "chain-long", "--methods", "full,adwin-0.7", "--profile",
               "tiny", "--truth", str(truth), "--out", str(tmp_path / "out"), "--no-plots"])
    assert rc == 0
    (folder,) = (tmp_path / "out").iterdir()
    suite = json.loads((folder / "suite.json").read_text())
    assert (folder / "chain-long" / "results.json").exists()
    goal = suite["goals"]["chain_long"]
    assert goal["evaluated"] and goal["cost_evaluated"]  # the truth at the horizon: full's FLOPs bound it
    assert goal["below_truth"]["steps"] > 0
    assert "chain-long: adwin-0.7 − full" in capsys.readouterr().out
