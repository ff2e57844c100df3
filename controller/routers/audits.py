"""``/v1/runs/{run_id}/audits/{audit_id}``: submit an audit (cosines, Gram, or one rank's sketch)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path

from adwin.controller.core import Controller
from adwin.controller.routers._deps import controller, idempotency_key
from adwin.controller.schemas import MAX_INT, AuditIn, AuditOut

router = APIRouter(prefix="/v1/runs/{run_id}/audits", tags=["audits"])


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
