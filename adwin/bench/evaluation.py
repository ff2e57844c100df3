"""Evaluation cost (``adwin bench eval``): held-out evaluation with transformers' ``generate`` against the
compacting sampler (``eval.compact``), side by side in one process on the same student and problems.

Each repeat times one full :func:`adwin.loop.evaluate.evaluate` per sampler (generation, answer checks,
student and teacher scoring), alternating the two so that a noisy machine slows both alike; the report
gives the median seconds of each and their ratio. Accuracies and lengths are printed too: under the
default batch seeding the two samplers draw other noise for a row (docs/decisions.md, "Evaluation drops
stopped rows"), so they agree within sampling error, not exactly; under ``--set rollout.seeding=per_sample``
they are the same samples.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SAMPLERS = {"generate": False, "compact": True}  # eval.compact of each


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="preset name or YAML path (default: the 'default' preset)")
    p.add_argument("--profile", choices=["default", "tiny"], default="default", help="built-in task model size")
    p.add_argument("--problems", type=int, default=256, help="held-out problems per evaluation")
    p.add_argument("--repeats", type=int, default=2, help="timed evaluations per sampler (alternating)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (compare's runs use 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config overrides (repeatable)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


def main(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from adwin.config import load_config, parse_set, resolve_config
    from adwin.loop.evaluate import evaluate
    from adwin.loop.parts import load_parts
    from adwin.loop.sampler import Sampler

    if args.problems < 1 or args.repeats < 1 or args.threads < 1:
        raise ValueError("--problems, --repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    cfg = load_config(resolve_config(args.config).path, {**parse_set(args.set), "eval.n_problems": args.problems})
    parts = load_parts(cfg, args.profile)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SAMPLERS}
    for _ in range(args.repeats):
        for name, compact in SAMPLERS.items():
            c = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"compact": compact})})
            t0 = time.perf_counter()
            out = evaluate(parts, c, Sampler(parts, c))
            runs[name].append({**out, "seconds": time.perf_counter() - t0})
    summary = {name: {"seconds": statistics.median(r["seconds"] for r in rs),
                      **{k: rs[0][k] for k in rs[0] if k != "seconds"}} for name, rs in runs.items()}
    speedup = summary["generate"]["seconds"] / summary["compact"]["seconds"]

    rows = min(args.problems, len(parts.eval_prompts)) * cfg.eval.k
    table = Table(title=f"adwin bench eval: {rows} rows (task {cfg.data.builtin_task}, profile {args.profile}), "
                        f"batch {cfg.eval.batch_size}, {args.threads} thread(s), median of {args.repeats}")
    for col in ("sampler", "seconds", "accuracy", "mean length", "teacher KL"):
        table.add_column(col, justify="right")
    for name, s in summary.items():
        table.add_row(name, f"{s['seconds']:.1f}", f"{s.get('eval/accuracy', float('nan')):.3f}",
                      f"{s['eval/mean_len']:.1f}", f"{s['eval/teacher_kl']:.4f}")
    console = Console(width=160)
    console.print(table)
    load = os.getloadavg()
    console.print(f"compact is {speedup:.2f}x faster than generate; load average {load[0]:.2f} {load[1]:.2f} "
                  f"{load[2]:.2f} on {os.cpu_count()} CPUs")
    if args.json_path:
        meta: dict[str, Any] = {"profile": args.profile, "rows": rows, "threads": args.threads,
                                "batch_size": cfg.eval.batch_size, "task": cfg.data.builtin_task,
                                "seeding": cfg.rollout.seeding, "cpus": os.cpu_count(), "loadavg": list(load)}
        Path(args.json_path).write_text(json.dumps({"meta": meta, "runs": runs, "summary": summary,
                                                    "speedup": speedup}, indent=2))
    return 0
