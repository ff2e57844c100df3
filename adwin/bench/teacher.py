"""A teacher in process against a teacher behind a server (``adwin bench teacher``).

* **Training**: the same synchronous run (built-in task, ``--profile``; inline probes, per-sample seeding, no
  evaluation after the first) with ``model.teacher_backend: hf`` and with ``server``, the server an
  ``adwin teacher serve`` child process of the same teacher on this machine (``--server-threads`` intra-op
  threads). Runs alternate local / served ``--repeats`` times; each reports steady steps/s (the first step,
  with its start-up, is not timed) and the teacher's share of the step (``time/teacher`` over the step's wall).
  Both runs train the same student on the same samples: the windows must agree.
* **Server throughput**: prompt tokens scored per second by that server under 1, 4, 16 (``--clients``)
  concurrent clients, each an ``adwin`` ``TeacherClient`` sending ``--requests`` requests of ``--rows``
  sequences of ``--tokens`` random token ids; with the mean rows per forward (the dynamic batching) and the
  requests' median latency.

Clients, trainer and server share this machine's cores: on few, busy cores the served run pays for the
server's CPU as well as for HTTP, and the report gives the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_CLIENTS = (1, 4, 16)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="preset name or YAML path (default: the 'default' preset)")
    p.add_argument("--profile", choices=["default", "tiny"], default="default", help="built-in task model size")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=2, help="local / served run pairs, alternated")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config overrides (repeatable)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of the trainer (and its local teacher)")
    p.add_argument("--server-threads", type=int, default=1, help="intra-op threads of the teacher server")
    p.add_argument("--clients", default=",".join(map(str, DEFAULT_CLIENTS)),
                   help="concurrent clients of the throughput phase, comma-separated")
    p.add_argument("--requests", type=int, default=20, help="requests per client in the throughput phase")
    p.add_argument("--rows", type=int, default=8, help="sequences per request")
    p.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temporary folder)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


def _steady(history: list[dict[str, Any]]) -> dict[str, float]:
    """Steady steps/s and the teacher's share of the step, the first step left out."""
    walls = [float(r["time/wall"]) for r in history]
    steps = [b - a - float(r.get("time/eval", 0.0)) for a, b, r in zip(walls[:-1], walls[1:], history[1:], strict=True)]
    teacher = [float(r.get("time/teacher", 0.0)) for r in history[1:]]
    return {"steps_per_s": len(steps) / sum(steps), "step_s": statistics.fmean(steps),
            "teacher_s": statistics.fmean(teacher), "teacher_share": sum(teacher) / sum(steps)}


def train_pair(args: argparse.Namespace, url: str, out: Path) -> dict[str, Any]:
    """``--repeats`` alternated local and served runs of the same config."""
    from adwin.config import load_config, parse_set, resolve_config
    from adwin.controller import Controller
    from adwin.loop.parts import load_parts
    from adwin.loop.trainer import train

    base = parse_set(args.set) | {
        "steps": args.steps, "out_dir": str(out), "probes.backend": "inline", "rollout.seeding": "per_sample",
        "eval.every": 0, "checkpoint_every": 0, "controller.serve": False, "logging.progress": False,
        "logging.stdout": False}
    path = resolve_config(args.config).path
    runs: dict[str, list[dict[str, float]]] = {"local": [], "served": []}
    windows: dict[str, list[int]] = {}
    for i in range(args.repeats):
        for mode in ("local", "served"):
            ov = base | {"name": f"teacher-{mode}-{i}"}
            if mode == "served":
                ov |= {"model.teacher_backend": "server", "model.teachers": {"default": url}}
            cfg = load_config(path, ov)
            history = train(cfg, Controller(), parts=load_parts(cfg, args.profile)).history
            runs[mode].append(_steady(history))
            windows[mode] = [int(r["window/current"]) for r in history]
    summary = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
    return {"runs": runs, "median": summary, "windows": windows,
            "ratio": summary["served"]["steps_per_s"] / summary["local"]["steps_per_s"]}


def throughput(url: str, clients: int, args: argparse.Namespace, vocab: int) -> dict[str, float]:
    """Prompt tokens scored per second by ``clients`` concurrent clients (each its own ``TeacherClient``)."""
    import httpx

    from adwin.teacher.client import ClientSettings, TeacherClient

    rng = random.Random(clients)
    seqs = [[rng.randrange(3, vocab) for _ in range(args.tokens)] for _ in range(args.rows)]
    conns = []
    for _ in range(clients):
        c = TeacherClient(url, ClientSettings(rows_per_request=args.rows, concurrency=1, retries=0))
        c.connect(seqs[0][:4])
        conns.append(c)
    before = httpx.get(url.removesuffix("/v1") + "/healthz").json()
    latencies: list[float] = []
    lock = threading.Lock()

    def run(c: Any) -> None:
        for _ in range(args.requests):
            t0 = time.perf_counter()
            c.score(seqs)
            with lock:
                latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = httpx.get(url.removesuffix("/v1") + "/healthz").json()
    for c in conns:
        c.close()
    batches = max(1, after["batches"] - before["batches"])
    return {"clients": clients, "tokens_per_s": clients * args.requests * args.rows * args.tokens / wall,
            "requests_per_s": clients * args.requests / wall, "wall_s": wall,
            "rows_per_forward": (after["rows"] - before["rows"]) / batches,
            "latency_p50_ms": 1000 * statistics.median(latencies)}


def main(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from adwin.controller.serve import spawn_service
    from adwin.tasks.shipped import builtin_assets
    from adwin.teacher.checkpoints import load_tokenizer

    if args.steps < 2:
        raise ValueError(f"--steps must be at least 2 (the first step is not timed), got {args.steps}")
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    if not clients or min(clients) < 1:
        raise ValueError(f"--clients must list positive counts, got {args.clients!r}")
    torch.set_num_threads(args.threads)  # the in-process teacher gets what the server gets by default
    assets = builtin_assets(args.profile)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="adwin-bench-teacher-"))
    proc, base = spawn_service(["teacher", "serve", "--model", "builtin", "--profile", args.profile,
                                "--threads", str(args.server_threads)], timeout_s=300, token_env="ADWIN_TEACHER_TOKEN")
    try:
        url = f"{base}/v1"
        train_res = train_pair(args, url, out)
        vocab = len(load_tokenizer(assets.tokenizer_path))
        thr = [throughput(url, c, args, vocab) for c in clients]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    load = os.getloadavg()
    console = Console(width=200)
    t = Table(title=f"adwin bench teacher: profile {args.profile}, {args.steps} steps, median of {args.repeats}")
    for col in ("teacher", "steps/s", "step s", "teacher s", "teacher share"):
        t.add_column(col, justify="right")
    for mode, r in train_res["median"].items():
        t.add_row(mode, f"{r['steps_per_s']:.3f}", f"{r['step_s']:.3f}", f"{r['teacher_s']:.3f}",
                  f"{r['teacher_share']:.2f}")
    console.print(t)
    console.print(f"served / local: {train_res['ratio']:.2f}x steps/s; same windows: "
                  f"{train_res['windows']['local'] == train_res['windows']['served']}")
    t2 = Table(title=f"teacher server throughput: {args.requests} requests x {args.rows} rows x {args.tokens} tokens "
                     f"per client, {args.server_threads} server thread(s)")
    for col in ("clients", "tokens/s", "requests/s", "rows per forward", "p50 latency ms"):
        t2.add_column(col, justify="right")
    for r in thr:
        t2.add_row(str(r["clients"]), f"{r['tokens_per_s']:.0f}", f"{r['requests_per_s']:.1f}",
                   f"{r['rows_per_forward']:.1f}", f"{r['latency_p50_ms']:.1f}")
    console.print(t2)
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if args.json_path:
        meta = {"profile": args.profile, "steps": args.steps, "repeats": args.repeats, "cpus": os.cpu_count(),
                "loadavg": list(load), "threads": args.threads, "server_threads": args.server_threads}
        Path(args.json_path).write_text(json.dumps({"meta": meta, "train": train_res, "throughput": thr}, indent=2))
    return 0
