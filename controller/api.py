"""``ControllerAPI``: the one protocol that the in-process ``Controller`` and ``RemoteController`` share.

Lifecycle of one run, as the synchronous trainer drives it (docs/design.md "The loop"):

1. ``register_run`` once.
2. Each step ``t``: ``get_window(run, t)`` -> W (never blocks on probes).
3. After the rollout: ``offer_probes(run, t, unfinished prefixes)`` -> accepted probe ids.
4. ``probe_plan(run, t)`` -> how far each active probe may extend (W) and which must be
   force-completed (staleness ``t - oldest_version >= S``); the pool extends them and calls
   ``report_probe`` for each extension (tokens, version, finished/forced/dropped).
5. ``next_probe_batch(run)`` -> ``None`` or an audit id with P probe ids in submission order
   (windowed FIFO). The trainer audits them and calls ``submit_audit``, which returns the decision
   once all ``world_size`` ranks have reported (``submit_sketch`` sends one rank's sketch as an array).
6. ``report_step(run, t, metrics)``; ``telemetry(run)`` reads everything back.

Every write is idempotent under its ``idempotency_key``: a repeated key returns the original answer
and is counted once.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from adwin.audit.errors import NonFiniteAuditError

__all__ = [
    "AuditConflict",
    "ControllerAPI",
    "ControllerError",
    "ControllerUnavailable",
    "InvalidInput",
    "NonFiniteAudit",
    "PayloadTooLarge",
    "ProbeConflict",
    "RunConflict",
    "Unauthorized",
    "UnknownProbe",
    "UnknownRun",
]

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


class ControllerError(Exception):
    """Base class; ``status`` mirrors the HTTP status the service answers with."""

    status = 400


class UnknownRun(ControllerError):
    status = 404


class UnknownProbe(ControllerError):
    status = 404


class AuditConflict(ControllerError):
    """Unknown audit id, an audit already decided, or a rank submitting twice."""

    status = 409


class RunConflict(ControllerError):
    """A run id registered again with a different spec."""

    status = 409


class ProbeConflict(ControllerError):
    """A report for a probe that is no longer active."""

    status = 409


class InvalidInput(ControllerError):
    status = 422


class NonFiniteAudit(InvalidInput, NonFiniteAuditError):
    """An audit refused for NaN/Inf values (recorded as a ``fallback`` decision: the window stays).

    An ``InvalidInput`` (HTTP 422, clients that catch that keep working) and the audit math's
    ``NonFiniteAuditError``, so drivers treat both refusals alike by type.
    """


class Unauthorized(ControllerError):
    """A write without the service's bearer token (HTTP only)."""

    status = 401


class PayloadTooLarge(ControllerError):
    """A request body over the service's limit (HTTP only)."""

    status = 413


class ControllerUnavailable(ControllerError):
    """The remote controller could not be reached after retries."""

    status = 503


# The service names the class in its error body ("error"); the client maps the name (or, for errors
# the service did not name, e.g. FastAPI's own 422s, the status) back to the class.
def _subclasses(cls: type[ControllerError]) -> list[type[ControllerError]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


ERRORS: dict[str, type[ControllerError]] = {cls.__name__: cls for cls in _subclasses(ControllerError)}
ERROR_BY_STATUS: dict[int, type[ControllerError]] = {
    401: Unauthorized, 404: UnknownRun, 409: AuditConflict, 413: PayloadTooLarge, 422: InvalidInput,
}


def error_class(name: str | None, status: int) -> type[ControllerError]:
    """The ``ControllerError`` subclass for an HTTP error answer."""
    return ERRORS.get(name or "") or ERROR_BY_STATUS.get(status, ControllerError)


@runtime_checkable
class ControllerAPI(Protocol):
    def register_run(self, spec: RunIn, *, idempotency_key: str | None = None) -> RunOut: ...

    def get_run(self, run_id: str) -> RunOut: ...

    def list_runs(self) -> list[RunOut]: ...

    def get_window(self, run_id: str, step: int) -> WindowOut: ...

    def offer_probes(self, run_id: str, offer: OfferIn, *, idempotency_key: str | None = None) -> OfferOut: ...

    def probe_plan(self, run_id: str, step: int) -> ProbePlanOut: ...

    def report_probe(self, run_id: str, report: ProbeReportIn, *, idempotency_key: str | None = None) -> ProbeOut: ...

    def next_probe_batch(
        self, run_id: str, *, step: int | None = None, idempotency_key: str | None = None
    ) -> ProbeBatchOut | None: ...

    def submit_audit(
        self, run_id: str, audit_id: int, audit: AuditIn, *, idempotency_key: str | None = None
    ) -> AuditOut: ...

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
        """One rank's (K+1, D) float32 sketch as an array (over HTTP: raw bytes, no base64)."""
        ...

    def report_step(self, run_id: str, metrics: StepMetricsIn, *, idempotency_key: str | None = None) -> None: ...

    def telemetry(self, run_id: str, since_step: int = 0) -> TelemetryOut: ...
