"""How the five-task suite (``adwin bench compare --suite``) is sized: the long tasks run the steps full-rollout
OPD needs to move their measure (the learning curve, ``adwin bench curve``), the short tasks as many seeds as the
time allows, within a budget per device; and the lines the plan prints to say which sizing and why.

* CPU (``--device cpu``, 2 runs at a time on 2 cores): the whole suite within ``CPU_BUDGET_MIN``. The long tasks get
  their steps to move first; the short tasks then get the most seeds of ``SHORT_SEEDS`` that fit. When the long
  tasks' steps do not fit even with the fewest seeds, they are cut to what fits, and the plan says so.
* GPU (``--device cuda``, every method of a task at once on one device): each long task within
  ``GPU_LONG_TASK_MIN``, at the preset's batch (128 rollouts: on a latency-bound GPU the batch is nearly free) and
  the short tasks' evaluation size; the short tasks at the most seeds. Sized from an unmeasured estimate of the GPU
  step (``adwin.bench.compare.plan.GPU_POSITION_S``), which the plan says.

``--quick`` and ``--profile tiny`` keep their fixed sizing (``SIZING``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adwin.bench.compare.plan import SIZING, Sizing, regime, suite_measure
from adwin.tasks.suite import get_task

# the whole suite's plan on the 2-core machine: 4 hours less the margin by which the last measured suite outran its
# plan (138 min against 119, +16 %), less the ~14 min of that plan's undercharge of ADWIN on the long tasks, which the
# plan now charges (plan.rollout_cost's initial_steps): 138 against 133, +4 %
CPU_BUDGET_MIN = 230.0
GPU_LONG_TASK_MIN = 10.0  # one long task, its methods side by side on one GPU
SHORT_SEEDS = (5, 4, 3, 2)  # the short tasks' seeds, most first: the first that fits
# The learning curve (adwin bench curve at the suite's long sizing, 8 prompts x 4 rollouts, 128 problems, one seed;
# docs/benchmarks.md, "Learning curve"): per long task, the step at which full-rollout OPD's suite measure moved above
# its start on 2 evaluations in a row (None: not within the curve), and the steps the curve ran
# (measured at c63c654 with --eval-every 5: chain-long's lines_right above its start at steps 20 and 25; chain-late-long's
# closing_right never above its start through the evaluation at step 25)
CURVE: dict[str, tuple[int | None, int]] = {"chain-long": (20, 25), "chain-late-long": (None, 25)}
# the GPU sizing per regime (steps of the long tasks: from CURVE): evaluation as the CPU suite's short tasks, 256 rows
# decoded at once (a latency-bound evaluation costs its batches; 256 rows of 2,176 positions hold ~1 GB of KV cache)
GPU_SIZING: dict[str, Sizing] = {"short": Sizing(20, 1024, seeds=SHORT_SEEDS[0], eval_batch=256),
                                 "long": Sizing(8, 1024, seeds=1, eval_batch=256)}

# sizes per task -> the plan of ``adwin.bench.compare.plan.plan`` (its ``wall_s`` and ``task_wall_s``)
Estimate = Callable[[Mapping[str, Sizing]], Mapping[str, Any]]


def steps_to_move(task: str) -> tuple[int, bool]:
    """The steps the curve says full-rollout OPD needs on ``task``, and whether it moved within the curve (False: the
    curve's length, a lower bound)."""
    moved, ran = CURVE[task]
    return (moved, True) if moved is not None else (ran, False)


def _with(size: Sizing, **change: Any) -> Sizing:
    return dataclasses.replace(size, **change)


def size_suite(mode: str, device: str, tasks: Sequence[str], estimate: Estimate) -> tuple[dict[str, Sizing], list[str]]:
    """Per task its sizing, and the plan's lines saying which and why."""
    if mode != "default":
        return {t: SIZING[mode][regime(get_task(t))] for t in tasks}, [
            f"sizing: {mode}: the fixed smoke sizing (adwin.bench.compare.plan.SIZING), not the curve's steps"]
    table = SIZING["default"] if device == "cpu" else GPU_SIZING
    longs = [t for t in tasks if regime(get_task(t)) == "long"]
    shorts = [t for t in tasks if t not in longs]
    need = {t: steps_to_move(t) for t in longs}
    notes = [_need_line(t, *need[t]) for t in longs]

    def sizes(seeds: int, steps: Mapping[str, int] | None = None) -> dict[str, Sizing]:
        out = {t: _with(table["short"], seeds=seeds) for t in shorts}
        return out | {t: _with(table["long"], steps=(steps or {}).get(t, need[t][0])) for t in longs}

    def fits(p: Mapping[str, Any]) -> bool:
        if device == "cpu":
            return p["wall_s"] <= CPU_BUDGET_MIN * 60
        return all(p["task_wall_s"][t] <= GPU_LONG_TASK_MIN * 60 for t in longs)

    def most_seeds(steps: Mapping[str, int] | None = None) -> int | None:
        return next((n for n in SHORT_SEEDS if fits(estimate(sizes(n, steps)))), None)

    seeds = most_seeds()
    if seeds is not None:
        if shorts:
            notes.append(f"sizing: the short tasks at {seeds} seeds, the most of {SHORT_SEEDS[0]} that fit "
                         f"{_budget(device)}")
        return sizes(seeds), notes
    # the long tasks' steps do not fit even at the fewest seeds: on the CPU the largest common share of them that fits
    # the budget, on a GPU each long task's most steps within its minutes; then the most seeds beside them
    fewest = SHORT_SEEDS[-1]
    steps = _cut_cpu(need, lambda st: fits(estimate(sizes(fewest, st)))) if device == "cpu" else {
        t: _largest(need[t][0], lambda k, t=t: fits_task(estimate(sizes(fewest, {t: k})), t)) for t in longs}
    seeds = most_seeds(steps) or fewest
    full = estimate(sizes(fewest))
    over = (f"{full['wall_s'] / 60:.0f} min" if device == "cpu" else
            ", ".join(f"{t} {full['task_wall_s'][t] / 60:.0f} min" for t in longs))
    cut = ", ".join(f"{t} {steps[t]}" for t in longs)
    notes.append(f"sizing: DOES NOT FIT: the long tasks' steps to move take {over} against {_budget(device)}; runs "
                 f"{cut} steps instead, before the curve moved: their measures will read near their start; the short "
                 f"tasks at {seeds} seeds")
    return sizes(seeds, steps), notes


def fits_task(p: Mapping[str, Any], task: str) -> bool:
    """One long task within its minutes on a GPU."""
    return p["task_wall_s"][task] <= GPU_LONG_TASK_MIN * 60


def _largest(most: int, ok: Callable[[int], bool]) -> int:
    """The largest ``k`` in 1..``most`` with ``ok(k)`` (costs grow with ``k``); 1 when none."""
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _cut_cpu(need: Mapping[str, tuple[int, bool]], ok: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """Every long task's steps at the largest common share of its need (in 1/1000ths) with ``ok``."""
    def at(share: int) -> dict[str, int]:
        return {t: max(1, need[t][0] * share // 1000) for t in need}

    return at(_largest(1000, lambda share: ok(at(share))))


def _budget(device: str) -> str:
    return (f"the {CPU_BUDGET_MIN:.0f}-min budget on 2 cores" if device == "cpu"
            else f"{GPU_LONG_TASK_MIN:.0f} min per long task on one GPU (estimate, unmeasured)")


def _need_line(task: str, steps: int, moved: bool) -> str:
    measure = suite_measure(task)
    if moved:
        return (f"sizing: {task}: {steps} steps, where full-rollout OPD moved {measure} beyond its CI on the learning "
                "curve (docs/benchmarks.md, \"Learning curve\")")
    return (f"sizing: {task}: {steps} steps, the whole learning curve, in which full-rollout OPD did not move "
            f"{measure} beyond its CI: a lower bound of what it needs")
