"""Prepare the built-in task on this machine: build the character tokenizer, SFT the (shared) teacher on generated
step-by-step solutions, keep an early SFT snapshot as the weaker student initialisation, measure
accuracy (greedy and T=1) and response lengths, and cache everything under $ADWIN_HOME
(default ~/.cache/adwin) with a meta.json. Cached assets are reused unless --force.

Runs use the models that ship with adwin by default (adwin.tasks.shipped); this command runs the recipe itself and
reports how its build differs from the shipped one, so the recipe stays checked against what users run."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from adwin.tasks.profiles import PREPARE_THREADS
from adwin.tasks.shipped import render_comparison

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from adwin.tasks.suite import DEFAULT_TASK, TASK_NAMES

    parser.add_argument("--task", choices=TASK_NAMES, default=DEFAULT_TASK,
                        help="which built-in task (docs/task.md); each is prepared and cached on its own")
    parser.add_argument(
        "--profile",
        choices=("default", "tiny"),
        default="default",
        help="default: the real models (targets: <= 5 min on 2 cores); tiny: seconds, for tests",
    )
    parser.add_argument("--tiny", action="store_true", help="shorthand for --profile tiny")
    parser.add_argument("--home", default=None, help="cache root (default: $ADWIN_HOME or ~/.cache/adwin)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--threads", type=int, default=PREPARE_THREADS,
                        help=f"torch intra-op threads (default {PREPARE_THREADS}); the weights depend on it and on the "
                             "CPU's instruction set, so keep the default to get the models `adwin train` prepares")
    parser.add_argument("--json", action="store_true", help="print the full meta.json to stdout")


def _greedy(accuracy: float | None) -> str:
    return "not measured (student_greedy_eval off)" if accuracy is None else f"{accuracy:.3f}"


def _summary(meta: dict) -> str:
    m = meta["measured"]
    lines = [
        f"built-in task '{meta['task']}' profile={meta['profile']} seed={meta['seed']} at {meta.get('root', '?')}",
        f"  model: {meta['model']['architecture']} {meta['model']['parameters']:,} parameters; "
        f"SFT {meta['sft']['steps']} steps (student = step {meta['sft']['student_step']})",
        f"  teacher accuracy: greedy {m['teacher_accuracy_greedy']:.3f}  T=1 {m['teacher_accuracy_t1']:.3f}",
        f"  student accuracy: greedy {_greedy(m['student_accuracy_greedy'])}  T=1 {m['student_accuracy_t1']:.3f}",
        *[f"  {who} phase skill (teacher-forced): early {m[who + '_phase_early']:.3f}  late {m[who + '_phase_late']:.3f}"
          for who in ("teacher", "student") if f"{who}_phase_early" in m],
        f"  response tokens: median {m['median_response_tokens']:.0f}  max {m['max_response_tokens']:.0f}",
        f"  wall: {m['wall_seconds']:.1f} s on {meta['environment']['torch_threads']} threads "
        f"(load average start {meta['environment']['loadavg_start']}, end {meta['environment']['loadavg_end']})",
    ]
    if meta.get("targets_met"):
        missed = [k for k, ok in meta["targets_met"].items() if not ok]
        lines.append("  targets: all met" if not missed else f"  targets NOT met: {', '.join(missed)}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from adwin.tasks.assets import assets_root, ensure_prepared, is_prepared

    profile = "tiny" if args.tiny else args.profile
    if args.threads < 1:
        sys.stderr.write(f"adwin prepare: --threads must be >= 1 (got {args.threads})\n")
        return 2
    cached = is_prepared(assets_root(args.home, profile, args.seed, args.task), profile, args.task) and not args.force
    start = time.perf_counter()
    assets = ensure_prepared(home=args.home, profile=profile, seed=args.seed, force=args.force, threads=args.threads,
                             task=args.task)
    if cached:
        logger.info("using cached assets at %s (--force rebuilds)", assets.root)
    else:
        logger.info("prepared in %.1f s", time.perf_counter() - start)
    comparison = _against_shipped(assets, profile, args.seed, args.task)
    if args.json:
        sys.stdout.write(json.dumps({**assets.meta, "against_shipped": comparison}, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(_summary(assets.meta) + "\n")
        if comparison is not None:
            sys.stdout.write(render_comparison(comparison) + "\n")
    return 0


def _against_shipped(assets: Any, profile: str, seed: int, task: str) -> dict[str, Any] | None:
    """How this machine's build differs from the models that ship for the same task, profile and seed (None:
    none ship). A shipped folder of another recipe is compared too, and marked."""
    from adwin.tasks.assets import META_FILE, is_prepared, load_assets
    from adwin.tasks.shipped import compare, shipped_root

    root = shipped_root(profile, seed, task)
    if not (root / META_FILE).is_file():
        return None
    out = compare(assets, load_assets(root))
    out["shipped_is_current_recipe"] = is_prepared(root, profile, task)
    return out
