"""How ``adwin bench compare`` shapes and sizes a run per task: each task's horizon and candidate ladder on
top of the base config, the five-task suite's steps and evaluation problems per task, and the planned cost
printed before the runs start (docs/benchmarks.md, "The five-task suite").

The cost model (seconds on one idle core of the reference machine, SFT step 0.080 s) is deliberately
simple: a run costs ``RUN_OVERHEAD_S`` (process start, model load) + steps x rollouts per step x the
window a method trains x ``TOKEN_S`` x the task's per-token factor (a step generates its batch until the
longest row stops or reaches the window, and trains on the padded batch: its cost follows the window, not
the mean response), plus one evaluation of ``n`` problems at ``EVAL_PROBLEM_S`` per short-task problem x
(the task's mean response / the short tasks') x the per-token factor (evaluation drops stopped rows: its
cost follows the mean response); a seed adds its shared start-of-run evaluation. ``--jobs`` runs share
the cores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from adwin.bench.compare_methods import Method
from adwin.tasks.chain import MAX_RESPONSE_TOKENS
from adwin.tasks.suite import BuiltinTask, get_task

SUITE_TASKS = ("chain", "chain-drift", "chain-late", "chain-long", "chain-late-long")
SUITE_CONFIG = "suite"  # configs/suite.yaml
TINY_HORIZON, TINY_CANDIDATES = 16, (4, 8, 12)  # the tiny profile's chain shape; other tasks scale it

# reference figures, one idle core (docs/benchmarks.md, "make run": 65.5 s of training for 40 steps of 128
# rollouts at a window of ~100 tokens (128 -> 64), 11.5 s for 3 x 128 evaluation problems)
TOKEN_S = 0.13e-3  # seconds per rollout x window token on a short task (generate, score, train, its decisions)
EVAL_PROBLEM_S = 0.030  # seconds per evaluation problem on a short task (T = 1, k = 1)
RUN_OVERHEAD_S = 5.0  # process start, model load, checkpoint
# mean response tokens of the students (docs/task.md: ~110 on chain, 566 median / up to 2,048 on chain-long)
MEAN_RESPONSE = {"short": 120, "long": 800}
# a long-task token costs more (attention over 10x the context): SFT step 5.0 s vs 1.0 s at 3.5x the tokens
TOKEN_FACTOR = {"short": 1.0, "long": 1.45}


@dataclass(frozen=True)
class Sizing:
    steps: int
    eval_problems: int


# per mode and regime; the seeds are the mode's (compare.SEEDS). Arithmetic: docs/benchmarks.md
SIZING: dict[str, dict[str, Sizing]] = {
    "default": {"short": Sizing(20, 1024), "long": Sizing(8, 192)},
    "quick": {"short": Sizing(6, 64), "long": Sizing(3, 24)},
    "tiny": {"short": Sizing(2, 4), "long": Sizing(2, 4)},
}


def regime(task: BuiltinTask) -> str:
    return "long" if task.horizon > MAX_RESPONSE_TOKENS else "short"


def task_shape(task: BuiltinTask, profile: str) -> tuple[int, list[int]]:
    """The horizon and candidate ladder of ``task``'s runs: its own, or on the tiny profile the tiny chain
    shape scaled by the task's horizon over chain's (the tiny models never stop: short rollouts keep it fast)."""
    if profile != "tiny":
        return task.horizon, list(task.candidates)
    f = task.horizon / MAX_RESPONSE_TOKENS
    return round(TINY_HORIZON * f), [round(c * f) for c in TINY_CANDIDATES]


def scaled_initial(initial: int | None, base_horizon: int, horizon: int, candidates: Sequence[int]) -> int | None:
    """The base's initial window at the same share of the new horizon: the largest candidate at or below
    it (the smallest when none is); None stays None (the largest candidate)."""
    if initial is None:
        return None
    target = initial * horizon / base_horizon
    below = [c for c in candidates if c <= target]
    return max(below) if below else min(candidates)


def task_config(base: Any, task: str, profile: str, fixed_keys: Sequence[str] = (),
                eval_problems: int | None = None) -> Any:
    """``base`` for ``task``: its built-in task, horizon, ladder and scaled initial window, and its evaluation
    size. Keys in ``fixed_keys`` (the user's ``--set``) keep the base's value."""
    t = get_task(task)
    horizon, candidates = task_shape(t, profile)
    rollout, window = {}, {}
    if "rollout.max_response_len" not in fixed_keys:
        rollout["max_response_len"] = horizon
    if "window.candidates" not in fixed_keys:
        window["candidates"] = candidates
        if "window.initial" not in fixed_keys:
            window["initial"] = scaled_initial(base.window.initial, base.rollout.max_response_len, horizon,
                                               candidates)
    update: dict[str, Any] = {"data": base.data.model_copy(update={"builtin_task": task}),
                              "rollout": base.rollout.model_copy(update=rollout),
                              "window": base.window.model_copy(update=window)}
    if eval_problems is not None and "eval.n_problems" not in fixed_keys:
        update["eval"] = base.eval.model_copy(update={"n_problems": eval_problems})
    from adwin.config import TrainConfig

    return TrainConfig.model_validate(base.model_copy(update=update).model_dump(mode="json"))


def rollout_tokens(method: Method, horizon: int, steps: int, initial: int | None = None) -> float:
    """Window tokens one rollout of ``method`` costs, on average over ``steps`` (a batch runs to its window:
    some row nearly always does); ADWIN stays at its ``initial`` window (None: the horizon) and adds its
    probes' full rollouts (P = 1/16 of the batch, extended to the horizon and audited: counted twice)."""
    policy = method.overrides.get("window.policy")
    if policy == "fixed":
        return min(method.overrides["window.window"], horizon)
    if policy == "linear":
        from adwin.policies.schedules import LinearWindow

        linear = LinearWindow(method.overrides["window.start"], method.overrides["window.step"], horizon)
        return sum(linear.window(i) for i in range(steps)) / max(steps, 1)
    if policy == "adwin":
        return min(initial or horizon, horizon) + 2 * horizon / 16
    return float(horizon)


def plan(tasks: Sequence[tuple[str, Any, Sequence[Method]]], seeds: int, jobs: int) -> dict[str, Any]:
    """Estimated core-seconds per task and wall in all, for (task, its config, its methods). Tasks run one
    after the other, the runs of a task ``jobs`` at a time (each one thread; a probe worker's thread shares
    the same cores): a task's wall is its core-seconds / jobs, and at least its longest run."""
    per_task: dict[str, float] = {}
    wall = 0.0
    for name, cfg, methods in tasks:
        task = get_task(name)
        r = regime(task)
        horizon = cfg.rollout.max_response_len
        length = min(MEAN_RESPONSE[r] * horizon / task.horizon, horizon)
        batch = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
        evaluation = (cfg.eval.n_problems * cfg.eval.k * EVAL_PROBLEM_S * length / MEAN_RESPONSE["short"]
                      * TOKEN_FACTOR[r]) + RUN_OVERHEAD_S
        runs = [evaluation + cfg.steps * batch * TOKEN_S * TOKEN_FACTOR[r]
                * rollout_tokens(m, horizon, cfg.steps, cfg.window.initial) for m in methods]
        per_task[name] = seeds * (sum(runs) + evaluation)
        wall += max(per_task[name] / max(jobs, 1), max(runs, default=0.0))
    return {"core_s": per_task, "total_core_s": sum(per_task.values()), "wall_s": wall, "jobs": jobs,
            "runs": seeds * sum(len(m) for _, _, m in tasks), "seeds": seeds, "tasks": len(tasks)}


def plan_line(p: dict[str, Any], profile: str = "default") -> str:
    head = f"planned: {p['tasks']} task(s), {p['runs']} runs ({p['seeds']} seed(s))"
    if profile == "tiny":  # the cost model is the default profile's models; the tiny ones take seconds
        return head + ", tiny profile: seconds"
    per = ", ".join(f"{t} {s / 60:.0f}" for t, s in p["core_s"].items())
    return (f"{head}, estimated {math.ceil(p['wall_s'] / 60)} min at {p['jobs']} job(s) on an idle machine "
            f"(core-minutes per task: {per}; reference: SFT step 0.080 s)")
