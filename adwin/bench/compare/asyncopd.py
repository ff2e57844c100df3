"""The synchronous trainer and the AsyncOPD streaming scheduler side by side (``adwin bench async``).

Both runs train the same preset (``configs/default.yaml`` unless ``--config``) on the same fixed window
(``--window``, 128 by default; no probes, so neither run spends anything on audits), the same seed, the
same samples per update and the same number of updates, so they train on about the same number of rollout
tokens (each report row gives its own count). Each run is ``adwin.bench.compare.command.run_one``: fresh models
from one prepared asset folder, an embedded controller, one torch intra-op thread (as ``adwin train`` gives
the built-in models), the same held-out problems evaluated at the start and at the end.

What is reported, per scheduler: trained rollout tokens per second of training wall (the sync tokens over
the run's wall without evaluation), staleness of the trained samples (0 for the synchronous trainer), the
pipeline overlap (AsyncOPD's ``pipeline/overlap``: busy stage seconds over wall; 1 is a serial schedule),
the requests submitted but never trained (0: the feeder stops at the requests the run's updates consume),
and accuracy after the same number of updates with a 95 % bootstrap CI over problems, plus the paired
difference AsyncOPD - sync (``adwin.bench.compare.tasks``: problem by problem, resampling problems keeps
the pairing). The goal line: AsyncOPD trains >= 1.2x the synchronous trainer's tokens per second at an
accuracy whose paired CI is not entirely below the synchronous trainer's.

``--workers thread,ray`` (the default) makes two streaming runs: the rollout worker on a thread of this
process, where its Python shares the GIL with the teacher's and the learner's, or in a Ray actor (its own
process; the scheduler's threads stay here). The scheduler's knobs for the streaming runs are ``ASYNC_OVERRIDES`` (override with ``--set``): the
paper's queue depth, one rollout worker decoding up to a whole update's requests at once and the teacher
scoring up to as many (the synchronous trainer batches that many), learner batches not padded to the
horizon (on CPU that padding multiplies the learner's tokens). ``--quick`` is a smoke run (8 updates,
64 problems) and says so in its output; ``--profile tiny`` uses the tiny built-in models and a tiny
budget (the test suite's smoke test). Timings depend on what else the machine runs: the JSON records the
load average before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from adwin.bench.compare.methods import Method

log = logging.getLogger(__name__)

MODES: dict[str, dict[str, Any]] = {
    "default": {"steps": 40, "eval.n_problems": 512},
    "quick": {"steps": 8, "eval.n_problems": 64},
    "tiny": {"steps": 3, "eval.n_problems": 4, "rollout.prompts_per_step": 2, "rollout.samples_per_prompt": 2,
             "rollout.max_response_len": 16, "window.candidates": [4, 8, 12], "window.initial": None},
}
TINY_WINDOW = 8
# probes.backend back to auto: the shared base is a sync config, whose auto the sync scheduler resolved
ASYNC_OVERRIDES: dict[str, Any] = {"scheduler": "asyncopd", "probes.backend": "auto", "asyncopd.queue_depth": 4,
                                   "asyncopd.rollout_workers": 1, "asyncopd.pad_to_horizon": False,
                                   "asyncopd.wait_timeout_s": 3600.0}
GOAL_SPEEDUP = 1.2
WORKER_WHERE = {"thread": "thread of this process", "ray": "Ray actor (its own process)"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=("default", "tiny"), default="default",
                   help="built-in task models; tiny: tiny models and budget (smoke test)")
    p.add_argument("--quick", action="store_true", help=f"smoke run: {MODES['quick']['steps']} updates, "
                                                        f"{MODES['quick']['eval.n_problems']} problems")
    p.add_argument("--window", type=int, default=None, help="the fixed window both runs train on (default 128; "
                                                            f"tiny {TINY_WINDOW})")
    p.add_argument("--steps", type=int, default=None, help="learner updates per run (default 40; quick 8; tiny 3)")
    p.add_argument("--workers", default="thread,ray",
                   help="streaming runs to make, comma-separated: thread (rollout worker on a thread, sharing "
                        "the GIL with teacher and learner), ray (rollout worker in its own process)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", metavar="YAML", help="base config (default: configs/default.yaml if present)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for both runs (repeatable); asyncopd.* keys reach the streaming run only")
    p.add_argument("--assets-seed", type=int, default=0, help="which prepared built-in models to use")
    p.add_argument("--out", default="bench/async", help="results go to OUT/<date>[-quick|-tiny]/")


def base_overrides(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    from adwin.config import parse_set, policy_overrides

    window = args.window or (TINY_WINDOW if mode == "tiny" else 128)
    ov: dict[str, Any] = dict(MODES[mode]) | policy_overrides("fixed", window=window)
    ov |= {"eval.every": 0, "controller.serve": False, "logging.progress": False, "logging.stdout": False,
           "logging.wandb": "off", "loss.name": "reverse_kl_pg"}
    if args.steps:
        ov["steps"] = args.steps
    return ov | {k: v for k, v in parse_set(args.set).items() if not k.startswith("asyncopd.")}


def methods(args: argparse.Namespace, base: Any) -> list[Method]:
    """The synchronous run, then one streaming run per ``--workers`` entry with ``ASYNC_OVERRIDES``: its
    rollout worker decodes and its teacher scores up to one update's samples at once (what the synchronous
    trainer batches)."""
    from adwin.config import parse_set

    b = base.rollout.prompts_per_step * base.rollout.samples_per_prompt
    streaming = ASYNC_OVERRIDES | {"asyncopd.worker_batch": b, "asyncopd.teacher_batch": b}
    streaming |= {k: v for k, v in parse_set(args.set).items() if k.startswith("asyncopd.")}
    out = [Method("sync", "synchronous trainer")]
    for kind in parse_workers(args.workers):
        out.append(Method(f"asyncopd-{kind}", f"AsyncOPD streaming, rollout worker in a {WORKER_WHERE[kind]}",
                          streaming | {"asyncopd.workers": kind}))
    return out


def parse_workers(spec: str) -> list[str]:
    kinds = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [k for k in kinds if k not in WORKER_WHERE]
    if bad or not kinds:
        raise ValueError(f"--workers: comma-separated {', '.join(WORKER_WHERE)}, got {spec!r}")
    return list(dict.fromkeys(kinds))


def speed(row: dict[str, Any]) -> float:
    """Trained rollout tokens per second of training wall (evaluation left out)."""
    wall = float(row["train_wall_s"])
    return float(row["sync_tokens"]) / wall if wall > 0 else math.nan


def report(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per scheduler its measured row, and the comparison: speed-up, paired accuracy difference, goal."""
    import numpy as np

    from adwin.bench.compare.tasks import bootstrap_mean_ci

    out: dict[str, Any] = {"runs": {}}
    for key, row in rows.items():
        scores = np.asarray(row["eval_scores"]["accuracy"], dtype=float)
        out["runs"][key] = {
            "trained_tokens": row["sync_tokens"], "train_wall_s": row["train_wall_s"], "tokens_per_s": speed(row),
            "staleness_mean": row.get("staleness_mean", math.nan) if key != "sync" else 0.0,
            "staleness_max": row.get("staleness_max", math.nan) if key != "sync" else 0.0,
            "overlap": row.get("overlap", math.nan), "accuracy": bootstrap_mean_ci(scores),
            "accuracy_initial": row["accuracy_initial"], "mean_window": row["mean_window"],
            "untrained_requests": row.get("untrained_requests", 0),
        }
    sync = rows["sync"]
    out["against_sync"] = {}
    for key, stream in rows.items():
        if key == "sync":
            continue
        diff = bootstrap_mean_ci(np.asarray(stream["eval_scores"]["accuracy"], float)
                                 - np.asarray(sync["eval_scores"]["accuracy"], float))
        ratio = speed(stream) / speed(sync)
        out["against_sync"][key] = {
            "speedup": ratio, "accuracy_diff": diff,  # streaming - sync, paired over problems
            "goal": {"speedup_at_least": GOAL_SPEEDUP, "speedup_met": bool(ratio >= GOAL_SPEEDUP),
                     "accuracy_not_resolved_below": bool(diff["hi"] >= 0.0),
                     "met": bool(ratio >= GOAL_SPEEDUP and diff["hi"] >= 0.0)}}
    return out


def table(res: dict[str, Any]) -> str:
    lines = [f"{'':<16} {'tokens':>9} {'wall s':>8} {'tok/s':>8} {'stale':>6} {'overlap':>7} {'untrained':>9} "
             f"{'accuracy [95% CI]':>22}"]
    for key, r in res["runs"].items():
        a = r["accuracy"]
        overlap = "-" if math.isnan(r["overlap"]) else f"{r['overlap']:.2f}"
        lines.append(f"{key:<16} {r['trained_tokens']:>9.0f} {r['train_wall_s']:>8.1f} {r['tokens_per_s']:>8.1f} "
                     f"{r['staleness_mean']:>6.2f} {overlap:>7} {r['untrained_requests']:>9} "
                     f"{a['mean']:>8.3f} [{a['lo']:.3f}, {a['hi']:.3f}]")
    for key, c in res["against_sync"].items():
        d, g = c["accuracy_diff"], c["goal"]
        lines.append(f"{key}: {c['speedup']:.2f}x the sync tokens per second (goal >= {GOAL_SPEEDUP}x: "
                     f"{'met' if g['speedup_met'] else 'not met'}); accuracy - sync, paired over {d['n']} problems: "
                     f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] "
                     f"({'not ' if g['accuracy_not_resolved_below'] else ''}resolved below)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from adwin.bench.compare.command import _json_default, command_line, run_one
    from adwin.config import default_config_path, load_config

    mode = "tiny" if args.profile == "tiny" else "quick" if args.quick else "default"
    config_path = args.config or default_config_path()
    base = load_config(config_path, base_overrides(args, mode))
    out_dir = Path(args.out) / (dt.datetime.now().strftime("%Y-%m-%d") + ("" if mode == "default" else f"-{mode}"))
    out_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows: dict[str, dict[str, Any]] = {}
    chosen = methods(args, base)
    for method in chosen:  # one after the other: each has the machine to itself
        row = run_one(base, method, args.seed, args.profile, args.assets_seed, out_dir)
        stream = row.pop("pipeline", None)  # the streaming runs' scheduler summary
        if stream is not None:
            row["overlap"] = stream.get("overlap", {}).get("pipeline/overlap", math.nan)
            # requests submitted beyond those trained (no probes here: the window is fixed)
            row["untrained_requests"] = stream["submitted"] - stream["updates"] * stream["batch_size"]
        rows[method.key] = row
    res = report(rows)
    res["meta"] = {"date": dt.datetime.now().isoformat(timespec="seconds"), "command": command_line(), "mode": mode,
                   "smoke": mode != "default", "steps": base.steps, "window": base.window.window,
                   "samples_per_update": base.rollout.prompts_per_step * base.rollout.samples_per_prompt,
                   "eval_problems": base.eval.n_problems, "seed": args.seed, "config": str(config_path) if config_path else None,
                   "async_overrides": {m.key: m.overrides for m in chosen[1:]}, "cpu_count": os.cpu_count(),
                   "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    (out_dir / "results.json").write_text(json.dumps(res, indent=2, default=_json_default))
    from rich.console import Console

    console = Console(soft_wrap=True)
    if mode != "default":
        console.print(f"SMOKE RUN ({mode}): not a measurement to publish")
    console.print(table(res), highlight=False)
    load = res["meta"]["loadavg_after"]
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
                  f"results: {out_dir / 'results.json'}")
    return 0
