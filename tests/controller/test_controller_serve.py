"""``adwin controller serve`` as a real process: refusal to bind openly, and survival of SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from controller_harness import finish, offers, run_spec, sketch_b64

from adwin.controller.remote import RemoteController
from adwin.controller.schemas import AuditIn, StepMetricsIn
from adwin.controller.serve import resolve_token, spawn_server


def test_non_local_bind_needs_a_token(monkeypatch):
    monkeypatch.delenv("ADWIN_CONTROLLER_TOKEN", raising=False)
    with pytest.raises(ValueError, match="refusing to bind 0.0.0.0 without a token"):
        resolve_token("0.0.0.0", None)
    assert resolve_token("127.0.0.1", None) is None and resolve_token("::1", None) is None
    assert resolve_token("0.0.0.0", "t") == "t"
    monkeypatch.setenv("ADWIN_CONTROLLER_TOKEN", "env-token")
    assert resolve_token("10.1.2.3", None) == "env-token"


def test_serve_refuses_an_open_non_local_bind_with_one_line():
    env = {k: v for k, v in os.environ.items() if k != "ADWIN_CONTROLLER_TOKEN"}
    r = subprocess.run(
        [sys.executable, "-m", "adwin.cli", "controller", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "without a token" in r.stderr


def test_sigkilled_service_restarts_with_every_acknowledged_write(tmp_path):
    db = str(tmp_path / "controller.db")
    proc, url = spawn_server(db, timeout_s=60)
    try:
        api = RemoteController(url, retries=0)
        rid = api.register_run(run_spec(world_size=2)).run_id
        api.offer_probes(rid, offers(0, 4))
        for pid in ("s0", "s1", "s2", "s3"):
            finish(api, rid, pid)
        first = api.next_probe_batch(rid)
        api.submit_audit(rid, first.audit_id, AuditIn(rank=0, sketch_b64=sketch_b64(np.ones((4, 8))), sketch_shape=(4, 8)))
        sk = np.zeros((4, 8))
        sk[0] = 1.0  # the first segment carries the whole gradient: the shortest candidate suffices
        decided = api.submit_audit(rid, first.audit_id, AuditIn(rank=1, sketch_b64=sketch_b64(sk), sketch_shape=(4, 8)))
        pending = api.next_probe_batch(rid)
        api.submit_sketch(rid, pending.audit_id, 1, sk.astype(np.float32))  # raw bytes, acknowledged pending
        for step in range(5):
            api.report_step(rid, StepMetricsIn(step=step, metrics={"loss/total": 1.0 / (1 + step)}))
        before = (api.get_run(rid), api.get_window(rid, 5), api.telemetry(rid))
        api.close()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert decided.state == "decided"

    proc, url = spawn_server(db, timeout_s=60)
    try:
        api = RemoteController(url, retries=0)
        assert (api.get_run(rid), api.get_window(rid, 5), api.telemetry(rid)) == before
        assert before[1].window == decided.decision.window and before[1].reason == "audit"
        # the half-submitted audit resumes: rank 0 completes it
        out = api.submit_audit(rid, pending.audit_id, AuditIn(rank=0, sketch_b64=sketch_b64(sk), sketch_shape=(4, 8)))
        assert (out.state, out.ranks_received) == ("decided", 2)
        api.close()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def test_a_restarted_service_with_default_flags_still_lists_its_runs(tmp_path):
    proc, url = spawn_server(None, cwd=str(tmp_path), timeout_s=60)
    try:
        api = RemoteController(url, retries=0)
        rid = api.register_run(run_spec()).run_id
        api.close()
    finally:
        _stop(proc)
    assert (tmp_path / "adwin-controller.db").is_file()  # the default lives in the working folder
    proc, url = spawn_server(None, cwd=str(tmp_path), timeout_s=60)
    try:
        api = RemoteController(url, retries=0)
        assert [r.run_id for r in api.list_runs()] == [rid]
        api.close()
    finally:
        _stop(proc)


def test_help_names_the_default_database_and_memory_as_the_explicit_choice():
    r = subprocess.run([sys.executable, "-m", "adwin.cli", "controller", "serve", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "adwin-controller.db" in r.stdout and ":memory:" in r.stdout


# raw bodies a hostile client sends (path, body); each must get a 4xx and leave every read working
HOSTILE_WRITES = [
    ("/v1/runs", '{"run_id": "h1", "policy": {"candidates": [4, 8], "max_len": 32}, "config": {"x": "\\ud800"}}'),
    ("/v1/runs", '{"run_id": "h2", "policy": {"candidates": [4, 8], "max_len": 32}, "config": {"x": NaN}}'),
    ("/v1/runs", '{"run_id": "h3", "policy": {"candidates": [4, 8], "max_len": 32}, "config": ' + "[" * 600 + "]" * 600 + "}"),
    ("/v1/runs", '{"run_id": "..", "policy": {"candidates": [4, 8], "max_len": 32}}'),
    ("/v1/runs/{rid}/steps", '{"step": 1, "metrics": {"a\\ud800": 1.0}}'),
    ("/v1/runs/{rid}/steps", '{"step": NaN, "metrics": {}}'),
    ("/v1/runs/{rid}/probes/reports", '{"probe_id": "\\ud800", "step": 1, "tokens_added": 1, "version": 1}'),
    ("/v1/runs/{rid}/probes/offers", '{"step": 0, "offers": [{"sample_id": "\\ud800", "prompt_id": "p", "response_len": 1, "version": 0}]}'),
    ("/v1/runs/{rid}/steps", b'{"step": 1, "metrics": {"\xff": 1.0}}'),
]


def _all_reads_ok(url: str, rid: str) -> None:
    import httpx

    for path in ("/v1/runs", f"/v1/runs/{rid}", f"/v1/runs/{rid}/telemetry", f"/v1/runs/{rid}/window?step=0",
                 f"/v1/runs/{rid}/probes/plan?step=0", "/healthz", "/metrics", "/", f"/runs/{rid}",
                 f"/v1/runs/{rid}/events?max_events=1"):
        r = httpx.get(url + path, timeout=10)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])


def test_after_every_hostile_write_a_restarted_service_answers_every_read(tmp_path):
    import httpx

    db = str(tmp_path / "controller.db")
    proc, url = spawn_server(db, timeout_s=60)
    try:
        api = RemoteController(url, retries=0)
        rid = api.register_run(run_spec()).run_id
        api.report_step(rid, StepMetricsIn(step=0, metrics={"loss/total": 1.0}))
        api.close()
        for path, body in HOSTILE_WRITES:
            r = httpx.post(url + path.format(rid=rid), content=body, headers={"Content-Type": "application/json"}, timeout=10)
            assert 400 <= r.status_code < 500 and r.json()["error"], (path, body, r.status_code, r.text[:300])
        _all_reads_ok(url, rid)
    finally:
        _stop(proc)
    proc, url = spawn_server(db, timeout_s=60)
    try:
        _all_reads_ok(url, rid)
        assert [r["run_id"] for r in httpx.get(url + "/v1/runs", timeout=10).json()] == [rid]
    finally:
        _stop(proc)
