"""``RemoteController``: the ``ControllerAPI`` over HTTP (``adwin controller serve``).

Retries connection errors, timeouts and 5xx answers with exponential backoff. That is safe for writes
because every write carries an ``Idempotency-Key``: the caller's, or a fresh uuid per call that is
reused across that call's retries, so the service applies it once. HTTP errors map back to the
``ControllerError`` subclasses the in-process ``Controller`` raises.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import httpx
import numpy as np

from adwin.controller.api import ControllerError, ControllerUnavailable, InvalidInput, error_class
from adwin.controller.schemas import (
    AuditIn,
    AuditOut,
    OfferIn,
    OfferOut,
    ProbeBatchOut,
    ProbeOut,
    ProbePlanOut,
    ProbeReportIn,
    RunIn,
    RunOut,
    StepMetricsIn,
    TelemetryOut,
    WindowOut,
)

logger = logging.getLogger(__name__)

def _error_from(response: httpx.Response) -> ControllerError:
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text}
    detail = body.get("detail") if isinstance(body, dict) else body
    name = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, list):  # FastAPI validation errors: name the fields
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail)
    return error_class(name, response.status_code)(f"HTTP {response.status_code}: {detail}")


class RemoteController:
    """HTTP client implementing ``ControllerAPI`` against ``base_url`` (e.g. ``http://127.0.0.1:8470``)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retries: int = 4,
        backoff: float = 0.1,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, headers=headers, transport=transport)
        self.retries, self.backoff = retries, backoff

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        raw: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        write: bool = False,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        headers = dict(headers or {})
        if write:
            headers["Idempotency-Key"] = idempotency_key or uuid.uuid4().hex  # same key for every retry
        content = raw
        if raw is not None:
            headers["Content-Type"] = "application/octet-stream"
        elif body is not None:
            # json.dumps (not httpx's json=) so NaN/Inf reach the service, which refuses them with a 422
            # and records the rejected audit, exactly like the in-process controller.
            content = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * (2 ** (attempt - 1)))
            try:
                response = self._client.request(method, path, content=content, params=params, headers=headers)
            except httpx.TransportError as e:  # connect/read errors and timeouts
                last = e
                logger.debug("controller %s %s failed (%s), attempt %d", method, path, e, attempt + 1)
                continue
            if response.status_code >= 500:
                last = ControllerError(f"HTTP {response.status_code}: {response.text[:200]}")
                continue
            if response.status_code >= 400:
                raise _error_from(response)
            return response
        raise ControllerUnavailable(f"controller at {self._client.base_url} unavailable after {self.retries + 1} tries: {last}")

    # --- ControllerAPI ---------------------------------------------------------------------------

    def register_run(self, spec: RunIn, *, idempotency_key: str | None = None) -> RunOut:
        r = self._request("POST", "/v1/runs", body=spec.model_dump(mode="json"), write=True, idempotency_key=idempotency_key)
        return RunOut.model_validate(r.json())

    def get_run(self, run_id: str) -> RunOut:
        return RunOut.model_validate(self._request("GET", f"/v1/runs/{run_id}").json())

    def list_runs(self) -> list[RunOut]:
        return [RunOut.model_validate(x) for x in self._request("GET", "/v1/runs").json()]

    def get_window(self, run_id: str, step: int) -> WindowOut:
        return WindowOut.model_validate(self._request("GET", f"/v1/runs/{run_id}/window", params={"step": step}).json())

    def offer_probes(self, run_id: str, offer: OfferIn, *, idempotency_key: str | None = None) -> OfferOut:
        r = self._request(
            "POST", f"/v1/runs/{run_id}/probes/offers", body=offer.model_dump(mode="json"), write=True, idempotency_key=idempotency_key
        )
        return OfferOut.model_validate(r.json())

    def probe_plan(self, run_id: str, step: int) -> ProbePlanOut:
        r = self._request("GET", f"/v1/runs/{run_id}/probes/plan", params={"step": step})
        return ProbePlanOut.model_validate(r.json())

    def report_probe(self, run_id: str, report: ProbeReportIn, *, idempotency_key: str | None = None) -> ProbeOut:
        r = self._request(
            "POST", f"/v1/runs/{run_id}/probes/reports", body=report.model_dump(mode="json"), write=True, idempotency_key=idempotency_key
        )
        return ProbeOut.model_validate(r.json())

    def next_probe_batch(
        self, run_id: str, *, step: int | None = None, idempotency_key: str | None = None
    ) -> ProbeBatchOut | None:
        path = f"/v1/runs/{run_id}/probes/batches" + ("" if step is None else f"?step={step}")
        r = self._request("POST", path, write=True, idempotency_key=idempotency_key)
        return None if r.status_code == 204 else ProbeBatchOut.model_validate(r.json())

    def submit_audit(
        self, run_id: str, audit_id: int, audit: AuditIn, *, idempotency_key: str | None = None
    ) -> AuditOut:
        body = audit.model_dump(mode="python", exclude_none=True)  # python mode keeps NaN as a float
        r = self._request("POST", f"/v1/runs/{run_id}/audits/{audit_id}", body=body, write=True, idempotency_key=idempotency_key)
        return AuditOut.model_validate(r.json())

    def submit_sketch(
        self,
        run_id: str,
        audit_id: int,
        rank: int,
        sketch: np.ndarray,
        *,
        macro_cosines: dict[int, float] | None = None,
        stats: dict[str, float] | None = None,
        idempotency_key: str | None = None,
    ) -> AuditOut:
        arr = np.ascontiguousarray(sketch, dtype="<f4")  # (K+1, D)
        if arr.ndim != 2:
            raise InvalidInput(f"sketch must be 2-d (K+1, D), got shape {arr.shape}")
        meta = {k: v for k, v in (("macro_cosines", macro_cosines), ("stats", stats)) if v}
        r = self._request(
            "POST",
            f"/v1/runs/{run_id}/audits/{audit_id}/sketch",
            raw=arr.tobytes(),
            params={"rank": rank, "rows": arr.shape[0], "cols": arr.shape[1]},
            headers={"X-Audit-Meta": json.dumps(meta)} if meta else None,
            write=True,
            idempotency_key=idempotency_key,
        )
        return AuditOut.model_validate(r.json())

    def report_step(self, run_id: str, metrics: StepMetricsIn, *, idempotency_key: str | None = None) -> None:
        self._request(
            "POST", f"/v1/runs/{run_id}/steps", body=metrics.model_dump(mode="python"), write=True, idempotency_key=idempotency_key
        )

    def telemetry(self, run_id: str, since_step: int = 0) -> TelemetryOut:
        r = self._request("GET", f"/v1/runs/{run_id}/telemetry", params={"since_step": since_step})
        return TelemetryOut.model_validate(r.json())
