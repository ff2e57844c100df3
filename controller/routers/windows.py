"""``GET /v1/runs/{run_id}/window?step=N``: the hot path, answered as plain ASGI from the controller's cache.

The one definition of the route: ``answer`` is called by the service middleware (``app.py``) before
FastAPI's routing, for every request on the path, errors included, and ``OPENAPI_PATH`` documents it.
Going through a FastAPI route instead costs ~160 us per call against ~19 us (measured through the ASGI
app without a socket; docs/decisions.md, "Controller: hostile input").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from urllib.parse import parse_qsl

from adwin.controller.api import ControllerError
from adwin.controller.core import Controller
from adwin.controller.json_guard import safe_text
from adwin.controller.schemas import MAX_INT, WindowOut

PATH = re.compile(r"^/v1/runs/([^/]+)/window$")
_STEP = re.compile(r"^\d{1,16}$")
_JSON = (b"content-type", b"application/json")


async def answer(controller: Controller, scope: dict, run_id: str, send: Callable) -> int:
    """Answer one request on the window path; returns the status sent."""
    if scope["method"] != "GET":
        return await _send(send, 405, {"detail": "Method Not Allowed", "error": "MethodNotAllowed"}, [(b"allow", b"GET")])
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    steps = [v for k, v in query if k == "step"]
    if len(steps) != 1 or not _STEP.match(steps[0]) or int(steps[0]) > MAX_INT:
        detail = [{"loc": ["query", "step"], "msg": f"step is required once, an integer in [0, {MAX_INT}]", "type": "value_error"}]
        return await _send(send, 422, {"detail": detail, "error": "ValidationError"})
    try:
        out = controller.get_window(run_id, int(steps[0]))
    except ControllerError as e:
        return await _send(send, e.status, {"detail": safe_text(str(e)), "error": type(e).__name__})
    return await _send_bytes(send, 200, out.model_dump_json().encode())


async def _send(send: Callable, status: int, body: dict, extra: list | None = None) -> int:
    return await _send_bytes(send, status, json.dumps(body).encode(), extra)


async def _send_bytes(send: Callable, status: int, body: bytes, extra: list | None = None) -> int:
    headers = [_JSON, (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


def openapi_path(error_responses: dict) -> dict:
    """The path's OpenAPI entry (merged into the app's schema: no FastAPI route exists for it)."""
    ok = {"description": "the window for the step", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/WindowOut"}}}}
    return {
        "get": {
            "tags": ["windows"],
            "summary": "the window for a step (never blocks on probes; a read: the run's step does not move)",
            "operationId": "get_window",
            "parameters": [
                {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}},
                {"name": "step", "in": "query", "required": True, "schema": {"type": "integer", "minimum": 0, "maximum": MAX_INT}},
            ],
            "responses": {"200": ok, **error_responses},
        }
    }


WINDOW_SCHEMA = WindowOut.model_json_schema(ref_template="#/components/schemas/{model}")
