"""The controller's HTTP service: a thin FastAPI app over one in-process ``Controller``.

Routes live in ``adwin.controller.routers`` (one module per resource, all under ``/v1``); this module
wires them together with the cross-cutting parts: bearer-token auth for writes, the request-body
limit, error mapping (``ControllerError.status``), Prometheus metrics and ``/healthz``.
``serve_in_thread`` runs the app with uvicorn on a background thread (the embedded ``adwin train``
serves its dashboard this way).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.exceptions import HTTPException as StarletteHTTPException

from adwin.controller.api import ControllerError
from adwin.controller.core import Controller
from adwin.controller.json_guard import safe_text
from adwin.controller.routers import audits, dashboard, probes, runs, telemetry, windows
from adwin.controller.schemas import ERROR_RESPONSES

logger = logging.getLogger(__name__)

# One audit rank's sketch is (K+1, D) float32 sent as base64 (4 chars per 3 bytes). The default limit
# fits a whole 8-rank x 6-segment x 16384-dim audit in one body (4 MiB of base64), plus 1 MiB for JSON.
_SKETCH_B64_BYTES = math.ceil(8 * 6 * 16384 * 4 / 3) * 4  # = 4_194_304
DEFAULT_MAX_BODY_BYTES = _SKETCH_B64_BYTES + (1 << 20)  # = 5_242_880

_WINDOW_ROUTE = "/v1/runs/{run_id}/window"
_HTTP_ERRORS = {400: "BadRequest", 413: "PayloadTooLarge"}
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class _BodyTooLarge(HTTPException):
    """Raised from ``receive``: FastAPI re-raises HTTPExceptions from body parsing (others become 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=f"request body is over the limit of {limit} bytes")


class _ServiceMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware overhead on the hot path): auth, body limit, latency.

    The window path is handed to ``routers.windows.answer`` before FastAPI's routing (its one answerer,
    errors included; ~8x cheaper per request than a FastAPI route).
    """

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int, latency: Histogram, controller: Controller) -> None:
        self.app, self.token, self.max_body, self.latency = app, token, max_body_bytes, latency
        self.controller = controller
        self.window_latency = latency.labels("GET", _WINDOW_ROUTE, "200")

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        window = windows.PATH.match(scope["path"])
        if window is not None:
            start = time.perf_counter()
            status = await windows.answer(self.controller, scope, window.group(1), send)
            hist = self.window_latency if status == 200 else self.latency.labels(method, _WINDOW_ROUTE, str(status))
            hist.observe(time.perf_counter() - start)
            return
        start = time.perf_counter()
        status_box = [500]

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
                route = scope.get("route")
                self.latency.labels(method, getattr(route, "path", "unmatched"), str(message["status"])).observe(
                    time.perf_counter() - start
                )
            await send(message)

        if method in _WRITE_METHODS:
            if self.token is not None and not self._authorized(scope):
                await _send_error(send, 401, "Unauthorized", "writes need 'Authorization: Bearer <token>'",
                                  extra_headers=[(b"www-authenticate", b"Bearer")])
                return
            length = dict(scope["headers"]).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body:
                await _send_error(send, 413, "PayloadTooLarge", f"request body of {int(length)} bytes is over the limit of {self.max_body}")
                return
            receive = self._limited(receive)
        try:
            await self.app(scope, receive, send_wrapper)
        except _BodyTooLarge:
            await _send_error(send, 413, "PayloadTooLarge", f"request body is over the limit of {self.max_body} bytes")

    def _authorized(self, scope: dict) -> bool:
        return bearer_authorized(scope, self.token or "")

    def _limited(self, receive: Callable) -> Callable:
        """Count streamed (chunked) body bytes too: Content-Length alone can be absent."""
        seen = [0]

        async def wrapped() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body:
                    raise _BodyTooLarge(self.max_body)
            return message

        return wrapped


def bearer_authorized(scope: dict, token: str) -> bool:
    """Whether an ASGI request carries ``Authorization: Bearer <token>`` (compared in constant time)."""
    header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


async def _send_error(send: Callable, status: int, error: str, detail: str, extra_headers: list | None = None) -> None:
    body = json.dumps({"detail": detail, "error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


class _ControllerCollector:
    """Gauges read from the controller at scrape time (no bookkeeping on the request path)."""

    def __init__(self, ctrl: Controller) -> None:
        self.ctrl = ctrl

    def describe(self) -> list:
        return []  # do not collect at registration time

    def collect(self) -> Any:
        window = GaugeMetricFamily("adwin_window_tokens", "current window of each run", labels=["run_id"])
        step = GaugeMetricFamily("adwin_last_step", "newest step the controller has seen", labels=["run_id"])
        probes_g = GaugeMetricFamily("adwin_probes", "probes by state (plus declined, forced)", labels=["run_id", "state"])
        audits_g = GaugeMetricFamily("adwin_audits", "audits by state", labels=["run_id", "state"])
        stale = GaugeMetricFamily("adwin_probe_staleness_max", "max staleness of active probes, in steps", labels=["run_id"])
        for snap in self.ctrl.snapshot():
            rid = snap["run_id"]
            window.add_metric([rid], snap["window"])
            step.add_metric([rid], snap["last_step"])
            stale.add_metric([rid], snap["staleness_max"])
            for state, n in snap["probes"].items():
                if state != "tokens_added":
                    probes_g.add_metric([rid, state], n)
            for state, n in snap["audits"].items():
                audits_g.add_metric([rid, state], n)
        yield from (window, step, probes_g, audits_g, stale)


def create_app(
    controller: Controller,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The HTTP API (``/v1``), ``/healthz``, ``/metrics``, ``/docs`` and the dashboard over ``controller``."""
    app = FastAPI(
        title="adwin controller",
        version="1",
        description="Adaptive prefix windows for on-policy distillation: windows, probes, audits, telemetry.",
        responses=ERROR_RESPONSES,
    )
    app.state.controller = controller
    registry = CollectorRegistry()
    registry.register(_ControllerCollector(controller))
    latency = Histogram(
        "adwin_http_request_seconds",
        "time to the response headers, by route",
        ["method", "route", "status"],
        registry=registry,
        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
    )

    @app.exception_handler(ControllerError)
    async def _controller_error(request: Request, exc: ControllerError) -> JSONResponse:
        return JSONResponse({"detail": safe_text(str(exc)), "error": type(exc).__name__}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the offending input, which may be NaN or a lone surrogate and then
        # cannot be encoded (a 500 that drops the connection): answer where and why, never the input.
        detail = [{"loc": [safe_text(str(p)) if isinstance(p, str) else p for p in e.get("loc", ())],
                   "msg": safe_text(str(e.get("msg", ""))), "type": str(e.get("type", ""))} for e in exc.errors()]
        return JSONResponse({"detail": detail, "error": "ValidationError"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (unknown route 404, 405, a body that is not UTF-8 JSON 400, a streamed
        # body over the limit 413) carry the same ErrorOut body as the controller's.
        error = _HTTP_ERRORS.get(exc.status_code) or HTTPStatus(exc.status_code).phrase.replace(" ", "")
        return JSONResponse({"detail": safe_text(str(exc.detail)), "error": error}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "runs": len(controller.list_runs())}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    for module in (runs, probes, audits, telemetry, dashboard):
        app.include_router(module.router)
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's schema plus the window path, which the middleware answers (no FastAPI route)."""
        schema = default_openapi()
        errors = {str(s): {"description": r["description"],
                           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
                  for s, r in ERROR_RESPONSES.items() if s not in (400, 401, 409, 413)}
        schema["paths"].setdefault(_WINDOW_ROUTE, windows.openapi_path(errors))
        schema.setdefault("components", {}).setdefault("schemas", {}).setdefault("WindowOut", windows.WINDOW_SCHEMA)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(_ServiceMiddleware, token=token, max_body_bytes=max_body_bytes, latency=latency, controller=controller)
    return app


def serve_in_thread(
    controller: Controller,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    startup_timeout: float = 10.0,
) -> tuple[str, Callable[[], None]]:
    """Serve ``controller`` with uvicorn on a daemon thread; returns ``(base_url, stop)``.

    ``port=0`` picks a free ephemeral port. ``stop()`` shuts the server down and joins the thread.
    """
    url, stop = serve_app_in_thread(create_app(controller, token=token, max_body_bytes=max_body_bytes), host, port,
                                    startup_timeout=startup_timeout, name="adwin-controller-http")
    logger.info("controller dashboard and API at %s", url)
    return url, stop


def serve_app_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, *, startup_timeout: float = 10.0,
                        name: str = "adwin-http") -> tuple[str, Callable[[], None]]:
    """Serve an ASGI ``app`` with uvicorn on a daemon thread (the controller's, the teacher server's in tests);
    returns ``(base_url, stop)``."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"{name}: the HTTP server did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"http://{shown}:{bound[1]}"

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    return url, stop
