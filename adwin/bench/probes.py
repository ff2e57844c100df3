"""Wall time of probe workers (``adwin bench probes``): the same short run five ways.

(a) A fixed window, no probes, at the config's initial window (``window.initial``; ``--fixed-window`` names
another): the run ADWIN's extra work is compared with, run first so that a bench cut short still has what it
divides by; then ADWIN with (b) inline probes and audits, (c) probe rounds riding the next step's rollout call
(``rollout``: audits inline), (d) a thread worker, (e) a Ray actor (workers also compute the audits). Each
run's row is appended to ``<out>/rows.jsonl`` (and ``--json`` rewritten) as soon as it finishes, so a cut bench
still reports every run that finished. Each run starts from the same checkpoints,
seed and prompts; its wall time excludes evaluation (equal for all). Reported: wall time as a ratio to
(a), the learner-side share of probe and audit time (``time/probe`` + ``time/audit`` over the wall: what
the learner itself spends on probes, offers, teacher scoring of probe batches and waits), the time the
step spent blocked on probes (``probe/blocked_s``: inline rounds, forced completions), probe tokens,
audits, the mean window and window changes per audit, decode steps per training step (``rollout/decode_steps``
and ``probe/decode_steps``: on a GPU a decode step costs about the same for 1 row or 64, so steps are what probe
work adds there); for ``rollout`` also the probe rows the rollout calls carried and the wall of those calls (``probe/rider_rows``, ``probe/rider_s``: the learner pays for the probe rows
inside ``time/rollout``, not ``time/probe``). Ray's cluster start-up is timed apart (once per process), not in (d).

The runs share the machine with everything else on it; on 2 cores a worker competes with the trainer
for the same cores, so the ratios say more about a larger machine's lower bound than its speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

VARIANTS = ("fixed", "inline", "rollout", "thread", "ray")  # the baseline first


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="preset name or YAML path (default: the 'default' preset)")
    p.add_argument("--profile", choices=["default", "tiny"], default="default", help="built-in task model size")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config overrides (repeatable)")
    p.add_argument("--fixed-window", type=int, default=None, metavar="W",
                   help="the baseline's window (default: the config's window.initial)")
    p.add_argument("--padding", action="store_true",
                   help="instead of the runs: what riding probe rows cost one rollout generate call (adwin.bench.riding)")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temporary folder)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


def _config(args: argparse.Namespace, variant: str, out: Path, fixed_window: int | None = None) -> Any:
    from adwin.config import load_config, parse_set, policy_overrides, resolve_config

    ov = parse_set(args.set)
    ov |= {"steps": args.steps, "name": f"bench-{variant}", "out_dir": str(out), "eval.every": 0,
           "controller.serve": False, "logging.progress": False, "checkpoint_every": 0}
    base = load_config(resolve_config(args.config).path, ov)
    if variant == "fixed":
        ov |= policy_overrides("fixed", window=fixed_window or base.window.initial or max(base.window.candidates))
    else:
        ov |= {"probes.backend": variant}
    return load_config(resolve_config(args.config).path, ov)


def run_variant(args: argparse.Namespace, variant: str, out: Path, fixed_window: int | None = None) -> dict[str, float]:
    from adwin.controller import Controller
    from adwin.loop.parts import limit_threads
    from adwin.loop.trainer import load_parts, train

    cfg = _config(args, variant, out, fixed_window)
    parts = load_parts(cfg, args.profile)
    limit_threads(parts.student, cfg.model.device)
    res = train(cfg, Controller(), parts)
    h = res.history

    def total(key: str) -> float:
        return float(sum(float(r.get(key, 0.0)) for r in h))

    wall = float(h[-1]["time/wall"]) - total("time/eval")
    windows = [int(r["window/current"]) for r in h]
    audits = total("audit/submitted")
    changes = sum(1 for a, b in zip(windows, windows[1:], strict=False) if a != b)
    return {"wall_s": wall, "blocked_s": total("probe/blocked_s"), "probe_s": total("time/probe"),
            "audit_s": total("time/audit"), "learner_share": (total("time/probe") + total("time/audit")) / wall,
            "probe_tokens": total("probe/tokens"), "audits": audits, "sync_tokens": total("rollout/sync_tokens"),
            "lost": total("probe/lost"), "mean_window": sum(windows) / len(windows),
            "changes_per_audit": changes / audits if audits else 0.0,
            "lag_max": max((float(r.get("audit/lag_steps", 0.0)) for r in h), default=0.0),
            "rollout_s": total("time/rollout"), "rider_rows": total("probe/rider_rows"),
            "rider_s": total("probe/rider_s"),
            # decode steps per training step: what costs on a GPU, where a step costs about the same for 1 row or 64
            "rollout_decode_steps": total("rollout/decode_steps") / len(h),
            "probe_decode_steps": total("probe/decode_steps") / len(h),
            "decision_learner_share": float(h[-1].get("decision/learner_share", 0.0))}


def main(args: argparse.Namespace) -> int:
    import tempfile

    import torch
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    if args.padding:
        return _padding(args)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or "fixed" not in variants:
        raise ValueError(f"--variants must include 'fixed' and only name {VARIANTS}, got {args.variants!r}")
    variants = [v for v in VARIANTS if v in variants]  # the baseline first: a cut bench still has its divisor
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="adwin-bench-probes-"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    extra: dict[str, float] = {}
    for v in variants:
        if v == "ray":
            from adwin.probes.ray_actor import ensure_ray

            t0 = time.perf_counter()
            ensure_ray(None, 2)
            extra["ray_init_s"] = time.perf_counter() - t0
        log.info("bench probes: running %s", v)
        results[v] = row = run_variant(args, v, out, args.fixed_window)
        base = results["fixed"]["wall_s"]
        row["ratio"] = row["wall_s"] / base if base > 0 else float("nan")
        keep_row(out, args.json_path, v, row, results, _meta(args, extra))
    table = Table(title=f"adwin bench probes: profile {args.profile}, {args.steps} steps")
    cols = ("variant", "wall s", "x fixed", "learner probe+audit", "blocked s", "probe s", "audit s", "rollout s",
            "rider rows", "decode steps/step rollout+probe", "probe tokens", "audits", "mean W", "changes/audit",
            "max lag")
    for col in cols:
        table.add_column(col, justify="right")
    for v, r in results.items():
        table.add_row(v, f"{r['wall_s']:.2f}", f"{r['ratio']:.2f}", f"{100 * r['learner_share']:.1f} %",
                      f"{r['blocked_s']:.2f}", f"{r['probe_s']:.2f}", f"{r['audit_s']:.2f}", f"{r['rollout_s']:.2f}",
                      f"{r['rider_rows']:.0f}", f"{r['rollout_decode_steps']:.1f}+{r['probe_decode_steps']:.1f}",
                      f"{r['probe_tokens']:.0f}",
                      f"{r['audits']:.0f}", f"{r['mean_window']:.1f}", f"{r['changes_per_audit']:.2f}",
                      f"{r['lag_max']:.0f}")
    Console(width=200).print(table)  # wide: a bench table read in logs must not wrap
    load = os.getloadavg()
    Console().print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; {extra}")
    return 0


def _padding(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from adwin.bench.riding import padding_cost
    from adwin.loop.parts import load_parts

    cfg = _config(args, "inline", Path("."))
    student = load_parts(cfg, args.profile).student
    res = padding_cost(student, pad_id=0)
    table = Table(title=f"riding probe rows in one rollout call: {args.profile} student on {cfg.model.device} "
                        "(128 rows of 20 tokens + 8 probe rows of 200, 64 steps)")
    for col in ("cache", "alone s", "riding s", "separate s", "riding / alone", "(alone + separate) / alone",
                "ms/step alone", "ms/step riding"):
        table.add_column(col, justify="right")
    for cache, r in res.items():
        table.add_row(cache, f"{r['alone']:.3f}", f"{r['riding']:.3f}", f"{r['separate']:.3f}", f"{r['riding_x']:.2f}",
                      f"{r['separate_x']:.2f}", f"{r['ms_per_step_alone']:.1f}", f"{r['ms_per_step_riding']:.1f}")
    Console(width=200).print(table)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"meta": _meta(args, {}), "padding": res}, indent=2))
    return 0


def _meta(args: argparse.Namespace, extra: dict[str, float]) -> dict[str, Any]:
    return {"profile": args.profile, "steps": args.steps, "cpus": os.cpu_count(), "loadavg": list(os.getloadavg()),
            **extra}


def keep_row(out: Path, json_path: str | None, variant: str, row: dict[str, float],
             results: dict[str, dict[str, float]], meta: dict[str, Any]) -> None:
    """A finished run's row on disk now: one line appended to ``out/rows.jsonl``, and the whole ``--json`` so far."""
    with (out / "rows.jsonl").open("a") as fh:
        fh.write(json.dumps({"variant": variant, **row}) + "\n")
    if json_path:
        Path(json_path).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
