"""Hostile HTTP input (issue 16): every case gets a documented 4xx with the ErrorOut body, nothing it
stores breaks a later read, and reads never move a run's state."""

from __future__ import annotations

import json

import pytest
from controller_harness import run_spec
from fastapi.testclient import TestClient

from adwin.controller import Controller, InvalidInput
from adwin.controller.app import create_app
from adwin.controller.schemas import MAX_STEP_METRICS, ErrorOut

TOKEN = "s3cret"
JSON = {"Content-Type": "application/json"}
# a valid registration; a hostile field is appended after it (a repeated JSON key: the last one wins)
VALID_RUN = '{"policy": {"candidates": [4, 8], "max_len": 32}'


@pytest.fixture
def ctrl():
    c = Controller()
    yield c
    c.close()


@pytest.fixture
def client(ctrl):
    with TestClient(create_app(ctrl)) as c:
        yield c


def _run(client: TestClient) -> str:
    r = client.post("/v1/runs", json=run_spec().model_dump(mode="json"))
    assert r.status_code == 200, r.text
    return r.json()["run_id"]


def _assert_error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()  # must decode: the body is strict JSON
    ErrorOut.model_validate(body)
    assert body["error"], body
    return body


def _reads_ok(client: TestClient, rid: str) -> None:
    for path in ("/v1/runs", f"/v1/runs/{rid}", f"/v1/runs/{rid}/telemetry", f"/v1/runs/{rid}/window?step=0",
                 f"/v1/runs/{rid}/probes/plan?step=0", "/healthz", "/metrics", "/", f"/runs/{rid}"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])


# raw bodies: json= would refuse to encode NaN, and the point is what a hostile client sends
HOSTILE_STEP_BODIES = [
    '{"step": NaN, "metrics": {}}',
    '{"step": Infinity, "metrics": {}}',
    '{"step": 1, "metrics": {"a\\ud800": 1.0}}',
]


@pytest.mark.parametrize("body", HOSTILE_STEP_BODIES)
def test_non_finite_numbers_and_lone_surrogates_in_step_reports_get_422_and_leave_reads_working(client, body):
    rid = _run(client)
    _assert_error(client.post(f"/v1/runs/{rid}/steps", content=body, headers=JSON), 422)
    _reads_ok(client, rid)


@pytest.mark.parametrize("metrics", [
    {"": 1.0},  # a nameless metric
    {"x" * 257: 1.0},  # a name longer than any metric's
    {f"m{i}": 1.0 for i in range(MAX_STEP_METRICS + 1)},  # more metrics than a trainer logs
])
def test_step_reports_with_unbounded_metric_names_or_counts_get_422_and_store_nothing(client, ctrl, metrics):
    rid = _run(client)
    _assert_error(client.post(f"/v1/runs/{rid}/steps", json={"step": 0, "metrics": metrics}), 422)
    assert client.get(f"/v1/runs/{rid}/telemetry").json()["steps"] == []
    _reads_ok(client, rid)
    r = client.post(f"/v1/runs/{rid}/steps", json={"step": 0, "metrics": {f"m{i}": 1.0 for i in range(MAX_STEP_METRICS)}})
    assert r.status_code == 204, r.text  # the bound itself is accepted


@pytest.mark.parametrize("patch", [
    '"policy": {"name": "adwin", "candidates": [4, 8], "max_len": 32, "threshold": NaN}',
    '"policy": {"name": "surprise", "max_len": 32, "options": {"min": Infinity}}',
    '"name": "\\ud800"',
    '"run_id": "\\ud800"',
    '"config": {"x": "\\ud800"}',
    '"config": {"\\ud800": 1}',
    '"config": {"x": NaN}',
    '"config": {"x": -Infinity}',
])
def test_hostile_run_registrations_get_422_and_store_nothing(client, ctrl, patch):
    assert client.post("/v1/runs", content=VALID_RUN + "}", headers=JSON).status_code == 200  # the base is valid
    _assert_error(client.post("/v1/runs", content=VALID_RUN + ", " + patch + "}", headers=JSON), 422)
    assert len(ctrl.list_runs()) == 1
    assert client.get("/v1/runs").status_code == 200


@pytest.mark.parametrize("field", ["sample_id", "prompt_id"])
def test_lone_surrogate_in_offer_ids_gets_422(client, field):
    rid = _run(client)
    item = {"sample_id": "s0", "prompt_id": "p0", "response_len": 1, "version": 0}
    body = json.dumps({"step": 0, "offers": [item]}).replace(f'"{item[field]}"', '"\\ud800"')
    _assert_error(client.post(f"/v1/runs/{rid}/probes/offers", content=body, headers=JSON), 422)
    _reads_ok(client, rid)


def test_lone_surrogate_probe_id_in_a_report_gets_422(client):
    rid = _run(client)
    body = '{"probe_id": "\\ud800", "step": 1, "tokens_added": 1, "version": 1}'
    _assert_error(client.post(f"/v1/runs/{rid}/probes/reports", content=body, headers=JSON), 422)


def test_deeply_nested_config_gets_422(client, ctrl):
    body = VALID_RUN + ', "config": {"x": ' + "[" * 600 + "]" * 600 + "}}"
    _assert_error(client.post("/v1/runs", content=body, headers=JSON), 422)
    assert ctrl.list_runs() == []


def test_huge_finite_gram_decides_with_finite_cosines_and_the_window_stays_readable(client):
    rid = _run(client)
    offers = [{"sample_id": f"x{i}", "prompt_id": "p", "response_len": 2, "version": 0} for i in range(2)]
    assert client.post(f"/v1/runs/{rid}/probes/offers", json={"step": 0, "offers": offers}).status_code == 200
    for i in range(2):
        rep = {"probe_id": f"x{i}", "step": 1, "tokens_added": 3, "version": 1, "finished": True}
        assert client.post(f"/v1/runs/{rid}/probes/reports", json=rep).status_code == 200
    audit_id = client.post(f"/v1/runs/{rid}/probes/batches").json()["audit_id"]
    gram = [[1e308] * 4 for _ in range(4)]  # rank one: every prefix is parallel to the full gradient
    r = client.post(f"/v1/runs/{rid}/audits/{audit_id}", json={"gram": gram})
    assert r.status_code == 200, r.text
    assert r.json()["cosines"] == {"4": 1.0, "8": 1.0, "16": 1.0}
    assert client.get(f"/v1/runs/{rid}/window?step=1").json()["window"] == 4
    _reads_ok(client, rid)


def test_empty_idempotency_key_is_refused_not_treated_as_a_key(client, ctrl):
    rid = _run(client)
    body = {"step": 1, "metrics": {"loss": 1.0}}
    _assert_error(client.post(f"/v1/runs/{rid}/steps", json=body, headers={"Idempotency-Key": ""}), 422)
    assert ctrl.telemetry(rid).steps == []


def test_non_utf8_body_gets_a_documented_400_with_the_error_body(client):
    rid = _run(client)
    r = client.post(f"/v1/runs/{rid}/steps", content=b'{"step": 1, "metrics": {"\xff": 1.0}}', headers=JSON)
    body = _assert_error(r, 400)
    assert body["error"] == "BadRequest"
    assert "400" in client.get("/openapi.json").json()["paths"]["/v1/runs/{run_id}/steps"]["post"]["responses"]


def test_chunked_body_over_the_limit_gets_413_with_the_error_body(ctrl):
    with TestClient(create_app(ctrl, max_body_bytes=64)) as c:
        def chunks():
            for _ in range(10):
                yield b" " * 32

        body = _assert_error(c.post("/v1/runs", content=chunks(), headers=JSON), 413)
        assert body["error"] == "PayloadTooLarge"


@pytest.mark.parametrize("run_id", [".", "..", ".hidden"])
def test_run_ids_that_are_path_segments_are_refused(client, run_id):
    _assert_error(client.post("/v1/runs", content=VALID_RUN + f', "run_id": "{run_id}"}}', headers=JSON), 422)


def test_unknown_route_and_method_answer_with_the_error_body(client):
    assert _assert_error(client.get("/v1/nothing"), 404)["error"] == "NotFound"
    assert _assert_error(client.delete("/v1/runs"), 405)["error"] == "MethodNotAllowed"


def test_an_unauthenticated_window_read_does_not_move_the_run_step(ctrl):
    with TestClient(create_app(ctrl, token=TOKEN)) as c:
        rid = c.post("/v1/runs", json=run_spec().model_dump(mode="json"),
                     headers={"Authorization": f"Bearer {TOKEN}"}).json()["run_id"]
        for path in (f"/v1/runs/{rid}/window?step=9007199254740991", f"/v1/runs/{rid}/probes/plan?step=9007199254740991"):
            assert c.get(path).status_code == 200
        assert {s["run_id"]: s["last_step"] for s in ctrl.snapshot()}[rid] == 0
        # an offered probe is still auditable: nothing was aged by the reads
        offer = {"step": 0, "offers": [{"sample_id": "a", "prompt_id": "p", "response_len": 1, "version": 0}]}
        r = c.post(f"/v1/runs/{rid}/probes/offers", json=offer, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.json()["accepted"] == ["a"]


def test_a_batch_forms_at_the_step_its_caller_gives(client, ctrl):
    rid = _run(client)
    offers = [{"sample_id": f"x{i}", "prompt_id": "p", "response_len": 2, "version": 0} for i in range(2)]
    client.post(f"/v1/runs/{rid}/probes/offers", json={"step": 0, "offers": offers})
    for i in range(2):
        client.post(f"/v1/runs/{rid}/probes/reports",
                    json={"probe_id": f"x{i}", "step": 1, "tokens_added": 3, "version": 1, "finished": True})
    r = client.post(f"/v1/runs/{rid}/probes/batches?step=3")
    assert r.status_code == 200, r.text
    assert (r.json()["version"], r.json()["staleness_max"]) == (3, 3)


def test_a_value_that_skipped_validation_is_refused_inside_the_transaction(ctrl):
    # in-process callers can build a model without validation; the store still refuses what it could
    # not read back, and the write rolls back instead of committing a row every later read fails on
    spec = run_spec().model_copy(update={"config": {"x": float("nan"), "y": "\ud800"}})
    with pytest.raises(InvalidInput, match="cannot store"):
        ctrl.register_run(spec)
    assert ctrl.list_runs() == []
    assert ctrl._store.all("SELECT run_id FROM runs") == []


def test_the_openapi_schema_declares_every_error_status_a_route_can_answer(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path, ops in paths.items():
        for method, op in ops.items():
            declared = set(op["responses"])
            assert {"404", "405", "422"} <= declared, (method, path, declared)
            if method == "post":
                assert {"400", "401", "413"} <= declared, (method, path, declared)
    assert {"404", "405", "422"} <= set(paths["/v1/runs/{run_id}/window"]["get"]["responses"])
