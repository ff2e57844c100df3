"""The teacher server's HTTP app: a thin FastAPI app over one ``TeacherService``.

Routes live in ``adwin.teacher_server.routers``; this module adds what cuts across them: bearer-token auth on
every ``/v1`` route when a token is set (as ``vllm serve --api-key``), the request-body limit, and errors in
OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``): 400 for a body that is not JSON, a field of
the wrong type or out of range (``param`` names it), 401, 404 (an unknown model or route), 405, 413, 503 when
the batcher's queue is full (clients retry it). The health routes answer without auth. The OpenAPI schema
declares these error bodies (``ErrorOut``) instead of FastAPI's 422, which this app never answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from adwin.controller.app import bearer_authorized
from adwin.controller.json_guard import safe_text
from adwin.teacher_server.routers import completions, health, models
from adwin.teacher_server.schemas import error_body
from adwin.teacher_server.scoring import Overloaded
from adwin.teacher_server.service import BadRequest, TeacherService
from adwin.teacher_server.strict_json import BodyError

DEFAULT_MAX_BODY_BYTES = 64 << 20  # 64 MiB: thousands of long token-id sequences
_OPEN_PATHS = frozenset({"/v1/health"})  # under /v1 but without auth, as /health
_DOUBLE_V1_HINT = (" (the path repeats /v1: this client wants the server's root URL, e.g. http://HOST:PORT, and "
                   "adds /v1 itself)")


class _Guard:
    """Pure ASGI: auth and the body limit before any route runs."""

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int) -> None:
        self.app, self.token, self.max_body = app, token, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1") or scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.token is not None and not bearer_authorized(scope, self.token):
            await _send(send, 401, error_body(401, "this server needs 'Authorization: Bearer <token>'"),
                        [(b"www-authenticate", b"Bearer")])
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await _send(send, 413, error_body(413, f"request body of {int(length)} bytes is over the limit of "
                                                   f"{self.max_body}"))
            return
        seen = [0]

        async def limited() -> dict:  # a chunked body has no Content-Length
            message = await receive()
            seen[0] += len(message.get("body", b""))
            if seen[0] > self.max_body:
                raise HTTPException(413, f"request body is over the limit of {self.max_body} bytes")
            return message

        await self.app(scope, limited, send)


async def _send(send: Callable, status: int, body: dict[str, Any], extra: list | None = None) -> None:
    raw = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": raw})


_UNION_BRANCH = re.compile(r"^(list|dict)\[.*\]$|^(int|str|float|bool)$")  # pydantic's tag of a union member


def _param(loc: tuple[Any, ...]) -> str:
    """``("body", "prompt", "list[list[int]]", 0, 3)`` -> ``prompt[0][3]``."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_BRANCH.match(str(part)):
            out += f".{part}" if out else str(part)
    return safe_text(out) or "body"


def create_app(service: TeacherService, *, token: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="adwin teacher server", version="1",
                  description="A teacher model scoring token-id prompts over OpenAI-compatible completions.")
    app.state.teacher = service

    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(exc.status, safe_text(str(exc)), exc.param), status_code=exc.status)

    @app.exception_handler(Overloaded)
    async def _overloaded(request: Request, exc: Overloaded) -> JSONResponse:
        return JSONResponse(error_body(503, str(exc)), status_code=503, headers={"retry-after": "1"})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # never echo the input (it may be NaN or a lone surrogate): where and why only
        errors = list(exc.errors())
        # the most specific error (of a union's members, the one that got furthest), the later on a tie
        first = max(reversed(errors), key=lambda e: len(e.get("loc", ())), default={})
        param = _param(tuple(first.get("loc", ())))
        message = "body is not valid JSON" if first.get("type") == "json_invalid" else \
            f"{param}: {safe_text(str(first.get('msg', 'invalid')))}"
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(Exception)
    async def _failed(request: Request, exc: Exception) -> JSONResponse:  # logged by the batcher or by uvicorn
        return JSONResponse(error_body(500, f"the server failed: {type(exc).__name__}"), status_code=500)

    @app.exception_handler(BodyError)
    async def _body(request: Request, exc: BodyError) -> JSONResponse:
        return JSONResponse(error_body(400, str(exc.detail), exc.param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        hint = _DOUBLE_V1_HINT if exc.status_code == 404 and request.url.path.startswith("/v1/v1/") else ""
        return JSONResponse(error_body(exc.status_code, safe_text(str(exc.detail)) + hint),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    for module in (health, models, completions):
        app.include_router(module.router)
    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes)  # type: ignore[arg-type]
    _declare_errors_not_422(app)
    return app


def _declare_errors_not_422(app: FastAPI) -> None:
    """Drop FastAPI's generated 422 entries from the OpenAPI schema: validation errors are 400s here."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for operation in (op for path in schema.get("paths", {}).values() for op in path.values()):
                operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
