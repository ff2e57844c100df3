"""Schema-driven fuzzing of the teacher server (schemathesis over its OpenAPI schema, in-process ASGI, bounded
examples per operation): no input makes it answer 5xx, and every answer, errors included, matches the schema
its route declares (errors in OpenAI's shape)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance
from tiny_teacher import tiny_service

from adwin.teacher_server.app import create_app

_service = tiny_service(max_wait_s=0.0)
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_service, max_body_bytes=64_000))


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_makes_the_teacher_server_fail(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
