"""What ``adwin bench compare`` will run, decided before the first run: each task's config and methods, its seeds,
the suite's sizing (``adwin.bench.compare_sizing``) and the planned cost (``adwin.bench.compare_plan``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adwin.bench.compare_methods import (
    Method,
    all_methods,
    quick_keys,
    select_methods,
    suite_keys,
    suite_quick_keys,
)


@dataclass
class Setup:
    """What a compare will run, decided before the first run: the shaped tasks, their seeds, the plan and its
    sizing lines (``adwin.bench.compare_sizing``)."""

    mode: str
    tasks: list[str]
    seeds: list[int]
    config_path: Path
    base: Any
    shaped: list[tuple[str, Any, list[Method]]]
    seeds_of: dict[str, list[int]]
    planned: dict[str, Any]
    notes: list[str]

    def plan_lines(self, profile: str) -> list[str]:
        from adwin.bench.compare_plan import plan_line

        return [plan_line(self.planned, profile), *self.notes]


def setup(args: argparse.Namespace) -> Setup:
    """Shape every task, size the suite and plan it; sets ``args.jobs`` when it was left to its default."""
    from adwin.bench.compare import SEEDS, STEPS, base_overrides, parse_seeds, parse_tasks
    from adwin.bench.compare_plan import SUITE_CONFIG, SUITE_TASKS, plan
    from adwin.bench.compare_sizing import size_suite
    from adwin.config import load_config, resolve_config
    from adwin.tasks.suite import DEFAULT_TASK

    mode = "tiny" if args.profile == "tiny" else "quick" if args.quick else "default"
    tasks = parse_tasks(args.tasks) if args.tasks else list(SUITE_TASKS) if args.suite else [DEFAULT_TASK]
    config_path = resolve_config(args.config or (SUITE_CONFIG if args.suite else None)).path
    overrides = {"model.device": args.device} | base_overrides(args, mode, args.steps or STEPS[mode])  # --set wins
    base = load_config(config_path, overrides)
    seeds = parse_seeds(args.seeds, SEEDS[mode])

    def shape(sizes: dict[str, Any] | None) -> tuple[list[tuple[str, Any, list[Method]]], dict[str, list[int]]]:
        shaped = [(task, *shape_task(base, task, args, mode, sizes[task] if sizes else None, len(tasks)))
                  for task in tasks]
        return shaped, {t: task_seeds(seeds, sizes[t] if sizes else None, args.seeds) for t in tasks}

    # on a GPU every method of a task at once (docs/decisions.md, "Long tasks: a measure that moves, and the suite
    # sized from the learning curve")
    if args.jobs is None:
        args.jobs = (max(len(m) for _, _, m in shape(None)[0]) if args.device == "cuda"
                     else 1 if mode == "tiny" else 2)
    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")

    def estimate(sizes: dict[str, Any]) -> dict[str, Any]:
        shaped, by_task = shape(sizes)
        return plan(shaped, {t: len(s) for t, s in by_task.items()}, args.jobs, args.device)

    sizes, notes = size_suite(mode, args.device, tasks, estimate) if args.suite else (None, [])
    given = [f"--{k} {getattr(args, k)}" for k in ("steps", "seeds") if args.suite and getattr(args, k)]
    if given:
        notes.append(f"sizing: {' and '.join(given)} given: they replace the sizing's for every task")
    shaped, seeds_of = shape(sizes)
    planned = plan(shaped, {t: len(s) for t, s in seeds_of.items()}, args.jobs, args.device)
    return Setup(mode, tasks, seeds, config_path, base, shaped, seeds_of, planned, notes)


def shape_task(base: Any, task: str, args: argparse.Namespace, mode: str, size: Any, n_tasks: int) -> tuple[Any, list[Method]]:
    """``task``'s run config (its horizon, ladder and, in the suite, its ``size``: steps, batch, evaluation) and
    its methods."""
    from adwin.bench.compare_plan import task_config
    from adwin.config import parse_set

    cfg = task_config(base, task, args.profile, list(parse_set(args.set)), size.eval_problems if size else None,
                      size.prompts_per_step if size else None, size.eval_batch if size else None)
    if size and not args.steps:
        cfg = cfg.model_copy(update={"steps": size.steps})
    methods = all_methods(cfg.rollout.max_response_len, list(cfg.window.candidates),
                          samples_per_step=cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt,
                          window_policy=cfg.window.policy)
    cands = list(cfg.window.candidates)
    default_keys = ((suite_quick_keys(cands) if args.suite else quick_keys(cands)) if mode != "default"
                    else suite_keys(cands) if n_tasks > 1 else None)
    try:
        return cfg, select_methods(args.methods, methods, default_keys)
    except ValueError as e:
        raise ValueError(f"task {task}: {e}") from e


def task_seeds(seeds: list[int], size: Any, spec: str | None) -> list[int]:
    """The seeds a task runs: the sizing's count unless ``--seeds`` named them."""
    return list(range(size.seeds)) if size is not None and size.seeds and spec is None else seeds
