"""RemoteController specifics: retries with one idempotency key, error mapping, auth, body limit."""

from __future__ import annotations

import socket

import httpx
import pytest
from controller_harness import run_spec

from adwin.controller import (
    Controller,
    ControllerUnavailable,
    InvalidInput,
    PayloadTooLarge,
    Unauthorized,
)
from adwin.controller.app import serve_in_thread
from adwin.controller.remote import RemoteController
from adwin.controller.schemas import StepMetricsIn


def test_retries_reuse_one_idempotency_key_and_apply_the_write_once():
    ctrl = Controller()
    rid = ctrl.register_run(run_spec()).run_id
    seen: list[str] = []
    fail = iter([httpx.ConnectError("boom"), 503])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["idempotency-key"])
        step = next(fail, None)
        if isinstance(step, Exception):
            raise step
        if step == 503:
            return httpx.Response(503, text="busy")
        body = StepMetricsIn.model_validate_json(request.content)
        ctrl.report_step(rid, body, idempotency_key=request.headers["idempotency-key"])
        return httpx.Response(204)

    client = RemoteController("http://controller.test", transport=httpx.MockTransport(handler), retries=3, backoff=0.001)
    client.report_step(rid, StepMetricsIn(step=0, metrics={"a": 1.0}))
    client.report_step(rid, StepMetricsIn(step=1, metrics={"a": 1.0}))
    assert len(seen) == 4 and len(set(seen[:3])) == 1 and seen[3] != seen[0]
    assert [s["step"] for s in ctrl.telemetry(rid).steps] == [0, 1]


def test_caller_key_is_sent_verbatim():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["idempotency-key"])
        return httpx.Response(204)

    client = RemoteController("http://controller.test", transport=httpx.MockTransport(handler))
    client.report_step("r", StepMetricsIn(step=0, metrics={}), idempotency_key="mine")
    assert seen == ["mine"]


def test_unreachable_controller_raises_unavailable_after_retries():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = RemoteController(f"http://127.0.0.1:{port}", retries=2, backoff=0.001, timeout=1.0)
    with pytest.raises(ControllerUnavailable, match="3 tries"):
        client.get_window("r", 0)


def test_client_errors_are_not_retried():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(422, json={"detail": [{"loc": ["body", "step"], "msg": "bad"}]})

    client = RemoteController("http://controller.test", transport=httpx.MockTransport(handler), retries=3)
    with pytest.raises(InvalidInput, match="body.step: bad"):
        client.report_step("r", StepMetricsIn(step=0, metrics={}))
    assert calls == [1]


def test_token_and_body_limit_map_to_their_errors():
    ctrl = Controller()
    url, stop = serve_in_thread(ctrl, token="tok", max_body_bytes=2000)
    try:
        with pytest.raises(Unauthorized):
            RemoteController(url, retries=0).register_run(run_spec())
        authed = RemoteController(url, token="tok", retries=0)
        rid = authed.register_run(run_spec()).run_id
        assert authed.get_window(rid, 0).window == 16
        with pytest.raises(PayloadTooLarge):
            authed.report_step(rid, StepMetricsIn(step=0, metrics={f"k{i}": 1.0 for i in range(300)}))
    finally:
        stop()
