"""Data-parallel scaling (``adwin bench scale``): steps/s of the same run on 1 and 2 processes, and the cost
of the audit's cross-rank combine.

Both runs are ``adwin train`` commands on this machine with the same config and the same global batch
(``--nproc 1`` is the plain process; ``--nproc 2`` two gloo ranks on CPU, or NCCL ranks with
``--set model.device=cuda``), inline probes and ``rollout.seeding: per_sample`` (what makes the two runs
train on the same samples). steps/s is measured on the steady steps (the first step, with its start-up,
and evaluation time are left out): ``(steps - 1) / sum of their wall times``.

The combine: the all-reduce that turns each rank's shard of an audit into the batch's
(``adwin.audit.combine``), timed apart on 2 gloo ranks with the run's model size and candidates: for
``fast`` the (K+1) x n_params float32 segment gradients, for ``sketch`` the (K+1) x sketch_dim float64
batch sketch; the median of ``--repeats``.

On a machine whose cores are shared (2 here, busy with other work), the ratio measures how much CPU
share two processes take, not how the trainer scales: the report says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="preset name or YAML path (default: the 'default' preset)")
    p.add_argument("--profile", choices=["default", "tiny"], default="default", help="built-in task model size")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=20, help="timed all-reduces of the audit combine")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config overrides (repeatable)")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temporary folder)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


def _train_args(args: argparse.Namespace, nproc: int, out: Path) -> list[str]:
    cmd = ["train", "--nproc", str(nproc), "--profile", args.profile, "--steps", str(args.steps),
           "--out", str(out), "--name", f"scale-{nproc}", "--no-serve", "--no-progress", "--probe-backend", "inline",
           "--set", "rollout.seeding=per_sample", "--set", "eval.every=0", "--set", "checkpoint_every=0"]
    if args.config:
        cmd += ["--config", args.config]
    for item in args.set:
        cmd += ["--set", item]
    return cmd


def _stderr_report(stderr: str, path: Path, keep: int = 2000) -> str:
    """The failed run's stderr, whole in ``path``, and for the error its head and its tail: a rank's own error
    comes first, and torchrun's summary of the failed ranks, last, would fill a tail alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stderr)
    if len(stderr) <= 2 * keep:
        return f"(whole stderr in {path})\n{stderr}"
    return f"(whole stderr in {path})\n{stderr[:keep]}\n[...]\n{stderr[-keep:]}"


def run_once(args: argparse.Namespace, nproc: int, out: Path) -> dict[str, float]:
    """One ``adwin train --nproc N`` run in a subprocess; steady-state steps/s from its metrics."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "adwin", *_train_args(args, nproc, out)], env=env,
                          capture_output=True, text=True, check=False)
    launch_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"adwin train --nproc {nproc} failed ({proc.returncode}): "
                           f"{_stderr_report(proc.stderr, out / f'scale-{nproc}.stderr')}")
    rows = [json.loads(x) for x in (out / f"scale-{nproc}" / "metrics.jsonl").read_text().splitlines()]
    walls = [float(r["time/wall"]) for r in rows]
    steady = [b - a - float(r.get("time/eval", 0.0)) for a, b, r in zip(walls[:-1], walls[1:], rows[1:], strict=True)]

    def mean(key: str) -> float:
        return statistics.fmean(float(r.get(key, 0.0)) for r in rows[1:])

    return {"steps_per_s": len(steady) / sum(steady), "step_s": statistics.fmean(steady), "launch_s": launch_s,
            "rollout_s": mean("time/rollout"), "train_s": mean("time/train"), "probe_s": mean("time/probe"),
            "audit_s": mean("time/audit"), "audits": float(sum("audit/id" in r for r in rows)),
            "windows": [int(r["window/current"]) for r in rows]}  # type: ignore[dict-item]


def _combine_worker(rank: int, port: int, shapes: dict[str, tuple[int, int]], repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        res: dict[str, float] = {}
        for name, (rows, cols) in shapes.items():
            t = torch.randn(rows, cols, dtype=torch.float64 if name == "sketch" else torch.float32)
            times = []
            for _ in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - t0)
            res[f"{name}_ms"] = 1e3 * statistics.median(times[1:])
            res[f"{name}_mb"] = t.numel() * t.element_size() / 2**20
        if rank == 0:
            Path(out).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def combine_cost(n_params: int, n_segments: int, sketch_dim: int, repeats: int) -> dict[str, float]:
    """Median all-reduce time (ms) and size (MiB) of the fast and sketch combines on 2 gloo ranks."""
    import torch.multiprocessing as mp

    from adwin.loop.distributed import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "combine.json"
        shapes = {"fast": (n_segments, n_params), "sketch": (n_segments, sketch_dim)}
        mp.spawn(_combine_worker, args=(free_port(), shapes, repeats, str(out)), nprocs=2, join=True)
        return json.loads(out.read_text())


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from adwin.audit.alignment import DEFAULT_SKETCH_DIM
    from adwin.config import load_config, parse_set, resolve_config
    from adwin.loop.parts import load_parts

    if args.steps < 2:
        raise ValueError(f"--steps must be at least 2 (the first step is not timed), got {args.steps}")
    cfg = load_config(resolve_config(args.config).path, parse_set(args.set))
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="adwin-bench-scale-"))
    results = {n: run_once(args, n, out) for n in (1, 2)}
    ratio = results[2]["steps_per_s"] / results[1]["steps_per_s"]
    student = load_parts(cfg, args.profile).student
    n_params = sum(p.numel() for p in student.parameters() if p.requires_grad)
    sketch_dim = cfg.audit.sketch_dim or DEFAULT_SKETCH_DIM
    combine = combine_cost(n_params, len(cfg.window.candidates) + 1, sketch_dim, args.repeats)

    table = Table(title=f"adwin bench scale: profile {args.profile}, {args.steps} steps, "
                        f"{cfg.rollout.prompts_per_step} x {cfg.rollout.samples_per_prompt} rows per step")
    for col in ("processes", "steps/s", "step s", "rollout s", "train s", "probe s", "audit s", "audits", "windows"):
        table.add_column(col, justify="right")
    for n, r in results.items():
        table.add_row(str(n), f"{r['steps_per_s']:.3f}", f"{r['step_s']:.2f}", f"{r['rollout_s']:.2f}",
                      f"{r['train_s']:.2f}", f"{r['probe_s']:.2f}", f"{r['audit_s']:.2f}", f"{r['audits']:.0f}",
                      " ".join(map(str, r["windows"])))
    console = Console(width=200)
    console.print(table)
    load = os.getloadavg()
    console.print(f"2 / 1 processes: {ratio:.2f}x steps/s; same windows: {results[1]['windows'] == results[2]['windows']}")
    console.print(f"audit combine on 2 gloo ranks, {n_params:,} parameters, K+1 = {len(cfg.window.candidates) + 1}: "
                  f"fast {combine['fast_mb']:.2f} MiB in {combine['fast_ms']:.2f} ms, sketch "
                  f"{combine['sketch_mb']:.2f} MiB in {combine['sketch_ms']:.2f} ms (median of {args.repeats})")
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if os.cpu_count() is not None and os.cpu_count() <= 2:  # type: ignore[operator]
        console.print("on 2 shared cores this ratio is not scaling: 2 processes take a larger share of busy cores "
                      "from other work, and on an idle 2-core machine both ranks compete for the same cores")
    if args.json_path:
        meta: dict[str, Any] = {"profile": args.profile, "steps": args.steps, "cpus": os.cpu_count(),
                                "loadavg": list(load), "n_params": n_params}
        Path(args.json_path).write_text(json.dumps({"meta": meta, "results": results, "ratio": ratio,
                                                    "combine": combine}, indent=2))
    return 0
