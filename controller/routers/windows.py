"""``/v1/runs/{run_id}/window``: the hot path, answered from the controller's cache."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from adwin.controller.schemas import MAX_INT, WindowOut

router = APIRouter(prefix="/v1/runs", tags=["windows"])


# async and dependency-free on purpose: no thread-pool hop, the controller answers from memory.
@router.get("/{run_id}/window", response_model=WindowOut, summary="the window for a step (never blocks on probes)")
async def get_window(request: Request, run_id: str, step: int = Query(..., ge=0, le=MAX_INT)) -> WindowOut:
    return request.app.state.controller.get_window(run_id, step)
