"""Properties over hostile input (issue 16): arbitrary JSON into every write route never gives a 5xx,
errors carry the documented ErrorOut body, every read of the run succeeds afterwards; and any sequence
of reads leaves the store byte-identical."""

from __future__ import annotations

import json
import uuid

import pytest
from controller_harness import run_spec
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adwin.controller import Controller
from adwin.controller.app import create_app
from adwin.controller.schemas import ErrorOut

JSON = {"Content-Type": "application/json"}

_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, 1e-300, 2**53, 2**53 - 1, -1, 0]),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "a\udfff", "\udc00x", "", ".", ".."]),  # lone surrogates among them
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.text(max_size=6), st.just("\ud800")), inner, max_size=4)),
    max_leaves=12,
)
_deep = st.integers(min_value=60, max_value=700).map(lambda d: json.loads("[" * d + "]" * d))
hostile = st.one_of(_values, _deep)

# a valid body per write route ("{audit}": the audit id the fixture's run has open)
VALID = {
    "/v1/runs": {"policy": {"candidates": [4, 8, 16], "max_len": 32}, "probe_batch_size": 2, "config": {"a": 1}},
    "/v1/runs/{rid}/steps": {"step": 1, "metrics": {"loss": 1.0}},
    "/v1/runs/{rid}/probes/offers": {"step": 0, "offers": [{"sample_id": "n0", "prompt_id": "p", "response_len": 1, "version": 0}]},
    "/v1/runs/{rid}/probes/reports": {"probe_id": "x0", "step": 1, "tokens_added": 1, "version": 1},
    "/v1/runs/{rid}/probes/batches": {},
    "/v1/runs/{rid}/audits/{audit}": {"gram": [[1.0, 0.5, 0.2, 0.1]] * 4},
}


def _mutations(body: dict) -> st.SearchStrategy:
    """The valid body with one field (top-level or one level down) replaced by a hostile value."""
    paths = [(k,) for k in body] + [(k, j) for k, v in body.items() if isinstance(v, dict) for j in v]
    if not paths:
        return hostile

    def put(path: tuple, value: object) -> dict:
        out = json.loads(json.dumps(body))
        target = out
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value
        return out

    return st.builds(put, st.sampled_from(paths), hostile)


def _encode(value: object) -> bytes:
    # what a hostile client can put on the wire: NaN/Infinity tokens and \ud800 escapes are valid for
    # Python's json and many clients; ensure_ascii keeps lone surrogates as escapes
    return json.dumps(value, allow_nan=True).encode()


@pytest.fixture(scope="module")
def service():
    ctrl = Controller()
    with TestClient(create_app(ctrl), raise_server_exceptions=False) as client:
        yield ctrl, client
    ctrl.close()


def _fresh_run(client: TestClient) -> tuple[str, int]:
    """A run with an audit open (so the audit route reaches the controller) and one active probe."""
    rid = client.post("/v1/runs", json=run_spec(run_id=f"p-{uuid.uuid4().hex[:10]}").model_dump(mode="json")).json()["run_id"]
    offers = [{"sample_id": f"x{i}", "prompt_id": "p", "response_len": 2, "version": 0} for i in range(3)]
    assert client.post(f"/v1/runs/{rid}/probes/offers", json={"step": 0, "offers": offers}).status_code == 200
    for i in range(1, 3):
        rep = {"probe_id": f"x{i}", "step": 1, "tokens_added": 3, "version": 1, "finished": True}
        assert client.post(f"/v1/runs/{rid}/probes/reports", json=rep).status_code == 200
    r = client.post(f"/v1/runs/{rid}/probes/batches")
    assert r.status_code == 200, r.text
    return rid, r.json()["audit_id"]


def _check_answer(r) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        ErrorOut.model_validate(body)
        assert body.get("error"), body


def _refuse_constant(token: str) -> None:
    pytest.fail(f"a read answered {token}")


def _check_reads(client: TestClient, rid: str) -> None:
    for path in ("/v1/runs", f"/v1/runs/{rid}", f"/v1/runs/{rid}/telemetry", f"/v1/runs/{rid}/window?step=1",
                 f"/v1/runs/{rid}/probes/plan?step=1", "/metrics", "/", f"/runs/{rid}"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        if r.headers["content-type"].startswith("application/json"):
            json.loads(r.text, parse_constant=_refuse_constant)  # strict JSON: no NaN/Infinity tokens


@pytest.mark.parametrize("route", list(VALID))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_arbitrary_json_into_a_write_route_never_gives_5xx_nor_breaks_a_read(service, route, data):
    _, client = service
    rid, audit_id = _fresh_run(client)
    body = data.draw(st.one_of(hostile, _mutations(VALID[route])), label="body")
    key = data.draw(st.one_of(st.none(), st.sampled_from(["", " ", "k" * 300, "\ud800"])), label="idempotency key")
    headers: dict[str, str | bytes] = dict(JSON)
    if key is not None:
        headers["Idempotency-Key"] = key.encode("utf-8", "surrogatepass")  # raw bytes on the wire
    r = client.post(route.format(rid=rid, audit=audit_id), content=_encode(body), headers=headers)
    _check_answer(r)
    _check_reads(client, rid)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meta=hostile, rows=st.integers(0, 5), cols=st.integers(0, 3), nbytes=st.integers(0, 64))
def test_arbitrary_sketch_bytes_and_meta_never_give_5xx_nor_break_a_read(service, meta, rows, cols, nbytes):
    _, client = service
    rid, audit_id = _fresh_run(client)
    headers = {"Content-Type": "application/octet-stream",
               "X-Audit-Meta": _encode(meta).decode("ascii")[:60_000]}
    r = client.post(f"/v1/runs/{rid}/audits/{audit_id}/sketch?rows={rows}&cols={cols}",
                    content=b"\x7f\x80\x00\x00" * (nbytes // 4) + b"\x00" * (nbytes % 4), headers=headers)
    _check_answer(r)
    _check_reads(client, rid)


_read_paths = st.sampled_from([
    "/v1/runs", "/v1/runs/{rid}", "/v1/runs/{rid}/telemetry?since_step={n}", "/v1/runs/{rid}/window?step={n}",
    "/v1/runs/{rid}/probes/plan?step={n}", "/metrics", "/healthz", "/", "/runs/{rid}", "/v1/runs/{rid}/events?max_events=1",
    "/v1/runs/nope/window?step={n}", "/v1/runs/{rid}/window?step=-{n}", "/openapi.json",
])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reads=st.lists(st.tuples(_read_paths, st.sampled_from([0, 1, 7, 2**53 - 1, 2**53, 10**30])), min_size=1, max_size=8))
def test_any_sequence_of_reads_leaves_the_store_byte_identical(service, tmp_path_factory, reads):
    ctrl, client = service
    rid, _ = _fresh_run(client)
    folder = tmp_path_factory.mktemp("reads")
    ctrl.backup(folder / "before.db")
    cache_before = ctrl.snapshot()
    for path, n in reads:
        r = client.get(path.format(rid=rid, n=n))
        _check_answer(r)
    ctrl.backup(folder / "after.db")
    assert (folder / "before.db").read_bytes() == (folder / "after.db").read_bytes()
    assert ctrl.snapshot() == cache_before  # the cache (the run's step, its window) did not move either

