"""A training run survives its controller being SIGKILLed mid-run and restarted on the same database.

Real ``adwin controller serve`` subprocess on 127.0.0.1, real ``RemoteController`` wrapped in degraded mode
(``adwin.train.open_controller``), tiny on-disk models. Bounded: every wait has a deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from reliability_record import record

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tiny model fixtures live there
from trainer_fixtures import tiny_overrides  # noqa: E402

from adwin.config import load_config  # noqa: E402
from adwin.loop.trainer import train  # noqa: E402
from adwin.train import open_controller  # noqa: E402

STEPS, KILL_AT, RESTART_AT = 10, 2, 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(db: Path, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "adwin.cli", "controller", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=log.open("ab"), env={**os.environ, "ADWIN_CONTROLLER_TOKEN": ""},
    )


def _wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"controller exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"controller at {url} not healthy within {timeout} s")


@pytest.mark.timeout(240)
def test_run_survives_controller_sigkill_and_replays_everything_once(tmp_path: Path) -> None:
    db, log, port = tmp_path / "controller.db", tmp_path / "serve.log", _free_port()
    url = f"http://127.0.0.1:{port}"
    procs = [_serve(db, port, log)]
    try:
        _wait_healthy(procs[0], url)
        cfg = load_config(None, tiny_overrides(tmp_path, steps=STEPS, name="sigkill", **{
            "eval.every": 0, "controller.url": url}))
        controller, _, _ = open_controller(cfg)
        controller.backoff, controller.max_backoff = 0.2, 1.0  # keep the test short; the defaults are 0.5/8 s

        def chaos(t: int, m: dict) -> None:
            if t == KILL_AT:
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait(timeout=30)
            if t == RESTART_AT:
                procs.append(_serve(db, port, log))
                _wait_healthy(procs[-1], url)

        res = train(cfg, controller, on_step=chaos)

        hist = res.history
        assert [h["step"] for h in hist] == list(range(STEPS)), "the run finished every step"
        degraded = [h["step"] for h in hist if h.get("controller/degraded") == 1.0]
        assert degraded and min(degraded) == KILL_AT + 1, degraded  # visible in the metrics from the next step
        assert all(h["window/current"] == hist[KILL_AT]["window/current"] for h in hist if h["step"] in degraded
                   and h["step"] < RESTART_AT)  # trained on the last window while the controller was away
        assert controller.outages == 1 and controller.replayed > 0 and not controller._pending

        tel = controller.telemetry(res.run_id)
        assert [s["step"] for s in tel.steps] == list(range(STEPS)), "every step's telemetry, once"
        for s, h in zip(tel.steps, hist, strict=True):
            assert s["metrics"]["loss/total"] == pytest.approx(h["loss/total"])
        # probe reports counted once: the controller's token sum equals what the pool generated
        assert tel.probes["tokens_added"] == res.totals["probe_tokens"]
        # several audits may come back in one step (thread backend): the step reports their count and the last id
        n_submitted = int(sum(h.get("audit/submitted", 0.0) for h in hist))
        last_ids = {int(h["audit/id"]) for h in hist if "audit/id" in h}
        decided = {a["audit_id"] for a in tel.audits if a["state"] == "decided"}
        assert n_submitted and n_submitted == len(decided) and last_ids <= decided, (n_submitted, last_ids, decided)
        assert not [a for a in tel.audits if a["state"] == "pending"]
        with sqlite3.connect(db) as conn:  # one idempotency record per step report
            n_step_keys = conn.execute("SELECT COUNT(*) FROM idempotency WHERE key LIKE ?",
                                       (f"{res.run_id}-step-%",)).fetchone()[0]
        assert n_step_keys == STEPS
        record("controller_sigkill", {
            "steps": STEPS, "sigkills_injected": 1, "runs_finished": 1, "degraded_steps": len(degraded),
            "writes_replayed": controller.replayed, "step_reports_lost": STEPS - len(tel.steps),
            "audits_submitted": n_submitted, "audits_lost": n_submitted - len(decided),
            "probe_tokens_trainer": res.totals["probe_tokens"], "probe_tokens_controller": tel.probes["tokens_added"],
            "probes_dropped_stale": sum(h.get("probe/dropped_stale", 0.0) for h in hist),
        })
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
