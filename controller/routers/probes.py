"""``/v1/runs/{run_id}/probes/...``: offers, plans, extension reports and probe batches."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Response

from adwin.controller.core import Controller
from adwin.controller.routers._deps import controller, idempotency_key
from adwin.controller.schemas import (
    MAX_INT,
    OfferIn,
    OfferOut,
    ProbeBatchOut,
    ProbeOut,
    ProbePlanOut,
    ProbeReportIn,
)

router = APIRouter(prefix="/v1/runs/{run_id}/probes", tags=["probes"])


@router.post("/offers", response_model=OfferOut, summary="offer unfinished prefixes; the controller picks probes")
def offer_probes(
    run_id: str, offer: OfferIn, ctrl: Controller = Depends(controller), key: str | None = Depends(idempotency_key)
) -> OfferOut:
    return ctrl.offer_probes(run_id, offer, idempotency_key=key)


@router.get("/plan", response_model=ProbePlanOut, summary="how far active probes may extend; which to force-complete")
def probe_plan(run_id: str, step: int = Query(..., ge=0, le=MAX_INT), ctrl: Controller = Depends(controller)) -> ProbePlanOut:
    return ctrl.probe_plan(run_id, step)


@router.post("/reports", response_model=ProbeOut, summary="report one probe extension (tokens, version, end state)")
def report_probe(
    run_id: str, report: ProbeReportIn, ctrl: Controller = Depends(controller), key: str | None = Depends(idempotency_key)
) -> ProbeOut:
    return ctrl.report_probe(run_id, report, idempotency_key=key)


@router.post(
    "/batches",
    response_model=ProbeBatchOut,
    responses={204: {"description": "fewer than P probes are ready inside the windowed-FIFO head"}},
    summary="take the next probe batch (windowed FIFO) and open an audit for it",
)
def next_probe_batch(
    run_id: str,
    step: int | None = Query(None, ge=0, le=MAX_INT, description="the caller's student version: the batch forms at "
                             "max(this, the newest step written); the run's step moves only through writes"),
    ctrl: Controller = Depends(controller),
    key: str | None = Depends(idempotency_key),
) -> ProbeBatchOut | Response:
    batch = ctrl.next_probe_batch(run_id, step=step, idempotency_key=key)
    return Response(status_code=204) if batch is None else batch
