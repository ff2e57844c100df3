"""What ``adwin bench compare`` will run, decided before the first run: each task's config and methods, its seeds,
the suite's sizing (``adwin.bench.compare.sizing``) and the planned cost (``adwin.bench.compare.plan``); and what
the command line says of it (``--tasks``, ``--seeds``, the budget's overrides), which ``curve`` and the tests read
too."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adwin.bench.compare.methods import (
    Method,
    all_methods,
    quick_keys,
    select_methods,
    suite_keys,
    suite_quick_keys,
)
from adwin.tasks.suite import DEFAULT_TASK, TASK_NAMES, get_task

STEPS = {"default": 30, "quick": 8, "tiny": 2}
SEEDS = {"default": 2, "quick": 1, "tiny": 1}
TINY_OVERRIDES: dict[str, Any] = {  # a budget the test suite can afford (< 60 s for the whole compare)
    "rollout.prompts_per_step": 2, "rollout.samples_per_prompt": 2, "rollout.max_response_len": 16,
    "window.candidates": [4, 8, 12], "window.initial": None, "probes.batch_size": 2, "probes.offers_per_step": 2,
    "probes.staleness_limit": 2, "probes.max_active": 8, "eval.n_problems": 4, "eval.every": 0,
}


# 16 rollouts per step (8 prompts x 2), not configs/default.yaml's 128: a dozen methods x seeds x tasks must fit
# the budget of a many-method compare (the suite proper has its own preset, configs/suite.yaml); P stays 8
BATCH_OVERRIDES: dict[str, Any] = {"rollout.prompts_per_step": 8, "rollout.samples_per_prompt": 2,
                                   "probes.offers_per_step": 4}
QUICK_OVERRIDES: dict[str, Any] = BATCH_OVERRIDES | {"eval.n_problems": 64}  # smoke run: half the problems
# the full suite: 1,024 problems x k=1 x 2 seeds = 2,048 samples per method, about what the worst case asks
# for a paired 95 % half-width <= 0.03 (compare_tasks.samples_needed(0.03) = 2,135; the measured half-widths are
# reported). Affordable within the hour on 2 cores since evaluation drops stopped rows from its batches
# (eval.compact, ~2x cheaper; docs/decisions.md, "Evaluation drops stopped rows from its batches (`eval.compact`)").
# At equal cost more problems beat more samples per problem: samples of one problem are correlated, distinct
# problems are not
DEFAULT_OVERRIDES: dict[str, Any] = BATCH_OVERRIDES | {"eval.n_problems": 1024, "eval.k": 1}


@dataclass
class Setup:
    """What a compare will run, decided before the first run: the shaped tasks, their seeds, the plan and its
    sizing lines (``adwin.bench.compare.sizing``)."""

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
        from adwin.bench.compare.plan import plan_line

        return [plan_line(self.planned, profile), *self.notes]


def setup(args: argparse.Namespace) -> Setup:
    """Shape every task, size the suite and plan it; sets ``args.jobs`` when it was left to its default."""
    from adwin.bench.compare.plan import SUITE_CONFIG, SUITE_TASKS, plan
    from adwin.bench.compare.sizing import size_suite
    from adwin.config import load_config, resolve_config

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
    from adwin.bench.compare.plan import task_config
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
                    else suite_keys(cands) if args.suite or n_tasks > 1 else None)
    try:
        return cfg, select_methods(args.methods, methods, default_keys)
    except ValueError as e:
        raise ValueError(f"task {task}: {e}") from e


def task_seeds(seeds: list[int], size: Any, spec: str | None) -> list[int]:
    """The seeds a task runs: the sizing's count unless ``--seeds`` named them."""
    return list(range(size.seeds)) if size is not None and size.seeds and spec is None else seeds


def parse_tasks(spec: str) -> list[str]:
    """``--tasks``: comma-separated built-in task names, each known, in order, without repeats."""
    names = [x.strip() for x in spec.split(",") if x.strip()]
    if not names:
        raise ValueError(f"--tasks: name at least one of {', '.join(TASK_NAMES)}")
    for name in names:
        get_task(name)  # raises naming the allowed ones
    return list(dict.fromkeys(names))


def parse_seeds(spec: str | None, default: int) -> list[int]:
    if not spec:
        return list(range(default))
    if "," in spec:
        return [int(x) for x in spec.split(",") if x.strip()]
    n = int(spec)
    if n < 1:
        raise ValueError("--seeds must be >= 1")
    return list(range(n))


def base_overrides(args: argparse.Namespace, mode: str, steps: int) -> dict[str, Any]:
    from adwin.config import parse_set

    if getattr(args, "suite", False):
        # the suite keeps its preset's batch, probe backend and budget; the tiny profile shrinks them
        ov: dict[str, Any] = dict(TINY_OVERRIDES) if mode == "tiny" else {}
    else:
        ov = dict({"tiny": TINY_OVERRIDES, "quick": QUICK_OVERRIDES, "default": DEFAULT_OVERRIDES}[mode])
        # inline probe rounds keep every method's run a pure function of its seed, so the methods differ only
        # by what they are; `--set probes.backend=thread` measures the asynchronous variant instead
        ov["probes.backend"] = "inline"
    ov |= parse_set(args.set)
    ov |= {"steps": steps, "eval.every": 0, "controller.serve": False, "logging.progress": False, "logging.stdout": False,
           "logging.wandb": "off"}
    return ov
