"""Schema-driven fuzzing of the HTTP API (schemathesis, in-process ASGI, bounded examples per operation):
no input makes it answer 5xx, and every response (errors included) matches the schema its route declares."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from adwin.controller import Controller
from adwin.controller.app import create_app
from adwin.controller.schemas import PolicyIn, RunIn

_ctrl = Controller()
_ctrl.register_run(RunIn(run_id="fuzz", policy=PolicyIn(candidates=[4, 8], max_len=16)))
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_ctrl))


@schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_makes_the_service_fail(case):
    if case.path == "/v1/runs/{run_id}/events":
        case.query = {**(case.query or {}), "max_events": 1, "interval": 0.01}  # keep the stream bounded
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
