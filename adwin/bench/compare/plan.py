"""How ``adwin bench compare`` shapes and sizes a run per task: each task's horizon and candidate ladder on
top of the base config, the five-task suite's steps and evaluation problems per task, and the planned cost
printed before the runs start (``--plan`` prints it alone; docs/benchmarks.md, "The five-task suite").

The cost model (seconds on one core, two runs at a time on the 2-core machine) is deliberately simple: a run costs
``RUN_OVERHEAD_S`` (process start, model load) + steps x rollouts per step x ``rollout_s`` of the window a method
trains (a step generates its batch until the longest row stops or reaches the window, and trains on the padded
batch: its cost follows the window, not the mean response; on the long tasks it grows faster than the window,
``LONG_GROWTH``), plus one evaluation of ``n`` problems at ``EVAL_PROBLEM_S`` of the task's regime; a seed adds its
shared start-of-run evaluation. ``--jobs`` runs share the cores. The figures are the CPU seconds (process time,
one torch thread) of the suite's own steps and evaluations at fixed windows, so a loaded machine inflates them
less than it does wall clocks; the long tasks' are measured on ``chain-long`` (docs/benchmarks.md, "Sizing").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adwin.bench.compare.methods import Method
from adwin.tasks.chain import MAX_RESPONSE_TOKENS
from adwin.tasks.suite import BuiltinTask, get_task

SUITE_TASKS = ("chain", "chain-drift", "chain-late", "chain-long", "chain-late-long")
SUITE_CONFIG = "suite"  # configs/suite.yaml
TINY_HORIZON, TINY_CANDIDATES = 16, (4, 8, 12)  # the tiny profile's chain shape; other tasks scale it

# CPU seconds of the suite's steps at fixed windows (commit 79622ac, the lean CPU decode step and the batched
# per-sample audit in): chain's 128 rollouts 1.35 s a step at window 64 and 6.0 s at 320 (the batch stops near
# its longest response), 0.15-0.17 ms per rollout x window token
TOKEN_S = 0.155e-3  # seconds per rollout x window token on a short task (generate, score, train, its decisions)
RUN_OVERHEAD_S = 5.0  # process start, model load, checkpoint
# seconds per evaluation problem (T = 1, k = 1, eval.batch_size 64, forced lines scored): CPU seconds of one
# evaluation of the prepared students, 256 chain problems (8.3 s) and 64 chain-long problems (78 s, responses of
# 1,689 tokens on average): the long evaluation is no cheaper than before the lean step (1.1 s)
EVAL_PROBLEM_S = {"short": 0.033, "long": 1.2}
# a long-task rollout costs TOKEN_S x w x (1 + w / a + (w / b)^2): attention and the growing KV cache over 2,048
# positions. Fitted to chain-long's CPU seconds per rollout at windows 64, 256, 1,024 and 2,048 (0.0097, 0.046,
# 0.40 and 1.18 s: 32 rollouts a step, commit 79622ac), within 10 % of each. The fit before the lean decode step
# (0.010 to 3.7 s, wall clocks of the suite at 0a5a3b4) was (840, 680): the quadratic term is mostly gone
LONG_GROWTH = (920.0, 2650.0)


@dataclass(frozen=True)
class Sizing:
    steps: int
    eval_problems: int
    prompts_per_step: int | None = None  # None: the preset's; else P keeps the preset's share of the batch
    seeds: int | None = None  # None: the mode's (compare.SEEDS)
    eval_batch: int | None = None  # eval.batch_size; None: the preset's


# On a GPU (``--device cuda``; unmeasured: no GPU was available to this suite, docs/benchmarks.md "Sizing"). Decoding
# the 266k-parameter built-in models is latency-bound: a step costs its decoding positions (the window: the batch
# decodes until its longest row stops or reaches it), whatever the batch, at GPU_POSITION_S each. Estimated from the
# H100 probe benchmark (docs/benchmarks.md, "Probe workers"): 4.3 s per step of <= 512 positions of a 30-layer model,
# ~8 ms per position with its training step; the 4-layer built-in model launches fewer kernels per position, so half
GPU_POSITION_S = 4e-3
GPU_RUN_OVERHEAD_S = 20.0  # process start, CUDA context, model load
# every method of a task runs at once, one process each on one GPU: each slows the others (kernels interleave on the
# device, the processes share the host's cores); a guess, to be replaced by a measurement
GPU_SHARING = 2.0


# per mode and regime. Arithmetic: docs/benchmarks.md, "Sizing". A long-task step at the preset's 128 rollouts
# costs ~2.6 min for full-rollout OPD on one core, so the long tasks run 8 prompts x 4 rollouts (P = 2, still
# 1/16) at 3 seeds (one seed gives the goals' FLOPs and wall ratios no spread to judge by); the short tasks
# keep the preset's batch and the mode's seeds
LONG_SEEDS = 3
SIZING: dict[str, dict[str, Sizing]] = {
    "default": {"short": Sizing(20, 1024), "long": Sizing(8, 128, prompts_per_step=8, seeds=LONG_SEEDS)},
    "quick": {"short": Sizing(6, 64), "long": Sizing(2, 16, prompts_per_step=4)},
    "tiny": {"short": Sizing(2, 4), "long": Sizing(2, 4)},
}


# what the suite reads a task's regret and goal lines from: final-answer accuracy, except on the long tasks, where it
# needs every one of ~90 lines right and cannot resolve a method from its start (docs/decisions.md, "Long tasks: a
# measure that moves, and the suite sized from the learning curve"): there the share of chain lines right before the
# first wrong one (chain-long), and the closing line right, which is the skill chain-late-long's student lacks
# (adwin.tasks.suite.LineScore)
SUITE_MEASURES: dict[str, str] = {"chain-long": "lines_right", "chain-late-long": "closing_right"}


def suite_measure(task: str) -> str:
    """The measure the suite reads ``task``'s regret and goal from (``SUITE_MEASURES``, else accuracy)."""
    return SUITE_MEASURES.get(task, "accuracy")


def regime(task: BuiltinTask) -> str:
    return "long" if task.horizon > MAX_RESPONSE_TOKENS else "short"


# the window a long task's unresolved audits follow (window.unresolved): its initial window is a guess below most
# responses and its audits rarely resolve at the suite's probe batch, so holding it trains below the truth; the
# rule deciding on its cosines does not (docs/decisions.md, "Unresolved audits", "Which fallback")
UNRESOLVED_BY_REGIME: dict[str, str] = {"short": "hold", "long": "decide"}


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
                eval_problems: int | None = None, prompts_per_step: int | None = None,
                eval_batch: int | None = None) -> Any:
    """``base`` for ``task``: its built-in task, horizon, ladder and scaled initial window, its regime's fallback for
    unresolved audits (``UNRESOLVED_BY_REGIME``), its evaluation size, and its prompts per step with the probe batch P
    at the base's share of the rollout batch (at least 2).
    Keys in ``fixed_keys`` (the user's ``--set``) keep the base's value."""
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
    if "window.unresolved" not in fixed_keys:
        window["unresolved"] = UNRESOLVED_BY_REGIME[regime(t)]
    probes: dict[str, Any] = {}
    if prompts_per_step is not None and "rollout.prompts_per_step" not in fixed_keys:
        rollout["prompts_per_step"] = prompts_per_step
        if "probes.batch_size" not in fixed_keys:
            share = base.probes.batch_size / (base.rollout.prompts_per_step * base.rollout.samples_per_prompt)
            probes["batch_size"] = max(2, round(share * prompts_per_step * base.rollout.samples_per_prompt))
    update: dict[str, Any] = {"data": base.data.model_copy(update={"builtin_task": task}),
                              "rollout": base.rollout.model_copy(update=rollout),
                              "window": base.window.model_copy(update=window),
                              "probes": base.probes.model_copy(update=probes)}
    evaluation = {k: v for k, v in (("n_problems", eval_problems), ("batch_size", eval_batch))
                  if v is not None and f"eval.{k}" not in fixed_keys}
    if evaluation:
        update["eval"] = base.eval.model_copy(update=evaluation)
    from adwin.config import TrainConfig

    return TrainConfig.model_validate(base.model_copy(update=update).model_dump(mode="json"))


def rollout_s(window: float, r: str) -> float:
    """Seconds one rollout trained at ``window`` costs in regime ``r`` (generation, scoring, update)."""
    if r == "long":
        a, b = LONG_GROWTH
        return TOKEN_S * window * (1 + window / a + (window / b) ** 2)
    return TOKEN_S * window


def rollout_cost(method: Method, horizon: int, steps: int, r: str, initial: int | None = None,
                 initial_steps: int | None = None) -> float:
    """Seconds one rollout of ``method`` costs, on average over ``steps`` (a batch runs to its window: some row
    nearly always does); ADWIN trains at its ``initial`` window (None: the horizon) for ``initial_steps`` steps (None:
    all of them), at the horizon after, and adds its probes' full rollouts (P = 1/16 of the batch, extended to the
    horizon and audited: counted twice)."""
    policy = method.overrides.get("window.policy")
    if policy == "fixed":
        return rollout_s(min(method.overrides["window.window"], horizon), r)
    if policy == "linear":
        from adwin.policies.schedules import LinearWindow

        linear = LinearWindow(method.overrides["window.start"], method.overrides["window.step"], horizon)
        return sum(rollout_s(linear.window(i), r) for i in range(steps)) / max(steps, 1)
    if policy == "adwin":
        start = steps if initial_steps is None else min(initial_steps, steps)
        trained = (start * rollout_s(min(initial or horizon, horizon), r)
                   + (steps - start) * rollout_s(horizon, r)) / max(steps, 1)
        return trained + 2 * rollout_s(horizon, r) / 16
    return rollout_s(horizon, r)


def gpu_positions(method: Method, horizon: int, steps: int) -> float:
    """Decoding positions of one step of ``method`` on a GPU, on average over ``steps``. ADWIN is charged full's: its
    probes are continued to the horizon by later generate calls, whose positions a latency-bound decoder pays
    whatever the rows (conservative; unmeasured)."""
    policy = method.overrides.get("window.policy")
    if policy == "fixed":
        return float(min(method.overrides["window.window"], horizon))
    if policy == "linear":
        from adwin.policies.schedules import LinearWindow

        linear = LinearWindow(method.overrides["window.start"], method.overrides["window.step"], horizon)
        return sum(linear.window(i) for i in range(steps)) / max(steps, 1)
    return float(horizon)  # full, and ADWIN (see the docstring)


def gpu_run_s(cfg: Any, method: Method) -> tuple[float, float]:
    """(training, one evaluation) seconds of a run alone on a GPU: the steps' decoding positions, and the
    evaluation's batches of ``eval.batch_size`` rows each decoding to the horizon at worst."""
    horizon = cfg.rollout.max_response_len
    train = cfg.steps * gpu_positions(method, horizon, cfg.steps) * GPU_POSITION_S
    batches = math.ceil(cfg.eval.n_problems * cfg.eval.k / cfg.eval.batch_size)
    return train, batches * horizon * GPU_POSITION_S


def plan(tasks: Sequence[tuple[str, Any, Sequence[Method]]], seeds: int | Mapping[str, int],
         jobs: int, device: str = "cpu") -> dict[str, Any]:
    """Estimated core-seconds (on a GPU: device-seconds) per task, each task's wall and the wall in all, for (task,
    its config, its methods) and ``seeds`` per task (one count for all, or per task). Tasks run one after the other.
    On the CPU the runs of a task go ``jobs`` at a time (each one thread; a probe worker's thread shares the same
    cores): a task's wall is its core-seconds / jobs, and at least its longest run. On a GPU (``device`` cuda)
    ``jobs`` runs share the one device, each slowed by ``GPU_SHARING``: a task's wall is its waves of ``jobs`` runs,
    each as long as its longest run, plus the seeds' shared start-of-run evaluations."""
    per_task: dict[str, float] = {}
    task_wall: dict[str, float] = {}
    runs_in_all = 0
    for name, cfg, methods in tasks:
        n_seeds = seeds if isinstance(seeds, int) else seeds[name]
        r = regime(get_task(name))
        if device == "cpu":
            horizon = cfg.rollout.max_response_len
            batch = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
            evaluation = cfg.eval.n_problems * cfg.eval.k * EVAL_PROBLEM_S[r] + RUN_OVERHEAD_S
            # a long task's audits that decide take its window to the truth's, the horizon there, from the first
            # decision, about S steps in (docs/audit-truth.md); elsewhere ADWIN is charged at its initial window
            first = cfg.probes.staleness_limit if r == "long" and cfg.window.unresolved == "decide" else None
            runs = [evaluation + cfg.steps * batch * rollout_cost(m, horizon, cfg.steps, r, cfg.window.initial, first)
                    for m in methods]
            per_task[name] = n_seeds * (sum(runs) + evaluation)
            task_wall[name] = max(per_task[name] / max(jobs, 1), max(runs, default=0.0))
        else:
            costs = [gpu_run_s(cfg, m) for m in methods]
            evaluation = max((e for _, e in costs), default=0.0) + GPU_RUN_OVERHEAD_S
            runs = [GPU_RUN_OVERHEAD_S + train + e for train, e in costs]
            per_task[name] = n_seeds * (sum(runs) + evaluation)
            waves = [runs[i : i + jobs] for i in range(0, len(runs), max(jobs, 1))]
            task_wall[name] = n_seeds * (evaluation + sum(max(w) * (GPU_SHARING if len(w) > 1 else 1.0)
                                                          for w in waves))
        runs_in_all += n_seeds * len(methods)
    counts = sorted({seeds} if isinstance(seeds, int) else set(seeds.values()))
    return {"core_s": per_task, "total_core_s": sum(per_task.values()), "task_wall_s": task_wall,
            "wall_s": sum(task_wall.values()), "jobs": jobs, "device": device, "runs": runs_in_all,
            "seeds": "/".join(map(str, counts)), "tasks": len(tasks)}


def plan_line(p: dict[str, Any], profile: str = "default") -> str:
    head = f"planned: {p['tasks']} task(s), {p['runs']} runs ({p['seeds']} seed(s) per task)"
    if profile == "tiny":  # the cost model is the default profile's models; the tiny ones take seconds
        return head + ", tiny profile: seconds"
    per = ", ".join(f"{t} {s / 60:.0f}" for t, s in p["task_wall_s"].items())
    if p.get("device", "cpu") != "cpu":
        return (f"{head}, estimated {math.ceil(p['wall_s'] / 60)} min on one GPU, {p['jobs']} runs at once (minutes "
                f"per task: {per}; UNMEASURED: from GPU_POSITION_S = {GPU_POSITION_S * 1e3:.0f} ms per decoding "
                f"position, adwin.bench.compare.plan)")
    return (f"{head}, estimated {math.ceil(p['wall_s'] / 60)} min at {p['jobs']} job(s) on an idle machine "
            f"(minutes per task: {per}; from CPU seconds measured on the 2-core machine, adwin.bench.compare.plan)")
