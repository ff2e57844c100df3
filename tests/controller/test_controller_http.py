"""HTTP surface: every route's happy path and its error statuses (401, 404, 409, 413, 422)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from controller_harness import CANDIDATES, run_spec, sketch_b64
from fastapi.testclient import TestClient

from adwin.audit.alignment import cosines_from_gram
from adwin.controller import Controller
from adwin.controller.app import DEFAULT_MAX_BODY_BYTES, create_app

TOKEN = "s3cret"


@pytest.fixture
def client():
    ctrl = Controller()
    with TestClient(create_app(ctrl)) as c:
        yield c
    ctrl.close()


def _run(client: TestClient, **kw) -> str:
    r = client.post("/v1/runs", json=run_spec(**kw).model_dump(mode="json"))
    assert r.status_code == 200, r.text
    return r.json()["run_id"]


def _ready_audit(client: TestClient, rid: str) -> int:
    offers = [{"sample_id": f"x{i}", "prompt_id": "p", "response_len": 2, "version": 0} for i in range(2)]
    assert client.post(f"/v1/runs/{rid}/probes/offers", json={"step": 0, "offers": offers}).status_code == 200
    for i in range(2):
        rep = {"probe_id": f"x{i}", "step": 1, "tokens_added": 3, "version": 1, "finished": True}
        assert client.post(f"/v1/runs/{rid}/probes/reports", json=rep).status_code == 200
    r = client.post(f"/v1/runs/{rid}/probes/batches")
    assert r.status_code == 200, r.text
    return r.json()["audit_id"]


# --- happy paths -------------------------------------------------------------------------------


def test_full_loop_over_http(client):
    rid = _run(client)
    assert client.get("/v1/runs").json()[0]["run_id"] == rid
    assert client.get(f"/v1/runs/{rid}").json()["spec"]["probe_batch_size"] == 2
    assert client.get(f"/v1/runs/{rid}/window", params={"step": 0}).json()["window"] == CANDIDATES[-1]
    assert client.post(f"/v1/runs/{rid}/probes/batches").status_code == 204  # nothing ready yet
    audit_id = _ready_audit(client, rid)
    plan = client.get(f"/v1/runs/{rid}/probes/plan", params={"step": 1}).json()
    assert plan["active"] == [] and plan["extend_by"] == CANDIDATES[-1]
    r = client.post(f"/v1/runs/{rid}/audits/{audit_id}", json={"cosines": {"4": 0.2, "8": 0.8}})
    assert r.status_code == 200 and r.json()["decision"]["window"] == 8
    assert client.post(f"/v1/runs/{rid}/steps", json={"step": 1, "metrics": {"loss/total": 0.5}}).status_code == 204
    tel = client.get(f"/v1/runs/{rid}/telemetry", params={"since_step": 1}).json()
    assert tel["steps"] == [{"step": 1, "metrics": {"loss/total": 0.5}}] and tel["probes"]["audited"] == 2


def test_idempotency_key_header_replays_the_first_answer(client):
    rid = _run(client)
    body = {"step": 0, "offers": [{"sample_id": "a", "prompt_id": "p", "response_len": 1, "version": 0}]}
    a = client.post(f"/v1/runs/{rid}/probes/offers", json=body, headers={"Idempotency-Key": "k1"}).json()
    b = client.post(f"/v1/runs/{rid}/probes/offers", json=body, headers={"Idempotency-Key": "k1"}).json()
    assert a == b == {"accepted": ["a"], "declined": 0}


def test_sketch_audit_over_http_decides_after_all_ranks(client):
    rid = _run(client, world_size=2)
    audit_id = _ready_audit(client, rid)
    sk = np.random.default_rng(3).normal(size=(2, 4, 16)).astype(np.float32)
    states = [
        client.post(f"/v1/runs/{rid}/audits/{audit_id}", json={"rank": r, "sketch_b64": sketch_b64(sk[r]), "sketch_shape": [4, 16]}).json()["state"]
        for r in range(2)
    ]
    assert states == ["pending", "decided"]


def test_raw_sketch_route_takes_float32_bytes_and_decides_after_all_ranks(client):
    rid = _run(client, world_size=2)
    audit_id = _ready_audit(client, rid)
    sk = np.random.default_rng(4).normal(size=(2, 4, 16)).astype("<f4")
    url = f"/v1/runs/{rid}/audits/{audit_id}/sketch"
    headers = {"Content-Type": "application/octet-stream", "X-Audit-Meta": '{"stats": {"elapsed_s": 0.25}}'}
    first = client.post(url, params={"rank": 1, "rows": 4, "cols": 16}, content=sk[1].tobytes(), headers=headers)
    assert first.status_code == 200 and first.json()["state"] == "pending"
    r = client.post(url, params={"rank": 0, "rows": 4, "cols": 16}, content=sk[0].tobytes(),
                    headers={"Content-Type": "application/octet-stream"})
    total = sk.astype(np.float64).sum(0)
    ref = cosines_from_gram(total @ total.T, CANDIDATES)
    assert r.status_code == 200 and r.json()["state"] == "decided"
    assert all(abs(r.json()["cosines"][str(c)] - ref[c]) < 1e-9 for c in CANDIDATES)
    assert client.get(f"/v1/runs/{rid}/telemetry").json()["audits"][-1]["stats"] == {"elapsed_s": 0.25}


def test_raw_sketch_route_errors(client):
    rid = _run(client)
    audit_id = _ready_audit(client, rid)
    url = f"/v1/runs/{rid}/audits/{audit_id}/sketch"
    ok = np.ones((4, 8), "<f4").tobytes()
    q = {"rank": 0, "rows": 4, "cols": 8}

    def post(body: bytes = ok, params: dict | None = None, path: str = url, **headers: str):
        return client.post(path, params=params or q, content=body, headers={"Content-Type": "application/octet-stream", **headers})

    r = post(ok[:-4])
    assert r.status_code == 422 and "needs 128" in r.json()["detail"]
    assert post(np.ones((3, 8), "<f4").tobytes(), {"rank": 0, "rows": 3, "cols": 8}).status_code == 422  # K+1 is 4
    r = post(params={"rank": 0, "rows": 4})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "cols"]
    assert post(params={"rank": 3, "rows": 4, "cols": 8}).status_code == 422  # world_size 1
    nan = np.ones((4, 8), "<f4")
    nan[2, 3] = np.nan
    r = post(nan.tobytes())
    assert r.status_code == 422 and "non-finite" in r.json()["detail"]
    assert post(**{"X-Audit-Meta": "{not json"}).status_code == 422
    assert post(**{"X-Audit-Meta": '{"other": 1}'}).status_code == 422
    r = post(**{"X-Audit-Meta": '{"macro_cosines": {"5": 0.5}}'})
    assert r.status_code == 422 and "unknown candidates" in r.json()["detail"]
    assert post(path="/v1/runs/nope/audits/1/sketch").json()["error"] == "UnknownRun"
    r = post(path=f"/v1/runs/{rid}/audits/77/sketch")
    assert r.status_code == 409 and r.json()["error"] == "AuditConflict"
    assert post().status_code == 200  # the audit was still open
    r = post()
    assert r.status_code == 409 and "already decided" in r.json()["detail"]


def test_raw_sketch_route_needs_the_token_and_respects_the_body_limit():
    ctrl = Controller()
    with TestClient(create_app(ctrl, token=TOKEN, max_body_bytes=1000)) as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        rid = c.post("/v1/runs", json=run_spec().model_dump(mode="json"), headers=auth).json()["run_id"]
        url = f"/v1/runs/{rid}/audits/1/sketch"
        body = np.ones((4, 8), "<f4").tobytes()
        assert c.post(url, params={"rows": 4, "cols": 8}, content=body).status_code == 401
        big = np.ones((4, 64), "<f4").tobytes()  # 1024 bytes > 1000
        r = c.post(url, params={"rows": 4, "cols": 64}, content=big, headers=auth)
        assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"


def test_wrong_sketch_shapes_over_json_are_422(client):
    rid = _run(client, world_size=2)
    audit_id = _ready_audit(client, rid)
    url = f"/v1/runs/{rid}/audits/{audit_id}"
    sk = np.ones((4, 16), np.float32)
    assert client.post(url, json={"rank": 0, "sketch_b64": sketch_b64(sk), "sketch_shape": [4, 8]}).status_code == 422
    assert client.post(url, json={"rank": 0, "sketch_b64": sketch_b64(sk), "sketch_shape": [5, 16]}).status_code == 422
    assert client.post(url, json={"rank": 0, "sketch_b64": sketch_b64(sk), "sketch_shape": [4, 16]}).status_code == 200
    r = client.post(url, json={"rank": 1, "sketch_b64": sketch_b64(np.ones((4, 8))), "sketch_shape": [4, 8]})
    assert r.status_code == 422 and "differs from earlier ranks" in r.json()["detail"]


def test_expired_probes_show_in_telemetry_and_metrics(client):
    rid = _run(client, probe_batch_size=3, staleness_limit=2)
    offers = [{"sample_id": f"e{i}", "prompt_id": "p", "response_len": 1, "version": 0} for i in range(2)]
    client.post(f"/v1/runs/{rid}/probes/offers", json={"step": 0, "offers": offers})
    for i in range(2):
        client.post(f"/v1/runs/{rid}/probes/reports", json={"probe_id": f"e{i}", "step": 2, "tokens_added": 1, "version": 2, "finished": True})
    assert client.post(f"/v1/runs/{rid}/probes/batches").status_code == 204
    assert client.get(f"/v1/runs/{rid}/telemetry").json()["probes"]["expired"] == 2
    assert f'adwin_probes{{run_id="{rid}",state="expired"}} 2.0' in client.get("/metrics").text


def test_service_routes(client):
    rid = _run(client)
    assert client.get("/healthz").json() == {"status": "ok", "runs": 1}
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/runs/{run_id}/window" in paths and "/v1/runs/{run_id}/audits/{audit_id}" in paths
    client.get(f"/v1/runs/{rid}/window", params={"step": 0})
    text = client.get("/metrics").text
    assert f'adwin_window_tokens{{run_id="{rid}"}} 16.0' in text
    assert f'adwin_probes{{run_id="{rid}",state="active"}} 0.0' in text
    assert 'adwin_http_request_seconds_count{method="GET",route="/v1/runs/{run_id}/window",status="200"}' in text


def test_metrics_registries_are_per_app():
    a, b = Controller(), Controller()
    a.register_run(run_spec(run_id="only-in-a"))
    with TestClient(create_app(a)) as ca, TestClient(create_app(b)) as cb:
        assert "only-in-a" in ca.get("/metrics").text and "only-in-a" not in cb.get("/metrics").text


def test_events_stream_sends_telemetry(client):
    rid = _run(client)
    client.post(f"/v1/runs/{rid}/steps", json={"step": 0, "metrics": {"window/current": 16}})
    with client.stream("GET", f"/v1/runs/{rid}/events", params={"max_events": 1, "interval": 0.01}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[0] == "event: telemetry"
    data = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
    assert data["run_id"] == rid and data["steps"][0]["metrics"] == {"window/current": 16}


def test_dashboard_pages_and_local_plotly(client):
    rid = _run(client)
    index = client.get("/")
    assert index.status_code == 200 and f'href="/runs/{rid}"' in index.text
    page = client.get(f"/runs/{rid}")
    assert page.status_code == 200 and 'src="/static/plotly.min.js"' in page.text and "cdn" not in page.text.lower()
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and "plotly" in js.text[:2000].lower()
    assert client.get("/runs/nope").status_code == 404


# --- errors ------------------------------------------------------------------------------------


def test_422_names_the_invalid_field(client):
    r = client.post("/v1/runs", json={"probe_batch_size": 0})
    assert r.status_code == 422 and any(e["loc"][-1] == "probe_batch_size" for e in r.json()["detail"])
    rid = _run(client)
    r = client.get(f"/v1/runs/{rid}/window")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "step"]
    assert client.get(f"/v1/runs/{rid}/window", params={"step": -1}).status_code == 422
    assert client.get(f"/v1/runs/{rid}/probes/plan", params={"step": "x"}).status_code == 422
    assert client.post(f"/v1/runs/{rid}/probes/offers", json={"step": 0}).status_code == 422
    assert client.post(f"/v1/runs/{rid}/probes/reports", json={"probe_id": "a"}).status_code == 422


def test_422_for_non_finite_values_and_unknown_candidates(client):
    rid = _run(client)
    r = client.post(f"/v1/runs/{rid}/steps", content=b'{"step": 0, "metrics": {"loss/total": NaN}}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "loss/total" in r.json()["detail"]
    audit_id = _ready_audit(client, rid)
    r = client.post(f"/v1/runs/{rid}/audits/{audit_id}", content=b'{"cosines": {"4": Infinity}}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "NonFiniteAudit"  # the class the client maps back
    assert client.get(f"/v1/runs/{rid}/window", params={"step": 1}).json()["reason"] == "fallback"
    r = client.post(f"/v1/runs/{rid}/audits/{audit_id}", json={"cosines": {"1000": 0.9}})
    assert r.status_code == 422 and "unknown candidates" in r.json()["detail"]
    assert r.json()["error"] == "InvalidInput"
    r = client.post(f"/v1/runs/{rid}/audits/{audit_id}", json={"gram": [[1.0]]})
    assert r.status_code == 422


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/runs/nope"),
        ("GET", "/v1/runs/nope/window?step=0"),
        ("GET", "/v1/runs/nope/probes/plan?step=0"),
        ("GET", "/v1/runs/nope/telemetry"),
        ("GET", "/v1/runs/nope/events"),
        ("POST", "/v1/runs/nope/probes/batches"),
    ],
)
def test_404_for_an_unknown_run(client, method, path):
    r = client.request(method, path)
    assert r.status_code == 404 and r.json()["error"] == "UnknownRun"


def test_404_for_unknown_run_on_writes_with_bodies(client):
    assert client.post("/v1/runs/nope/steps", json={"step": 0, "metrics": {}}).status_code == 404
    assert client.post("/v1/runs/nope/audits/1", json={"cosines": {"4": 1.0}}).status_code == 404
    assert client.post("/v1/runs/nope/probes/offers", json={"step": 0, "offers": []}).status_code == 404
    rid = _run(client)
    r = client.post(f"/v1/runs/{rid}/probes/reports", json={"probe_id": "ghost", "step": 0, "tokens_added": 0, "version": 0})
    assert r.status_code == 404 and r.json()["error"] == "UnknownProbe"


def test_409_for_audit_and_run_conflicts(client):
    rid = _run(client)
    r = client.post(f"/v1/runs/{rid}/audits/42", json={"cosines": {"4": 1.0}})
    assert r.status_code == 409 and r.json()["error"] == "AuditConflict"
    audit_id = _ready_audit(client, rid)
    assert client.post(f"/v1/runs/{rid}/audits/{audit_id}", json={"cosines": {"4": 1.0}}).status_code == 200
    assert client.post(f"/v1/runs/{rid}/audits/{audit_id}", json={"cosines": {"4": 1.0}}).status_code == 409
    spec = client.get(f"/v1/runs/{rid}").json()["spec"]
    assert client.post("/v1/runs", json={**spec, "lookahead": 9}).status_code == 409
    r = client.post(f"/v1/runs/{rid}/probes/reports", json={"probe_id": "x0", "step": 2, "tokens_added": 1, "version": 2})
    assert r.status_code == 409 and r.json()["error"] == "ProbeConflict"


def test_413_for_bodies_over_the_limit():
    ctrl = Controller()
    with TestClient(create_app(ctrl, max_body_bytes=1000)) as c:
        rid = c.post("/v1/runs", json=run_spec().model_dump(mode="json")).json()["run_id"]
        big = {"step": 0, "metrics": {f"m{i}": 1.0 for i in range(200)}}
        r = c.post(f"/v1/runs/{rid}/steps", json=big)
        assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"

        def chunks():  # no Content-Length: the streamed body is counted
            yield b'{"step": 0, "metrics": {'
            for i in range(100):
                yield f'"k{i}": 1.0, '.encode()
            yield b'"z": 1.0}}'

        r = c.post(f"/v1/runs/{rid}/steps", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert ctrl.telemetry(rid).steps == []
        sketch = {"rank": 0, "sketch_b64": sketch_b64(np.ones((4, 64))), "sketch_shape": [4, 64]}  # ~1.4 kB of JSON
        r = c.post(f"/v1/runs/{rid}/audits/1", json=sketch)
        assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"


def test_default_body_limit_fits_an_8_rank_sketch_audit_in_one_body():
    one_rank = len(sketch_b64(np.zeros((6, 16384), dtype=np.float32)))
    assert 8 * one_rank < DEFAULT_MAX_BODY_BYTES < 16 * one_rank


def test_401_for_writes_without_the_token_and_reads_stay_open():
    ctrl = Controller()
    with TestClient(create_app(ctrl, token=TOKEN)) as c:
        body = run_spec().model_dump(mode="json")
        assert c.post("/v1/runs", json=body).status_code == 401
        r = c.post("/v1/runs", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = c.post("/v1/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        rid = r.json()["run_id"]
        for route in ("steps", "probes/batches", "audits/1", "audits/1/sketch", "probes/offers", "probes/reports"):
            assert c.post(f"/v1/runs/{rid}/{route}", json={}).status_code == 401, route
        assert c.get(f"/v1/runs/{rid}/window", params={"step": 0}).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/runs/{rid}/window?step=10000000000000000000000", None),
        ("GET", "/v1/runs/{rid}/window?step=9007199254740992", None),  # 2**53: the fast path must agree
        ("GET", "/v1/runs/{rid}/probes/plan?step=10000000000000000000000", None),
        ("GET", "/v1/runs/{rid}/telemetry?since_step=10000000000000000000000", None),
        ("POST", "/v1/runs/{rid}/steps", {"step": 10**22, "metrics": {}}),
        ("POST", "/v1/runs/{rid}/probes/offers", {"step": 0, "offers": [{"sample_id": "a", "prompt_id": "p", "response_len": 10**22, "version": 0}]}),
        ("POST", "/v1/runs/{rid}/probes/reports", {"probe_id": "a", "step": 0, "tokens_added": 10**22, "version": 0}),
        ("POST", "/v1/runs/{rid}/audits/10000000000000000000000", {"cosines": {"4": 1.0}}),
        ("POST", "/v1/runs", {"policy": {"candidates": [10**22], "max_len": 10**22}}),
    ],
)
def test_422_for_integers_beyond_what_the_store_keeps(client, method, path, body):
    rid = _run(client)
    r = client.request(method, path.format(rid=rid), json=body)
    assert r.status_code == 422, r.text
