"""The paper's table at small scale: every window method through the same trainer, side by side.

Methods (ADWIN paper Tables 1 and 3, appendix D, plus two gradient-free adaptive baselines):
``full`` (full-rollout OPD), ``linear`` (Fast OPD; start and step scaled to the horizon as 256/+256 is
to 8192), ``fixed-W`` for each candidate W (Prefix OPD), ``adwin-T`` at thresholds 0.7 (the default)
and 0.5/0.6/0.8/0.9 (sensitivity), ``surprise`` (teacher-surprise horizon) and ``iw-opd``
(importance-weighted full-rollout OPD, gamma 0.5). Every run uses the same base config, steps, seeds,
batch sizes and prompts; only the window policy (and for ``iw-opd`` the loss weights) differ.

Each run has its own embedded controller (HTTP serving off) and freshly loaded models; runs execute in
this process one after another, or ``--jobs N`` at a time in worker processes (default settings: 2,
one per core; the results do not depend on it, only the wall times do). The built-in task's models come from one prepared asset folder
(``--assets-seed``); the seed varies the training prompts' order and all sampling; the evaluation
problems are the same for every run. Output: a table, ``<out>/<date>[-quick|-tiny]/results.json``,
``accuracy_vs_tokens.png``, ``windows.png`` and ``index.html``.

Each task's runs get the task's own horizon and candidate ladder (``adwin.bench.compare.plan.task_config``), and
a planned-cost line is printed before the first run. ``--suite`` is the five-task suite proportioned like the
paper (``configs/suite.yaml``, per-task steps and evaluation size; docs/benchmarks.md, "The five-task suite").

``--tasks chain,chain-drift,chain-late`` runs every method on every built-in task (paired: the same seeds,
training prompts and evaluation problems across methods) into ``<out>/<date>/<task>/`` each, plus a
cross-task ``index.html`` and ``suite.json`` with each method's regret and worst-case regret
(``adwin.bench.compare.tasks``). One task (``chain``) by default.

``--quick`` is a smoke run (one seed, 8 steps, six methods, 64 evaluation problems) and says so in every output;
``--profile tiny`` uses the tiny built-in models and a tiny budget (the test suite's smoke test).

Opt-in methods (named in ``--methods`` only, never part of the default set): ``asyncopd-is-L<L>`` and
``asyncopd-oapl-L<L>`` for ``L`` in ``ASYNC_LAGS`` (families ``asyncopd-is``, ``asyncopd-oapl``) run the
AsyncOPD scheduler (``train_asyncopd``) with the base config's window (the full horizon when the base policy
audits: a lag above the staleness limit leaves no probe to audit), the same samples per step in groups of
``G`` (4 when it divides them), one batch in flight (queue depth 1), learner batches not padded to the
horizon (on CPU that padding multiplies the learner's tokens) and the workers' weights synced every
``L`` updates: IS corrects the lag with the old-to-current ratio (``reverse_kl_pg``, keep-mode), OAPL
regresses onto the teacher reward (``loss.oapl``, beta 1, Algorithm 1's cleared buffer). Their rows add
the lag statistics (staleness, ratio percentiles, train-rollout log-prob gap, discarded tokens).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adwin.bench.compare.methods import Method
from adwin.bench.compare.setup import STEPS, base_overrides
from adwin.bench.workers import spawn_pool
from adwin.tasks.suite import DEFAULT_TASK, TASK_NAMES

log = logging.getLogger(__name__)

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=("default", "tiny"), default="default",
                   help="built-in task models; tiny: tiny models and budget (smoke test, < 60 s)")
    p.add_argument("--tasks", default=None,
                   help=f"comma-separated built-in tasks ({', '.join(TASK_NAMES)}); default {DEFAULT_TASK}; each "
                        "task's runs get its own horizon and candidate ladder")
    p.add_argument("--truth", nargs="+", default=None, metavar="TRUTH_JSON",
                   help="audit-truth results (adwin bench audit-truth's truth.json) of the suite's tasks: the "
                        "chain-long cost goal charges the truth's window at each checkpoint")
    p.add_argument("--suite", action="store_true",
                   help="the five-task suite proportioned like the paper: configs/suite.yaml (128 rollouts per "
                        "step, P = 8, the default probe backend and audit budget), the goal's methods, steps and "
                        "evaluation problems per task (adwin.bench.compare.plan.SIZING); --quick: its smoke run; "
                        "--tasks: a subset of the five")
    p.add_argument("--quick", action="store_true", help="smoke run: one seed, fewer steps, six methods")
    p.add_argument("--plan", action="store_true",
                   help="print the plan (runs, sizing, estimated minutes per task and in all) and exit: runs nothing")
    p.add_argument("--methods", help="comma-separated method keys or families (full, linear, fixed, fixed-64, adwin, "
                                     "adwin-0.7, surprise, iw-opd; opt-in: asyncopd-is, asyncopd-oapl, e.g. "
                                     "asyncopd-oapl-L4); default: all but the opt-in ones for one task, the goal's "
                                     "set (full, linear, fixed, adwin-0.7) for several; quick: one per family")
    p.add_argument("--seeds", help="number of seeds (N: 0..N-1) or a comma-separated list (default 2; quick 1; the "
                   "suite's long tasks 3), for every task")
    p.add_argument("--steps", type=int, help=f"optimizer steps per run (default {STEPS['default']}; "
                                             f"quick {STEPS['quick']}; tiny {STEPS['tiny']})")
    p.add_argument("--config", metavar="YAML", help="base config: preset name or YAML path (default: the 'default' preset)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--assets-seed", type=int, default=0, help="which prepared built-in models to use")
    p.add_argument("--out", default="bench/compare", help="results go to OUT/<date>[-quick|-tiny]/")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs and the HTML page")
    p.add_argument("--jobs", type=int, default=None,
                   help="trainings run at once, each a process with one torch thread (default: 2, "
                        "1 for --profile tiny; --device cuda: every method of a task at once)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the runs train (model.device); the suite's sizing and plan follow it "
                        "(adwin.bench.compare.sizing)")


def read_truth(paths: Sequence[str]) -> dict[str, list[tuple[int, int]]]:
    """Per task, the ``(step, truth window)`` of every checkpoint in the given audit-truth ``truth.json`` files; a
    checkpoint whose pool could not identify the truth (``truth_window`` null) is left out, so its steps are charged
    at the checkpoint before it."""
    out: dict[str, list[tuple[int, int]]] = {}
    for path in paths:
        try:
            report = json.loads(Path(path).read_text())
            task = report["meta"]["task"]
            out.setdefault(task, []).extend((int(c["step"]), int(c["truth_window"])) for c in report["checkpoints"]
                                            if c["truth_window"] is not None)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"--truth {path}: not an adwin bench audit-truth truth.json ({e!r})") from e
    return {t: sorted(set(v)) for t, v in out.items()}


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from adwin.bench.compare.setup import setup

    run = setup(args)
    mode, tasks, seeds, config_path, base = run.mode, run.tasks, run.seeds, run.config_path, run.base
    # the suite's goals are read even from one of its tasks (``--suite --tasks chain-long``)
    cross = bool(args.suite) or len(tasks) > 1
    if args.truth and not cross:
        raise ValueError("--truth feeds the cross-task goals: give it with --suite or several --tasks")
    truth = read_truth(args.truth or [])  # read before any run: a bad file fails now, not after the suite
    shaped, seeds_of, planned, notes = run.shaped, run.seeds_of, run.planned, run.notes
    console = Console(width=200)  # the command's own output, like its tables: what the user started
    for line in run.plan_lines(args.profile):
        console.print(line, markup=False)
    if args.plan:
        for task, cfg, chosen in shaped:
            console.print(f"{task}: {cfg.steps} steps of {cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt} "
                          f"rollouts x {len(seeds_of[task])} seed(s), {len(chosen)} methods, {cfg.eval.n_problems} "
                          "problems", markup=False)
        return 0
    stamp = dt.datetime.now().strftime("%Y-%m-%d")
    out_dir = Path(args.out) / (stamp + ("" if mode == "default" else f"-{mode}"))
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": command_line(), "commit": git_commit(),
        "mode": mode, "smoke": mode != "default", "profile": args.profile, "steps": base.steps, "seeds": seeds,
        "tasks": tasks, "suite": bool(args.suite), "base_config": str(config_path),
        "overrides": base_overrides(args, mode, base.steps), "plan": planned,
        "assets_seed": args.assets_seed, "jobs": args.jobs, "device": args.device, "sizing": notes,
        "machine_before": machine_info(),
    }
    from adwin.bench.compare.report import finish
    from adwin.bench.compare.suite import finish_suite

    per_task: dict[str, dict[str, Any]] = {}
    for task, task_base, chosen in shaped:
        # one task keeps the single-task layout; several, or the suite, get a folder each and a cross-task page
        task_dir = out_dir / task if cross else out_dir
        task_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        runs = run_all(task_base, chosen, seeds_of[task], args, task_dir)
        task_meta = meta | {"task": task, "steps": task_base.steps, "seeds": seeds_of[task],
                            "methods": [m.key for m in chosen],
                            "rollouts_per_step": task_base.rollout.prompts_per_step * task_base.rollout.samples_per_prompt,
                            "probe_batch": task_base.probes.batch_size,
                            "horizon": task_base.rollout.max_response_len,
                            "candidates": list(task_base.window.candidates),
                            "eval_problems": task_base.eval.n_problems, "machine": machine_info(),
                            "models": task_models(task_base, task, args),
                            "total_s": time.perf_counter() - started}
        per_task[task] = finish(task_meta, chosen, runs, task_dir, plots=not args.no_plots)
    if cross:
        finish_suite(meta | {"machine": machine_info()}, {t: m for t, _, m in shaped}, per_task, out_dir,
                     plots=not args.no_plots, truth=truth)
    return 0


def command_line() -> str:
    """The command as typed (``adwin bench compare ...``, ``adwin bench curve ...``) when run from the CLI; else the
    process argv."""
    argv = sys.argv[1:]
    if argv[:1] == ["bench"]:
        return "adwin " + " ".join(shlex.quote(a) for a in argv)
    return " ".join(shlex.quote(a) for a in sys.argv)


def git_commit() -> str | None:
    """The checkout's short commit, for the record (None outside a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in load], "torch": torch.__version__,
            "threads": torch.get_num_threads(), "note": "a shared machine unless stated otherwise"}


def run_all(base: Any, methods: list[Method], seeds: list[int], args: argparse.Namespace,
            out_dir: Path) -> list[dict[str, Any]]:
    """Seed-major order (all methods for seed 0, then seed 1, ...), so a partial run is still a comparison.

    Every method of a seed starts from the same student and evaluates the same problems with the same
    evaluation RNG (``adwin.loop.evaluate``), so the start-of-run evaluation is computed once per seed
    (first, in the same pool) and handed to each method's run instead of being repeated by each.

    ``--jobs N > 1`` runs N trainings at once in worker processes (one torch thread each); results are
    the same as sequential (every run is seeded on its own), only wall times shift with co-scheduling.
    """
    from concurrent.futures import as_completed
    from contextlib import nullcontext

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    jobs = [(s, m) for s in seeds for m in methods]
    done: dict[int, dict[str, Any]] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())

    def record(i: int, row: dict[str, Any]) -> None:
        done[i] = row
        partial = [done[k] for k in sorted(done)]
        (out_dir / "runs.partial.json").write_text(json.dumps(partial, indent=1, default=_json_default))

    pool_cm: Any = spawn_pool(args.jobs) if args.jobs > 1 else nullcontext(None)
    with Progress(*columns, transient=False) as bar, pool_cm as pool:
        task = bar.add_task("compare", total=len(seeds) + len(jobs))
        bar.update(task, description=f"start-of-run evaluation, {len(seeds)} seed(s)")
        n = len(seeds)
        evals = (pool.map if pool is not None else map)(initial_eval_job, [base] * n, seeds, [args.profile] * n,
                                                         [args.assets_seed] * n)
        initial = dict(zip(seeds, evals, strict=True))
        bar.advance(task, n)
        if pool is None:
            for i, (seed, method) in enumerate(jobs):
                bar.update(task, description=f"{method.key} seed {seed}")
                record(i, run_one(base, method, seed, args.profile, args.assets_seed, out_dir, initial[seed]))
                bar.advance(task)
        else:
            futures = {pool.submit(run_one, base, m, s, args.profile, args.assets_seed, out_dir, initial[s]): i
                       for i, (s, m) in enumerate(jobs)}
            bar.update(task, description=f"{len(jobs)} runs, {args.jobs} at a time")
            for fut in as_completed(futures):
                i = futures[fut]
                record(i, fut.result())
                bar.update(task, description=f"done {jobs[i][1].key} seed {jobs[i][0]}")
                bar.advance(task)
    return [done[i] for i in range(len(jobs))]


def run_config(base: Any, method: Method | None, seed: int, assets_seed: int, out_dir: Path | None) -> Any:
    from adwin.config import TrainConfig, apply_overrides

    data = apply_overrides(base.model_dump(mode="json"), method.overrides if method else {})
    data |= {"seed": seed}
    if method is not None and out_dir is not None:
        data |= {"name": f"{method.key}-seed{seed}", "out_dir": str(out_dir / "runs")}
    data["model"]["builtin_seed"] = assets_seed
    return TrainConfig.model_validate(data)


def task_models(base: Any, task: str, args: argparse.Namespace) -> str:
    """Which built-in models a task's runs read (their weights' id), for the report."""
    from adwin.tasks.shipped import builtin_assets, describe

    return describe(builtin_assets(args.profile, args.assets_seed, task, base.model.builtin_source))


def load_run_parts(cfg: Any, profile: str, assets_seed: int) -> Any:
    import torch
    from transformers.utils import logging as hf_logging

    from adwin.loop.parts import load_parts, load_prompts

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)  # the built-in models are tiny; see adwin.loop.parts.limit_threads
    # models (and the fixed evaluation problems) from one prepared asset folder; training data from the seed
    parts = load_parts(cfg.model_copy(update={"seed": assets_seed}), profile)
    parts.train_prompts = load_prompts(cfg)[0]
    return parts


def initial_eval_job(base: Any, seed: int, profile: str, assets_seed: int) -> dict[str, float]:
    """The start-of-run evaluation every method of ``seed`` shares (the base config's evaluation settings;
    no method overrides an ``eval.*`` or model key: :func:`run_one` checks)."""
    from adwin.loop.evaluate import evaluate
    from adwin.loop.sampler import Sampler

    cfg = run_config(base, None, seed, assets_seed, None)
    parts = load_run_parts(cfg, profile, assets_seed)
    return evaluate(parts, cfg, Sampler(parts, cfg))


SHARED_EVAL_KEYS = ("eval.", "model.", "rollout.max_response_len", "rollout.temperature", "rollout.top_p", "seed")


def run_one(base: Any, method: Method, seed: int, profile: str, assets_seed: int, out_dir: Path,
            initial_eval: dict[str, float] | None = None) -> dict[str, Any]:
    """One training run through ``adwin.loop.trainer.train`` (or ``train_asyncopd`` for ``scheduler: asyncopd``)
    with an embedded controller; its measured row. ``initial_eval``: the seed's shared start-of-run evaluation (:func:`initial_eval_job`); None evaluates."""
    from adwin.bench.compare.stats import measure_run
    from adwin.controller import Controller
    from adwin.loop.trainer import train
    from adwin.probes.settings import param_count

    if initial_eval is not None and (bad := [k for k in method.overrides if k.startswith(SHARED_EVAL_KEYS)]):
        raise ValueError(f"{method.key}: overrides {bad}, which the shared start-of-run evaluation depends on")
    cfg = run_config(base, method, seed, assets_seed, out_dir)
    parts = load_run_parts(cfg, profile, assets_seed)
    parts.eval_log = []
    controller = Controller()
    t0 = time.perf_counter()
    try:
        if cfg.scheduler == "asyncopd":
            from adwin.trainer_adapters.asyncopd.train import train_asyncopd

            res = train_asyncopd(cfg, controller, parts, initial_eval=initial_eval)
        else:
            res = train(cfg, controller, parts, initial_eval=initial_eval)
    finally:
        controller.close()
    n_student = param_count(parts.student) or 0
    teachers = list(parts.teachers.models.values())
    n_teacher = round(sum(param_count(t) or 0 for t in teachers) / max(len(teachers), 1))
    row = measure_run(res.history, res.initial_eval, res.final_eval, res.totals, n_student=n_student,
                      n_teacher=n_teacher, probe_batch=cfg.probes.batch_size,
                      samples_per_step=cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt)
    for ckpt in res.run_dir.glob("checkpoint-*"):  # the trainer always saves the last step; 42 copies are waste
        shutil.rmtree(ckpt, ignore_errors=True)
    row["eval_scores"] = final_eval_scores(parts.eval_log, 1 if initial_eval is not None else 2)
    row |= {"task": cfg.data.builtin_task, "method": method.key, "seed": seed, "run_dir": str(res.run_dir), "n_student": n_student,
            "n_teacher": n_teacher, "elapsed_s": time.perf_counter() - t0,
            "initial_eval_shared": initial_eval is not None}
    if getattr(res, "asyncopd", None):
        row["pipeline"] = res.asyncopd  # the streaming scheduler's summary (overlap, submitted, updates)
    log.info("%s seed %d: accuracy %.3f, %.0f sync + %.0f probe tokens, %.1f s", method.key, seed,
             row["accuracy_final"], row["sync_tokens"], row["probe_tokens"], row["wall_s"])
    return row


def final_eval_scores(log: list[Any], evaluations: int = 2) -> dict[str, list[float]]:
    """Per measure (accuracy, and the built-in task's line measures), the per-problem mean@k of the final
    evaluation: the last of ``log`` (``parts.eval_log``). A run evaluates at its start (unless it was handed the
    shared one: ``evaluations = 1``) and its end (``eval.every = 0``); any other count means the order assumption
    broke."""
    if len(log) != evaluations:
        raise RuntimeError(f"expected {evaluations} evaluations, got {len(log)}: paired statistics need "
                           "eval.every = 0")
    final = log[-1]
    if "accuracy" not in final.scores:
        raise RuntimeError("paired statistics need an answer on every evaluation problem")
    return {measure: final.per_problem(measure) for measure in final.scores}


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
