"""Latency and throughput of the controller service (``adwin bench controller``).

Starts a real ``adwin controller serve`` process on 127.0.0.1 (a fresh SQLite file in a temporary
directory), registers one ADWIN run and measures, with a bounded asyncio load from
``httpx.AsyncClient`` (``--concurrency`` requests in flight, ``--requests`` in total):

* ``GET /v1/runs/{id}/window``: p50/p99 latency and throughput;
* sketch-audit ingest: ``--ranks`` ranks each POST a (``--segments``, ``--dim``) float32 sketch
  (base64) concurrently; the time from the first request leaving to the deciding answer arriving.

Also times the in-process ``Controller.get_window`` (no HTTP) for reference. The load generator runs
on the same machine as the server, so on few cores the client's own CPU time is part of what is
measured: the numbers are an upper bound on the service's own latency.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=20000, help="timed GET window requests")
    p.add_argument("--warmup", type=int, default=1000, help="untimed GET window requests first")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--audits", type=int, default=10, help="timed sketch audits (after one warm-up audit)")
    p.add_argument("--ranks", type=int, default=8, help="ranks per sketch audit")
    p.add_argument("--segments", type=int, default=6, help="K+1 sketch rows (K candidates)")
    p.add_argument("--dim", type=int, default=16384, help="sketch width D")
    p.add_argument("--url", default=None, help="bench this running service instead of starting one")
    p.add_argument("--tiny", action="store_true", help="tiny counts (smoke test)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(db: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "adwin.cli", "controller", "serve", "--port", str(port), "--db", str(db)]
    env = {k: v for k, v in os.environ.items() if k != "ADWIN_CONTROLLER_TOKEN"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"controller serve exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("controller serve did not become healthy within 120 s")


def _proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), or None when unavailable."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def _window_load(url: str, run_id: str, n: int, concurrency: int) -> tuple[list[float], float]:
    """``n`` GETs with ``concurrency`` workers on keep-alive connections; per-request seconds and wall."""
    import httpx

    latencies: list[float] = []
    counter = iter(range(n))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:

        async def worker() -> None:
            for i in counter:
                t0 = time.perf_counter()
                r = await client.get(f"/v1/runs/{run_id}/window", params={"step": i % 1000})
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    raise RuntimeError(f"GET window answered {r.status_code}: {r.text[:200]}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return latencies, wall


async def _audit_load(
    url: str, run_id: str, audits: int, ranks: int, payloads: list[str], shape: list[int], tag: str
) -> list[float]:
    """Per audit: set up a probe batch (untimed), then all ranks POST their sketch concurrently."""
    import httpx

    times: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        for a in range(audits):
            offers = [{"sample_id": f"{tag}{a}-{i}", "prompt_id": "p", "response_len": 1, "version": a} for i in range(2)]
            (await client.post(f"/v1/runs/{run_id}/probes/offers", json={"step": a, "offers": offers})).raise_for_status()
            for o in offers:
                rep = {"probe_id": o["sample_id"], "step": a, "tokens_added": 1, "version": a, "finished": True}
                (await client.post(f"/v1/runs/{run_id}/probes/reports", json=rep)).raise_for_status()
            batch = await client.post(f"/v1/runs/{run_id}/probes/batches")
            batch.raise_for_status()
            audit_id = batch.json()["audit_id"]
            bodies = [json.dumps({"rank": r, "sketch_b64": payloads[r], "sketch_shape": shape}) for r in range(ranks)]
            headers = {"Content-Type": "application/json"}
            t0 = time.perf_counter()
            answers = await asyncio.gather(
                *(client.post(f"/v1/runs/{run_id}/audits/{audit_id}", content=b, headers=headers) for b in bodies)
            )
            elapsed = time.perf_counter() - t0
            states = sorted(r.json()["state"] for r in answers)
            if states.count("decided") != 1 or any(r.status_code != 200 for r in answers):
                raise RuntimeError(f"audit {audit_id} did not decide exactly once: {[r.status_code for r in answers]} {states}")
            times.append(elapsed)
    return times


def _inprocess_window(n: int) -> list[float]:
    from adwin.controller import Controller
    from adwin.controller.schemas import PolicyIn, RunIn

    ctrl = Controller()
    rid = ctrl.register_run(RunIn(policy=PolicyIn(candidates=[128, 256, 512, 1024, 2048]))).run_id
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        ctrl.get_window(rid, i)
        out.append(time.perf_counter() - t0)
    ctrl.close()
    return out


def main(args: argparse.Namespace) -> int:
    import httpx
    import numpy as np

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    if args.tiny:
        args.requests, args.warmup, args.concurrency, args.audits, args.ranks, args.dim = 200, 20, 4, 2, 2, 256
    if min(args.requests, args.concurrency, args.ranks, args.segments, args.dim) < 1 or args.audits < 1:
        raise ValueError("--requests, --concurrency, --audits, --ranks, --segments and --dim must be >= 1")
    candidates = [128 * 2**i for i in range(args.segments - 1)]  # K = segments - 1 candidates
    rng = np.random.default_rng(0)
    payloads = [
        base64.b64encode(rng.standard_normal((args.segments, args.dim)).astype("<f4").tobytes()).decode()
        for _ in range(args.ranks)
    ]
    proc = None
    with tempfile.TemporaryDirectory(prefix="adwin-bench-controller-") as tmp:
        try:
            if args.url:
                url = args.url.rstrip("/")
            else:
                proc, url = _start_server(Path(tmp) / "bench.db")
            spec = {
                "name": "bench",
                "policy": {"name": "adwin", "candidates": candidates, "max_len": max(8192, candidates[-1])},
                "probe_batch_size": 2,
                "offers_per_step": 64,
                "world_size": args.ranks,
            }
            r = httpx.post(f"{url}/v1/runs", json=spec, timeout=30.0)
            r.raise_for_status()
            run_id = r.json()["run_id"]
            shape = [args.segments, args.dim]
            asyncio.run(_window_load(url, run_id, args.warmup, args.concurrency))
            asyncio.run(_audit_load(url, run_id, 1, args.ranks, payloads, shape, "warm"))  # warm-up (imports, caches)
            pid = None if proc is None else proc.pid
            cpu0, client0 = _proc_cpu_s(pid), time.process_time()
            lat, wall = asyncio.run(_window_load(url, run_id, args.requests, args.concurrency))
            cpu1, client1 = _proc_cpu_s(pid), time.process_time()
            audit_times = asyncio.run(_audit_load(url, run_id, args.audits, args.ranks, payloads, shape, "timed"))
            cpu2 = _proc_cpu_s(pid)
        finally:
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    inproc = _inprocess_window(max(1000, args.requests // 4))
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "window_get": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "p50_ms": 1e3 * _pct(lat, 0.50),
            "p99_ms": 1e3 * _pct(lat, 0.99),
            "throughput_rps": args.requests / wall,
            # CPU the server process spent per request: what bounds throughput on a free core
            "server_cpu_us_per_request": None if cpu0 is None or cpu1 is None else 1e6 * (cpu1 - cpu0) / args.requests,
            "client_cpu_us_per_request": 1e6 * (client1 - client0) / args.requests,
        },
        "window_get_inprocess": {"calls": len(inproc), "p50_us": 1e6 * _pct(inproc, 0.5), "p99_us": 1e6 * _pct(inproc, 0.99)},
        "sketch_audit": {
            "audits": args.audits,
            "ranks": args.ranks,
            "shape": shape,
            "body_bytes_per_rank": len(payloads[0]) + 60,
            "p50_ms": 1e3 * statistics.median(audit_times),
            "max_ms": 1e3 * max(audit_times),
            "server_cpu_ms_per_audit": None if cpu1 is None or cpu2 is None else 1e3 * (cpu2 - cpu1) / args.audits,
        },
    }
    w, a, ip = result["window_get"], result["sketch_audit"], result["window_get_inprocess"]
    sys.stdout.write(
        f"controller bench on {result['cpus']} CPUs (1-min load {result['load_avg_1m']:.2f}; client and server share them)\n"
        f"  GET window   : p50 {w['p50_ms']:.2f} ms  p99 {w['p99_ms']:.2f} ms  {w['throughput_rps']:.0f} req/s "
        f"({w['requests']} requests, {w['concurrency']} in flight)\n"
        f"                 server CPU {w['server_cpu_us_per_request'] or float('nan'):.0f} us/request, "
        f"load-generator CPU {w['client_cpu_us_per_request']:.0f} us/request\n"
        f"  in-process   : p50 {ip['p50_us']:.1f} us  p99 {ip['p99_us']:.1f} us  ({ip['calls']} calls)\n"
        f"  sketch audit : p50 {a['p50_ms']:.1f} ms  max {a['max_ms']:.1f} ms to decision "
        f"({a['ranks']} ranks x {shape[0]} x {shape[1]} float32, {a['audits']} audits; "
        f"server CPU {a['server_cpu_ms_per_audit'] or float('nan'):.1f} ms/audit)\n"
    )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0
