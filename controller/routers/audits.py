"""``/v1/runs/{run_id}/audits/{audit_id}``: submit an audit (cosines, Gram, or one rank's sketch).

Two ways to send a rank's sketch: JSON (``sketch_b64``) on ``POST …/{audit_id}``, or the raw float32
bytes on ``POST …/{audit_id}/sketch`` (``application/octet-stream``, shape in the query): no base64
and no JSON parse of a half-megabyte string, which is what keeps an 8-rank audit fast.
"""

from __future__ import annotations

import json

import numpy as np
from fastapi import APIRouter, Depends, Header, Path, Query, Request

from adwin.controller.api import InvalidInput
from adwin.controller.core import Controller
from adwin.controller.routers._deps import controller, idempotency_key
from adwin.controller.schemas import MAX_INT, AuditIn, AuditOut

router = APIRouter(prefix="/v1/runs/{run_id}/audits", tags=["audits"])

_SKETCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "description": "rows x cols little-endian float32, row-major (this rank's (K+1, D) sketch)",
    }
}


@router.post(
    "/{audit_id}",
    response_model=AuditOut,
    summary="submit an audit; decided once every rank's sketch (or the batch's cosines/Gram) is in",
)
# async: the controller call is short (decode, one SQLite insert; a few ms for a 16384-dim rank) and the
# thread-pool hops of a sync route cost more than that on a busy machine.
async def submit_audit(
    run_id: str,
    audit: AuditIn,
    audit_id: int = Path(..., ge=1, le=MAX_INT),
    ctrl: Controller = Depends(controller),
    key: str | None = Depends(idempotency_key),
) -> AuditOut:
    return ctrl.submit_audit(run_id, audit_id, audit, idempotency_key=key)


@router.post(
    "/{audit_id}/sketch",
    response_model=AuditOut,
    openapi_extra=_SKETCH_BODY,
    summary="submit one rank's sketch as raw float32 bytes (application/octet-stream)",
)
async def submit_sketch(
    request: Request,
    run_id: str,
    audit_id: int = Path(..., ge=1, le=MAX_INT),
    rank: int = Query(0, ge=0, le=4095),
    rows: int = Query(..., ge=1, le=MAX_INT, description="K+1"),
    cols: int = Query(..., ge=1, le=MAX_INT, description="D"),
    meta: str | None = Header(
        None, alias="X-Audit-Meta", max_length=65_536,
        description='optional JSON {"macro_cosines": {candidate: cos}, "stats": {name: value}}',
    ),
    ctrl: Controller = Depends(controller),
    key: str | None = Depends(idempotency_key),
) -> AuditOut:
    body = await request.body()
    if len(body) != 4 * rows * cols:
        raise InvalidInput(f"body holds {len(body)} bytes; rows x cols = {rows} x {cols} float32 needs {4 * rows * cols}")
    extra = _parse_meta(meta)
    sketch = np.frombuffer(body, dtype="<f4").reshape(rows, cols)  # (K+1, D)
    return ctrl.submit_sketch(run_id, audit_id, rank, sketch, idempotency_key=key, **extra)


def _parse_meta(meta: str | None) -> dict:
    if meta is None:
        return {}
    try:
        parsed = json.loads(meta)
    except ValueError as e:
        raise InvalidInput(f"X-Audit-Meta is not JSON: {e}") from e
    if not isinstance(parsed, dict) or set(parsed) - {"macro_cosines", "stats"}:
        raise InvalidInput("X-Audit-Meta must be a JSON object with only 'macro_cosines' and 'stats'")
    return parsed
