"""The learning curve of full-rollout OPD on one built-in task (``adwin bench curve``): how many steps of the
suite's batch it takes the student to move.

One run of ``window.policy: full`` through ``adwin.loop.trainer.train`` with the suite's preset and its sizing of
the task's regime (``adwin.bench.compare.plan.SIZING``: on the long tasks 8 prompts x 4 rollouts, 128 evaluation
problems), evaluated every ``--eval-every`` steps. Each evaluation gives, per measure (accuracy and the task's line
measures, :meth:`adwin.tasks.suite.BuiltinTask.score_lines`), the mean with a 95 % bootstrap CI over problems and
the paired difference to the start-of-run evaluation (every evaluation samples the same problems from the same
seeded noise, ``adwin.loop.evaluate``). The run stops when the watched measure (``--measure``, by default the one
the suite reads for the task) has moved, its paired CI entirely above the start, on ``--confirm`` evaluations in a
row; or before an evaluation block that would not fit ``--budget-min``; or at ``--max-steps``.

Written as they are made, so a cut run keeps its curve: ``curve.jsonl`` (one row per evaluation), ``steps.jsonl``
(one row per training step: its seconds by phase, tokens and the load average), and after every evaluation
``curve.md`` (the table) and ``curve.png`` (each measure against the step, with its CI band).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TRAIN_PHASES = ("rollout", "teacher", "train")  # a training step's seconds, evaluation left out


class CurveStop(Exception):
    """Raised from the step callback to end the run; ``reason`` says why (moved, budget)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default="chain-long", help="built-in task (default chain-long)")
    p.add_argument("--budget-min", type=float, default=150.0,
                   help="wall budget in minutes, start-of-run evaluation included (default 150)")
    p.add_argument("--eval-every", type=int, default=5, help="evaluate every N steps (default 5)")
    p.add_argument("--max-steps", type=int, default=500, help="stop here whatever the budget (default 500)")
    p.add_argument("--measure", default=None,
                   help="the measure whose move ends the run: accuracy, lines_right, closing_right (default: the "
                        "one the suite reads for the task, adwin.bench.compare.plan.suite_measure)")
    p.add_argument("--confirm", type=int, default=2,
                   help="evaluations in a row on which the measure's paired CI lies above the start (default 2)")
    p.add_argument("--profile", choices=("default", "tiny"), default="default", help="built-in task models")
    p.add_argument("--config", metavar="YAML", default=None, help="base config (default: the suite's preset)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument("--assets-seed", type=int, default=0, help="which prepared built-in models to use")
    p.add_argument("--out", default="bench/curve", help="results go to OUT/<task>-<date>/")
    p.add_argument("--no-plots", action="store_true", help="skip curve.png")


def curve_config(args: argparse.Namespace) -> Any:
    """The run's config: the suite's preset shaped and sized for the task (compare_plan), full-rollout OPD (or the
    method ``args.method`` names, a key of ``all_methods``), ``--max-steps`` steps evaluated every ``--eval-every``;
    the user's ``--set`` wins."""
    from adwin.bench.compare.command import run_config
    from adwin.bench.compare.methods import all_methods
    from adwin.bench.compare.plan import SIZING, SUITE_CONFIG, regime, task_config
    from adwin.bench.compare.setup import base_overrides
    from adwin.config import TrainConfig, load_config, parse_set, resolve_config
    from adwin.tasks.suite import get_task

    if args.eval_every < 1 or args.max_steps < 1 or args.confirm < 1 or args.budget_min <= 0:
        raise ValueError("--eval-every, --max-steps and --confirm must be >= 1 and --budget-min > 0")
    mode = "tiny" if args.profile == "tiny" else "default"
    suite_args = argparse.Namespace(set=args.set, suite=True)
    base = load_config(resolve_config(args.config or SUITE_CONFIG).path,
                       base_overrides(suite_args, mode, args.max_steps))
    size = SIZING[mode][regime(get_task(args.task))]
    cfg = task_config(base, args.task, args.profile, list(parse_set(args.set)), size.eval_problems,
                      size.prompts_per_step)
    key = getattr(args, "method", None) or "full"
    methods = {m.key: m for m in all_methods(cfg.rollout.max_response_len, list(cfg.window.candidates))}
    if key not in methods:
        raise ValueError(f"unknown method {key!r}; known: {', '.join(methods)}")
    cfg = run_config(cfg, methods[key], args.seed, args.assets_seed, None)
    data = cfg.model_dump(mode="json")
    data["eval"]["every"] = args.eval_every
    return TrainConfig.model_validate(data)


def measure_rows(log_entry: Any, start: Any) -> dict[str, dict[str, Any]]:
    """Per measure of one evaluation (``EvalRows``): its mean and 95 % CI over problems, and the paired difference
    to the start-of-run evaluation ``start``."""
    import numpy as np

    from adwin.bench.compare.tasks import bootstrap_mean_ci

    out: dict[str, dict[str, Any]] = {}
    for measure in log_entry.scores:
        now = np.asarray(log_entry.per_problem(measure), dtype=float)  # (n_problems,)
        then = np.asarray(start.per_problem(measure), dtype=float)  # (n_problems,)
        out[measure] = {"value": bootstrap_mean_ci(now), "diff_to_start": bootstrap_mean_ci(now - then)}
    return out


def moved(row: Mapping[str, Any], measure: str) -> bool:
    """The measure's paired CI against the start lies entirely above 0."""
    diff = row["measures"].get(measure, {}).get("diff_to_start")
    return diff is not None and diff["lo"] > 0.0


def first_moved_step(rows: Sequence[Mapping[str, Any]], measure: str, confirm: int) -> int | None:
    """The step that began the first run of ``confirm`` evaluations in a row on which ``measure`` moved."""
    streak: list[int] = []
    for row in rows:
        streak = [*streak, row["step"]] if moved(row, measure) else []
        if len(streak) >= confirm:
            return streak[0]
    return None


class Curve:
    """The step callback of ``train``: writes each step and each evaluation as they come, and decides when to stop."""

    def __init__(self, out_dir: Path, parts: Any, measure: str, confirm: int, eval_every: int, budget_s: float,
                 meta: dict[str, Any], plots: bool = True) -> None:
        self.out_dir, self.parts, self.measure, self.confirm = out_dir, parts, measure, confirm
        self.eval_every, self.budget_s, self.meta, self.plots = eval_every, budget_s, meta, plots
        self.started = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.step_s: list[float] = []
        self.seen = 0  # evaluations of parts.eval_log already written

    def on_step(self, t: int, m: Mapping[str, Any]) -> None:
        step_s = sum(float(m.get(f"time/{p}", 0.0)) for p in TRAIN_PHASES)
        self.step_s.append(step_s)
        load = os.getloadavg()
        _append(self.out_dir / "steps.jsonl", {
            "step": t + 1, "step_s": step_s, **{f"{p}_s": float(m.get(f"time/{p}", 0.0)) for p in TRAIN_PHASES},
            "sync_tokens": m.get("rollout/sync_tokens"), "window": m.get("window/current"), "loadavg": list(load)})
        log_ = self.parts.eval_log
        while self.seen < len(log_):
            # the first evaluation is the start-of-run one (step 0), each later one follows step t
            step = 0 if self.seen == 0 else t + 1
            # m holds this step's evaluation, or at step 0 the start-of-run one when none followed step 0
            own = step > 0 or len(log_) == 1
            row = {"step": step, "wall_s": time.perf_counter() - self.started, "train_s": sum(self.step_s),
                   "eval_s": float(m.get("time/eval", math.nan)) if own else math.nan,
                   "mean_len": m.get("eval/mean_len") if own else None,
                   "teacher_kl": m.get("eval/teacher_kl") if own else None,
                   "measures": measure_rows(log_[self.seen], log_[0]), "loadavg": list(load)}
            self.rows.append(row)
            _append(self.out_dir / "curve.jsonl", row)
            self.seen += 1
        if (t + 1) % self.eval_every:
            return
        self.write()
        if first_moved_step(self.rows, self.measure, self.confirm) is not None:
            raise CurveStop(f"moved: {self.measure} above its start on {self.confirm} evaluations in a row")
        mean_step = sum(self.step_s) / len(self.step_s)
        last_eval = next((r["eval_s"] for r in reversed(self.rows) if math.isfinite(r["eval_s"])), 0.0)
        if time.perf_counter() - self.started + self.eval_every * mean_step + last_eval > self.budget_s:
            raise CurveStop(f"budget: another {self.eval_every} steps and an evaluation would pass "
                            f"{self.budget_s / 60:.0f} min")

    def summary(self, reason: str) -> dict[str, Any]:
        step = first_moved_step(self.rows, self.measure, self.confirm)
        n = len(self.step_s)
        return {"reason": reason, "measure": self.measure, "confirm": self.confirm, "moved_at_step": step,
                "steps": n, "wall_s": time.perf_counter() - self.started,
                "step_s_mean": sum(self.step_s) / n if n else math.nan,
                "step_s_median": sorted(self.step_s)[n // 2] if n else math.nan}

    def write(self, reason: str | None = None) -> None:
        text = curve_markdown(self.meta, self.rows, self.summary(reason) if reason else None)
        (self.out_dir / "curve.md").write_text(text)
        if self.plots and self.rows:
            plot_curve(self.rows, self.out_dir / "curve.png", self.meta)


def _append(path: Path, row: Mapping[str, Any]) -> None:
    from adwin.bench.compare.report import clean

    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(clean(row)) + "\n")


def _ci(v: Mapping[str, float] | None, signed: bool = False) -> str:
    if v is None:
        return "—"
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(v['mean'])} [{f.format(v['lo'])}, {f.format(v['hi'])}]"


def curve_markdown(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
                   summary: Mapping[str, Any] | None = None) -> str:
    """The curve as a table: per evaluation each measure with its CI and its paired difference to the start."""
    from adwin.bench.compare.report import markdown_table

    measures = list(rows[0]["measures"]) if rows else []
    header = ["step", "wall min", *(c for m in measures for c in (f"{m} [95% CI]", f"Δ {m} vs step 0 [paired CI]")),
              "mean length", "teacher KL"]
    table = [[str(r["step"]), f"{r['wall_s'] / 60:.1f}",
              *(c for m in measures for c in (_ci(r["measures"][m]["value"]),
                                               _ci(r["measures"][m]["diff_to_start"], signed=True))),
              "—" if r.get("mean_len") is None else f"{r['mean_len']:.0f}",
              "—" if r.get("teacher_kl") is None else f"{r['teacher_kl']:.4f}"] for r in rows]
    head = (f"`{meta.get('command')}` — task {meta['task']}, full-rollout OPD, {meta['rollouts_per_step']} rollouts "
            f"per step, {meta['eval_problems']} evaluation problems every {meta['eval_every']} steps, budget "
            f"{meta['budget_min']:.0f} min; commit {meta.get('commit')}\n\n")
    tail = ""
    if summary is not None:
        at = summary["moved_at_step"]
        tail = (f"\nstopped: {summary['reason']}; {summary['measure']} moved at step "
                f"{'— (not within the run)' if at is None else at}; {summary['steps']} steps, "
                f"{summary['wall_s'] / 60:.1f} min, a training step {summary['step_s_median']:.1f} s (median; "
                f"mean {summary['step_s_mean']:.1f} s)\n")
    return head + markdown_table(header, table) + tail


def plot_curve(rows: Sequence[Mapping[str, Any]], path: Path, meta: Mapping[str, Any]) -> None:
    """Each measure against the step, a 95 % CI band over problems around it."""
    from adwin.bench.compare.report import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    steps = [r["step"] for r in rows]
    for measure in rows[0]["measures"]:
        vals = [r["measures"][measure]["value"] for r in rows]
        (line,) = ax.plot(steps, [v["mean"] for v in vals], marker="o", markersize=3, label=measure)
        ax.fill_between(steps, [v["lo"] for v in vals], [v["hi"] for v in vals], alpha=0.2, color=line.get_color())
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("fraction (mean over problems; band: 95 % CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{meta['task']}: full-rollout OPD, {meta['rollouts_per_step']} rollouts per step, "
                 f"{meta['eval_problems']} problems", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from adwin.bench.compare.command import command_line, git_commit, load_run_parts
    from adwin.bench.compare.plan import suite_measure
    from adwin.controller import Controller
    from adwin.loop.trainer import train
    from adwin.tasks.suite import get_task

    cfg = curve_config(args)
    measure = args.measure or suite_measure(args.task)
    known = ("accuracy", *get_task(args.task).line_measures)
    if measure not in known:
        raise ValueError(f"--measure: {args.task} has {', '.join(known)}, got {measure!r}")
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    out_dir = Path(args.out) / f"{args.task}-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = cfg.model_copy(update={"name": "full", "out_dir": str(out_dir / "runs")})
    rollouts = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    meta = {"command": command_line(), "task": args.task,
            "profile": args.profile, "commit": git_commit(), "date": dt.datetime.now().isoformat(timespec="seconds"),
            "rollouts_per_step": rollouts, "eval_problems": cfg.eval.n_problems, "eval_every": args.eval_every,
            "budget_min": args.budget_min, "max_steps": args.max_steps, "measure": measure, "confirm": args.confirm,
            "horizon": cfg.rollout.max_response_len, "lr": cfg.optim.lr, "seed": args.seed,
            "cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg())}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    Console().print(f"curve: {args.task}, full-rollout OPD, {rollouts} rollouts per step to {meta['horizon']} tokens, "
                    f"{meta['eval_problems']} problems every {args.eval_every} steps; stops when {measure} is above "
                    f"its start on {args.confirm} evaluations in a row, or within {args.budget_min:.0f} min, or at "
                    f"step {args.max_steps}; writing {out_dir}", markup=False)
    parts = load_run_parts(cfg, args.profile, args.assets_seed)  # one torch thread, like compare's runs
    parts.eval_log = []
    curve = Curve(out_dir, parts, measure, args.confirm, args.eval_every, args.budget_min * 60, meta,
                  plots=not args.no_plots)
    controller = Controller()
    reason = f"max steps ({args.max_steps})"
    try:
        train(cfg, controller, parts, on_step=curve.on_step)
    except CurveStop as stop:
        reason = stop.reason
    finally:
        controller.close()
    curve.write(reason)
    summary = curve.summary(reason)
    (out_dir / "summary.json").write_text(json.dumps(meta | summary | {"loadavg_after": list(os.getloadavg())},
                                                     indent=2))
    Console(width=400).print((out_dir / "curve.md").read_text(), markup=False)
    return 0
