"""Liveness without auth: ``GET /health`` (vLLM's route, which TRL's ``VLLMClient.check_server`` polls) and
``GET /healthz`` (the batcher's counters). ``/v1/health`` answers too: a client given the ``/v1`` base URL where it
wants the server's root (TRL's) then reaches ``/v1/v1/models`` and gets a 404 that says so, instead of polling a
missing health route for ever."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter(tags=["service"])


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


router.add_api_route("/v1/health", health, methods=["GET"], include_in_schema=False)


@router.get("/healthz")
def healthz(request: Request) -> dict[str, Any]:
    service = request.app.state.teacher
    stats = service.batcher.stats
    return {"status": "ok", "model": service.name, "queued_rows": service.batcher.queued_rows,
            "batches": stats.batches, "rows": stats.rows, "tokens": stats.tokens, "busy_s": stats.busy_s}
