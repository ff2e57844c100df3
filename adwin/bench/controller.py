"""Latency and throughput of the controller service (``adwin bench controller``).

Starts a real ``adwin controller serve`` process on 127.0.0.1 (a fresh SQLite file in a temporary
directory), registers one ADWIN run and measures:

* ``GET /v1/runs/{id}/window``, driven by ``--processes`` load-generator processes, each an asyncio
  loop over ``httpx`` (``--concurrency`` keep-alive connections per process, a fixed request count):
  - *paced*: open loop at ``--rate`` requests/s in total; a request's latency counts from its
    scheduled send time, so a client or server falling behind shows up in the percentiles;
  - *saturated*: closed loop, every connection sends again at once; the throughput ceiling.
  Reported: p50/p99/max latency, achieved throughput, and the CPU seconds the server process and the
  load generators spent per request (from ``/proc`` and ``time.process_time``).
* sketch-audit ingest: ``--ranks`` ranks each POST a (``--segments``, ``--dim``) float32 sketch
  concurrently, as raw bytes (``…/sketch``, ``application/octet-stream``) and as base64 JSON; the time
  from the first request leaving to the deciding answer arriving.

Also times the in-process ``Controller.get_window`` (no HTTP) for reference. Client and server share
the machine's cores: on few cores the load generator's own CPU is part of what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import logging
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_VERSIONS = itertools.count(1000)  # probe versions of the audit phase: above the GET load's steps (< 1000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=20000, help="timed GET window requests per phase (all processes)")
    p.add_argument("--warmup", type=int, default=1000, help="untimed GET window requests first")
    p.add_argument("--processes", type=int, default=2, help="load-generator processes")
    p.add_argument("--concurrency", type=int, default=2, help="connections (requests in flight) per process")
    p.add_argument("--rate", type=float, default=1000.0, help="paced phase: total requests/s (0: skip it)")
    p.add_argument("--client", choices=["httpx", "asyncio"], default="httpx",
                   help="load generator: httpx (default) or a minimal asyncio-streams HTTP/1.1 client (cheaper per request)")
    p.add_argument("--audits", type=int, default=10, help="timed sketch audits per encoding (after one warm-up)")
    p.add_argument("--ranks", type=int, default=8, help="ranks per sketch audit")
    p.add_argument("--segments", type=int, default=6, help="K+1 sketch rows (K candidates)")
    p.add_argument("--dim", type=int, default=16384, help="sketch width D")
    p.add_argument("--url", default=None, help="bench this running service instead of starting one")
    p.add_argument("--tiny", action="store_true", help="tiny counts (smoke test)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


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


# --- GET window load: one process ---------------------------------------------------------------


class _HttpxGetter:
    """GETs through httpx's transport layer (its public lower API), connections pooled and kept alive.

    The client's per-request machinery (URL merging, cookies, auth and redirect hooks) would cost more
    CPU than the server spends on the request; the transport still parses HTTP with h11 in Python.
    """

    def __init__(self, url: str, run_id: str, concurrency: int) -> None:
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.transport = httpx.AsyncHTTPTransport(limits=limits, retries=0)
        self.requests = [httpx.Request("GET", f"{url}/v1/runs/{run_id}/window?step={i}") for i in range(1000)]

    async def get(self, i: int) -> int:
        response = await self.transport.handle_async_request(self.requests[i % 1000])
        await response.aread()
        return response.status_code

    async def aclose(self) -> None:
        await self.transport.aclose()


class _StreamGetter:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams (``--client asyncio``).

    Pre-encoded requests, one connection per in-flight request, the response read by Content-Length.
    It costs a fraction of httpx's CPU per request, so on few cores it shows what the server itself
    sustains; it is not a general client (no chunked bodies, no redirects).
    """

    def __init__(self, url: str, run_id: str, concurrency: int) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.requests = [
            f"GET /v1/runs/{run_id}/window?step={i} HTTP/1.1\r\nHost: {u.netloc}\r\n\r\n".encode() for i in range(1000)
        ]
        self.idle: asyncio.Queue = asyncio.Queue()
        self.concurrency = concurrency
        self.opened = False

    async def get(self, i: int) -> int:
        if not self.opened:
            self.opened = True
            for _ in range(self.concurrency):
                self.idle.put_nowait(await asyncio.open_connection(self.host, self.port))
        reader, writer = await self.idle.get()
        try:
            writer.write(self.requests[i % 1000])
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            start = head.lower().find(b"content-length:")
            length = int(head[start + 15 : head.index(b"\r\n", start)]) if start >= 0 else 0
            await reader.readexactly(length)
        finally:
            self.idle.put_nowait((reader, writer))
        return status

    async def aclose(self) -> None:
        while not self.idle.empty():
            _, writer = self.idle.get_nowait()
            writer.close()


async def _window_worker_loop(
    url: str, run_id: str, n: int, concurrency: int, rate: float, start_at: float, client: str
) -> dict[str, Any]:
    """``n`` GETs over ``concurrency`` connections; paced at ``rate`` req/s (this process) or closed loop (0)."""
    getter = _StreamGetter(url, run_id, concurrency) if client == "asyncio" else _HttpxGetter(url, run_id, concurrency)
    latencies: list[float] = []  # from the scheduled send time (paced) / the send (closed loop)
    service: list[float] = []  # from the actual send: without the load generator's own lateness
    errors = 0
    counter = iter(range(n))
    try:
        # open the connections before the clock starts
        await asyncio.gather(*(getter.get(0) for _ in range(concurrency)))
        while time.perf_counter() < start_at:  # every process starts together
            await asyncio.sleep(min(0.005, max(0.0, start_at - time.perf_counter())))
        t0 = time.perf_counter()
        cpu0 = time.process_time()

        async def worker() -> None:
            nonlocal errors
            for i in counter:
                due = t0 + i / rate if rate > 0 else time.perf_counter()
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                sent = time.perf_counter()
                status = await getter.get(i)
                done = time.perf_counter()
                latencies.append(done - due)
                service.append(done - sent)
                errors += status != 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        t1 = time.perf_counter()
        cpu1 = time.process_time()
    finally:
        await getter.aclose()
    return {"latencies": latencies, "service": service, "t0": t0, "t1": t1, "cpu_s": cpu1 - cpu0, "errors": errors}


def _window_worker(args: tuple) -> dict[str, Any]:
    try:  # the server runs on uvloop (uvicorn[standard]); so does the load generator when it is there
        import uvloop

        return uvloop.run(_window_worker_loop(*args))
    except ImportError:
        return asyncio.run(_window_worker_loop(*args))


def _window_load(
    url: str, run_id: str, n: int, processes: int, concurrency: int, rate: float, client: str = "httpx"
) -> dict[str, Any]:
    """Split ``n`` GETs over ``processes`` processes; merged latencies, wall span and client CPU."""
    per = [n // processes + (1 if p < n % processes else 0) for p in range(processes)]
    start_at = time.perf_counter() + 1.5 + 0.3 * processes  # time for the processes to start and connect
    jobs = [(url, run_id, k, concurrency, rate / processes, start_at, client) for k in per if k > 0]
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        parts = pool.map(_window_worker, jobs)
    lat = [x for p in parts for x in p["latencies"]]
    service = [x for p in parts for x in p["service"]]
    wall = max(p["t1"] for p in parts) - min(p["t0"] for p in parts)
    errors = sum(p["errors"] for p in parts)
    if errors:
        raise RuntimeError(f"{errors} GET window requests did not answer 200")
    return {"latencies": lat, "service": service, "wall_s": wall, "client_cpu_s": sum(p["cpu_s"] for p in parts)}


# --- sketch audits ------------------------------------------------------------------------------


async def _audit_load(
    url: str, run_id: str, audits: int, ranks: int, sketches: list[bytes], shape: list[int], tag: str, encoding: str
) -> list[float]:
    """Per audit: set up a probe batch (untimed), then all ranks POST their sketch concurrently."""
    import httpx

    if encoding == "raw":
        bodies = sketches
        headers = {"Content-Type": "application/octet-stream"}
    else:
        bodies = [
            json.dumps({"rank": r, "sketch_b64": base64.b64encode(s).decode(), "sketch_shape": shape}).encode()
            for r, s in enumerate(sketches)
        ]
        headers = {"Content-Type": "application/json"}
    times: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        for a in range(audits):
            v = next(_VERSIONS)  # past every step asked about before: the probes are fresh (staleness 0)
            offers = [{"sample_id": f"{tag}{a}-{i}", "prompt_id": "p", "response_len": 1, "version": v} for i in range(2)]
            (await client.post(f"/v1/runs/{run_id}/probes/offers", json={"step": v, "offers": offers})).raise_for_status()
            for o in offers:
                rep = {"probe_id": o["sample_id"], "step": v, "tokens_added": 1, "version": v, "finished": True}
                (await client.post(f"/v1/runs/{run_id}/probes/reports", json=rep)).raise_for_status()
            batch = await client.post(f"/v1/runs/{run_id}/probes/batches")
            batch.raise_for_status()
            audit_id = batch.json()["audit_id"]
            if encoding == "raw":
                posts = [
                    client.post(f"/v1/runs/{run_id}/audits/{audit_id}/sketch", content=bodies[r], headers=headers,
                                params={"rank": r, "rows": shape[0], "cols": shape[1]})
                    for r in range(ranks)
                ]
            else:
                posts = [client.post(f"/v1/runs/{run_id}/audits/{audit_id}", content=b, headers=headers) for b in bodies]
            t0 = time.perf_counter()
            answers = await asyncio.gather(*posts)
            elapsed = time.perf_counter() - t0
            if any(r.status_code != 200 for r in answers):
                raise RuntimeError(f"audit {audit_id}: {[r.status_code for r in answers]} {answers[0].text[:300]}")
            states = sorted(r.json()["state"] for r in answers)
            if states.count("decided") != 1:
                raise RuntimeError(f"audit {audit_id} did not decide exactly once: {states}")
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


def _window_summary(load: dict[str, Any], n: int, cpu: tuple[float | None, float | None], **extra: Any) -> dict[str, Any]:
    lat = load["latencies"]
    return {
        "requests": n,
        **extra,
        "p50_ms": 1e3 * _pct(lat, 0.50),
        "p99_ms": 1e3 * _pct(lat, 0.99),
        "max_ms": 1e3 * max(lat),
        # from the actual send: differs from the above (paced phase) by the load generator's lateness
        "p99_ms_from_send": 1e3 * _pct(load["service"], 0.99),
        "throughput_rps": n / load["wall_s"],
        # CPU the server process spent per request: what bounds throughput on a free core
        "server_cpu_us_per_request": None if None in cpu else 1e6 * (cpu[1] - cpu[0]) / n,  # type: ignore[operator]
        "client_cpu_us_per_request": 1e6 * load["client_cpu_s"] / n,
    }


def main(args: argparse.Namespace) -> int:
    import httpx
    import numpy as np

    from adwin.controller.serve import spawn_server

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    if args.tiny:
        args.requests, args.warmup, args.processes, args.concurrency = 200, 20, 1, 2
        args.rate, args.audits, args.ranks, args.dim = 400.0, 2, 2, 256
    if min(args.requests, args.processes, args.concurrency, args.ranks, args.segments, args.dim) < 1 or args.audits < 1:
        raise ValueError("--requests, --processes, --concurrency, --audits, --ranks, --segments and --dim must be >= 1")
    if args.rate < 0:
        raise ValueError("--rate must be >= 0")
    candidates = [128 * 2**i for i in range(args.segments - 1)]  # K = segments - 1 candidates
    rng = np.random.default_rng(0)
    sketches = [rng.standard_normal((args.segments, args.dim)).astype("<f4").tobytes() for _ in range(args.ranks)]
    shape = [args.segments, args.dim]
    proc = None
    result: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_1m_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="adwin-bench-controller-") as tmp:
        try:
            if args.url:
                url = args.url.rstrip("/")
            else:
                proc, url = spawn_server(str(Path(tmp) / "bench.db"), timeout_s=120)
            pid = None if proc is None else proc.pid
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
            _window_load(url, run_id, args.warmup, 1, args.concurrency, 0.0, args.client)
            # audits before the GET phases: on a shared machine, audits timed right after them were slower
            for encoding in ("raw", "base64"):
                asyncio.run(_audit_load(url, run_id, 1, args.ranks, sketches, shape, f"warm-{encoding}", encoding))
                cpu0 = _proc_cpu_s(pid)
                times = asyncio.run(_audit_load(url, run_id, args.audits, args.ranks, sketches, shape, f"t-{encoding}", encoding))
                cpu1 = _proc_cpu_s(pid)
                result[f"sketch_audit_{encoding}"] = {
                    "audits": args.audits,
                    "ranks": args.ranks,
                    "shape": shape,
                    "body_bytes_per_rank": len(sketches[0]) if encoding == "raw" else 4 * ((len(sketches[0]) + 2) // 3) + 60,
                    "p50_ms": 1e3 * statistics.median(times),
                    "max_ms": 1e3 * max(times),
                    "server_cpu_ms_per_audit": None if cpu0 is None or cpu1 is None else 1e3 * (cpu1 - cpu0) / args.audits,
                }
            if args.rate > 0:
                cpu0 = _proc_cpu_s(pid)
                paced = _window_load(url, run_id, args.requests, args.processes, args.concurrency, args.rate, args.client)
                result["window_get_paced"] = _window_summary(
                    paced, args.requests, (cpu0, _proc_cpu_s(pid)), client=args.client, processes=args.processes,
                    concurrency=args.concurrency, target_rps=args.rate,
                )
            cpu0 = _proc_cpu_s(pid)
            closed = _window_load(url, run_id, args.requests, args.processes, args.concurrency, 0.0, args.client)
            result["window_get_saturated"] = _window_summary(
                closed, args.requests, (cpu0, _proc_cpu_s(pid)), client=args.client, processes=args.processes,
                concurrency=args.concurrency,
            )
        finally:
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    inproc = _inprocess_window(max(1000, args.requests // 4))
    result["window_get_inprocess"] = {"calls": len(inproc), "p50_us": 1e6 * _pct(inproc, 0.5), "p99_us": 1e6 * _pct(inproc, 0.99)}
    result["load_avg_1m_after"] = os.getloadavg()[0]
    sys.stdout.write(_report(result))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _report(result: dict[str, Any]) -> str:
    nan = float("nan")
    lines = [
        f"controller bench on {result['cpus']} CPUs (1-min load {result['load_avg_1m_before']:.2f} before, "
        f"{result['load_avg_1m_after']:.2f} after; load generators and server share them)"
    ]
    for key, name in (("window_get_paced", "GET window, paced"), ("window_get_saturated", "GET window, saturated")):
        w = result.get(key)
        if w is None:
            continue
        target = f" (target {w['target_rps']:.0f} req/s)" if "target_rps" in w else ""
        if "target_rps" in w:
            target += f"; p99 from the actual send {w['p99_ms_from_send']:.2f} ms"
        lines.append(
            f"  {name:<23}: p50 {w['p50_ms']:.2f} ms  p99 {w['p99_ms']:.2f} ms  max {w['max_ms']:.1f} ms  "
            f"{w['throughput_rps']:.0f} req/s{target}; {w['client']}, {w['processes']} x {w['concurrency']} connections, "
            f"{w['requests']} requests"
        )
        lines.append(
            f"  {'':<23}  server CPU {w['server_cpu_us_per_request'] or nan:.0f} us/request, "
            f"load-generator CPU {w['client_cpu_us_per_request']:.0f} us/request"
        )
    ip = result["window_get_inprocess"]
    lines.append(f"  {'in-process get_window':<23}: p50 {ip['p50_us']:.1f} us  p99 {ip['p99_us']:.1f} us  ({ip['calls']} calls)")
    for enc in ("raw", "base64"):
        a = result[f"sketch_audit_{enc}"]
        lines.append(
            f"  {'sketch audit, ' + enc:<23}: p50 {a['p50_ms']:.1f} ms  max {a['max_ms']:.1f} ms to decision "
            f"({a['ranks']} ranks x {a['shape'][0]} x {a['shape'][1]} float32, {a['audits']} audits; "
            f"server CPU {a['server_cpu_ms_per_audit'] or nan:.1f} ms/audit)"
        )
    return "\n".join(lines) + "\n"
