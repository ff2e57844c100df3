"""Step metrics in, telemetry out: ``/v1/runs/{run_id}/steps``, ``/telemetry`` and the SSE ``/events``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from adwin.controller.core import Controller
from adwin.controller.routers._deps import controller, idempotency_key
from adwin.controller.schemas import MAX_INT, StepMetricsIn, TelemetryOut

router = APIRouter(prefix="/v1/runs/{run_id}", tags=["telemetry"])


@router.post("/steps", status_code=204, summary="report one step's metrics (floats; merged into the step's row)")
def report_step(
    run_id: str, metrics: StepMetricsIn, ctrl: Controller = Depends(controller), key: str | None = Depends(idempotency_key)
) -> Response:
    ctrl.report_step(run_id, metrics, idempotency_key=key)
    return Response(status_code=204)


@router.get("/telemetry", response_model=TelemetryOut, summary="steps, decisions, audits and probe counts")
def telemetry(run_id: str, since_step: int = Query(0, ge=0, le=MAX_INT), ctrl: Controller = Depends(controller)) -> TelemetryOut:
    return ctrl.telemetry(run_id, since_step)


@router.get(
    "/events",
    summary="server-sent events: the run's telemetry each time it changes (event: telemetry)",
    response_class=StreamingResponse,
)
async def events(
    request: Request,
    run_id: str,
    since_step: int = Query(0, ge=0, le=MAX_INT),
    interval: float = Query(0.5, gt=0.0, le=60.0, description="seconds between change checks"),
    max_events: int = Query(0, ge=0, description="close after this many events (0: never)"),
) -> StreamingResponse:
    ctrl: Controller = request.app.state.controller
    ctrl.revision(run_id)  # unknown run -> 404 before the stream starts

    async def stream() -> AsyncIterator[str]:
        last_rev, sent, last_beat = -1, 0, time.monotonic()
        while not await request.is_disconnected():
            rev = ctrl.revision(run_id)
            if rev != last_rev:
                tel = await run_in_threadpool(ctrl.telemetry, run_id, since_step)
                yield f"event: telemetry\nid: {rev}\ndata: {tel.model_dump_json()}\n\n"
                last_rev, sent, last_beat = rev, sent + 1, time.monotonic()
                if max_events and sent >= max_events:
                    return
            elif time.monotonic() - last_beat > 15.0:  # keep proxies from closing an idle stream
                yield ": keep-alive\n\n"
                last_beat = time.monotonic()
            await asyncio.sleep(interval)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
