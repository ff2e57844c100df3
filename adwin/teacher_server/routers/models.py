"""``GET /v1/models``: the one served model, as vLLM lists it (``max_model_len`` included)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from adwin.teacher_server.schemas import error_responses

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models", responses=error_responses(401))
def list_models(request: Request) -> dict[str, Any]:
    svc = request.app.state.teacher
    return {"object": "list", "data": [{"id": svc.name, "object": "model", "created": svc.created,
                                        "owned_by": "adwin", "root": svc.path, "max_model_len": svc.max_len,
                                        "vocab_size": svc.vocab_size}]}
