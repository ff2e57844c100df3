"""``/v1/runs``: register, list and read runs."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from adwin.controller.core import Controller
from adwin.controller.routers._deps import controller, idempotency_key
from adwin.controller.schemas import RunIn, RunOut

router = APIRouter(prefix="/v1/runs", tags=["runs"])


@router.post("", response_model=RunOut, summary="register a run (idempotent: same id + same spec = same run)")
def register_run(spec: RunIn, ctrl: Controller = Depends(controller), key: str | None = Depends(idempotency_key)) -> RunOut:
    return ctrl.register_run(spec, idempotency_key=key)


@router.get("", response_model=list[RunOut], summary="list runs")
def list_runs(ctrl: Controller = Depends(controller)) -> list[RunOut]:
    return ctrl.list_runs()


@router.get("/{run_id}", response_model=RunOut, summary="read one run")
def get_run(run_id: str, ctrl: Controller = Depends(controller)) -> RunOut:
    return ctrl.get_run(run_id)
