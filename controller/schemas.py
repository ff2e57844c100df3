"""Wire schemas of the controller, one model per direction (``*In`` requests, ``*Out`` responses).

The in-process ``Controller`` and the HTTP ``RemoteController`` take and return these same models, so
one contract test suite covers both.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adwin.controller.json_guard import json_problem
from adwin.policies.fields import MAX_INT, PolicyKnobs, PositiveCount  # noqa: F401  (re-exported)
from adwin.policies.registry import PolicyName

# Integers on the wire stay within what SQLite (int64) stores and JavaScript (the dashboard) reads
# exactly (MAX_INT); larger values are refused with a 422 naming the field instead of failing deep inside.


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # NaN/Inf refused before validation (422); audits opt out to be recorded as a fallback decision
    _finite: ClassVar[bool] = True

    @model_validator(mode="before")
    @classmethod
    def _strict_json(cls, data: Any) -> Any:
        """Refuse what strict JSON cannot store and read back (NaN/Inf, lone surrogates, deep nesting)."""
        bad = json_problem(data, cls.__name__, finite=cls._finite)
        if bad:
            raise ValueError(bad)
        return data


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --- runs --------------------------------------------------------------------------------------


class PolicyIn(_In, PolicyKnobs):
    """The policy of a registered run: its name, its horizon, ``PolicyKnobs`` and policy-specific options."""

    name: PolicyName = "adwin"
    max_len: int = Field(8192, ge=1, le=MAX_INT)
    options: dict[str, Annotated[float, Field(allow_inf_nan=False, ge=-1e9, le=1e9)]] = Field(
        default_factory=dict, description="policy-specific numbers (surprise: min, max, ema, ...)")


class RunIn(_In):
    # must not start with '.': '.' and '..' would be path segments no client or dashboard link reaches
    run_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$",
                               description="None: the controller assigns one; letters, digits, '._-', not starting with '.'")
    name: str = Field("run", max_length=256)
    policy: PolicyIn = Field(default_factory=PolicyIn)
    # 8 (as ProbeConfig.batch_size): a default batch the default offers can fill within S (controller/feasibility.py)
    probe_batch_size: int = Field(8, ge=1, le=65_536, description="P")
    staleness_limit: int = Field(5, ge=1, le=10_000, description="S, in optimizer steps")
    offers_per_step: int = Field(4, ge=0, le=65_536)
    max_active_probes: int = Field(256, ge=1, le=1_000_000)
    lookahead: int = Field(4, ge=0, le=65_536, description="windowed-FIFO look-ahead")
    selection: Literal["uniform", "stratified"] = "uniform"
    world_size: int = Field(1, ge=1, le=4096)
    seed: int = Field(0, ge=0, le=MAX_INT)
    config: dict = Field(default_factory=dict, description="free-form resolved run config, stored for telemetry")


class RunOut(_Out):
    run_id: str
    name: str
    created_at: float
    policy_state: dict
    spec: dict


# --- window --------------------------------------------------------------------------------------


class WindowOut(_Out):
    run_id: str
    step: int
    window: int
    # unresolved: an audit whose evidence could not resolve the gradient's signal (window.unresolved's fallback)
    reason: Literal["initial", "audit", "unresolved", "schedule", "fallback"]
    audit_id: int | None = None
    cosines: dict[int, float] | None = None


# --- probes --------------------------------------------------------------------------------------


class ProbeOfferItem(_In):
    sample_id: str = Field(..., min_length=1, max_length=256)
    prompt_id: str = Field(..., min_length=1, max_length=256)
    response_len: int = Field(..., ge=0, le=MAX_INT)
    version: int = Field(..., ge=0, le=MAX_INT, description="student version that generated the prefix")


class OfferIn(_In):
    step: int = Field(..., ge=0, le=MAX_INT)
    offers: list[ProbeOfferItem]


class OfferOut(_Out):
    accepted: list[str]  # probe ids (= sample ids), in submission order
    declined: int  # offers refused because of max_active_probes or offers_per_step


class ProbePlanOut(_Out):
    step: int
    extend_by: int  # tokens each active probe may add this round: the current window
    active: list[str]  # in submission order
    # complete now, before anything is consumed: probes whose staleness reached S, and (forced fill) the
    # active ones among the first P unbatched probes when any of those reached S
    force_complete: list[str]


class ProbeReportIn(_In):
    probe_id: str = Field(..., min_length=1, max_length=256)
    step: int = Field(..., ge=0, le=MAX_INT)
    tokens_added: int = Field(..., ge=0, le=MAX_INT)
    version: int = Field(..., ge=0, le=MAX_INT)
    finished: bool = False
    forced: bool = False
    dropped: bool = False


class ProbeOut(_Out):
    probe_id: str
    state: Literal["active", "complete", "batched", "audited", "dropped", "expired"]
    tokens: int
    oldest_version: int
    newest_version: int
    submitted_step: int
    forced: bool


class ProbeBatchOut(_Out):
    audit_id: int
    probe_ids: list[str]
    version: int | None = None  # the version the batch was formed at (the newest step the controller saw)
    staleness_max: int | None = None  # max over the batch of version - oldest_version; never above S


# --- audits --------------------------------------------------------------------------------------


class AuditIn(_In):
    """Exactly one of ``cosines``, ``gram`` or ``sketch`` is given, or none with ``skipped``.

    ``sketch`` is this rank's (K+1, D) float32 sketch as base64 of little-endian bytes; the
    controller sums ``world_size`` ranks' sketches before computing cosines.
    """

    rank: int = Field(0, ge=0, le=4095)
    cosines: dict[int, float] | None = None
    macro_cosines: dict[int, float] | None = None
    gram: list[list[float]] | None = None
    sketch_b64: str | None = None
    sketch_shape: tuple[PositiveCount, PositiveCount] | None = None
    stats: dict[str, float] = Field(default_factory=dict)
    # Optional bootstrap interval per candidate cosine (``AuditResult.cosine_ci``); a ``window.confidence``
    # policy decides on it. Stored with the audit as stats ``cos_ci_low_<c>`` / ``cos_ci_high_<c>``.
    cosine_ci: dict[int, tuple[float, float]] | None = None
    # The trainer consumed the batch without auditing it (``audit.every`` / ``audit.skip_margin``): give none of
    # cosines, gram, sketch. The batch's probes leave the queue, the audit is closed as kind ``skipped``, and
    # the window stays as it is (no decision is recorded).
    skipped: bool = False
    # Non-finite values are refused by the controller itself (422), not here: the controller records
    # the rejected audit as a ``fallback`` decision so the dashboard shows why the window stayed.
    _finite: ClassVar[bool] = False


class AuditOut(_Out):
    audit_id: int
    state: Literal["pending", "decided"]
    ranks_received: int
    decision: WindowOut | None = None
    cosines: dict[int, float] | None = None


# --- telemetry -----------------------------------------------------------------------------------


MetricName = Annotated[str, Field(min_length=1, max_length=256)]
MAX_STEP_METRICS = 4096  # a trainer logs a few hundred; the bound keeps one report from bloating every telemetry read


class StepMetricsIn(_In):
    step: int = Field(..., ge=0, le=MAX_INT)
    metrics: dict[MetricName, float] = Field(..., max_length=MAX_STEP_METRICS)
    _finite: ClassVar[bool] = False  # the controller refuses a non-finite metric by name (InvalidInput)


class TelemetryOut(_Out):
    run_id: str
    steps: list[dict]  # {"step": int, "metrics": {...}}
    decisions: list[dict]  # {"step", "window", "reason", "audit_id", "cosines"}
    audits: list[dict]  # {"audit_id", "step", "cosines", "macro_cosines", "probe_ids", "stats"}
    probes: dict[str, int]  # counts by state (incl. "expired"), plus "declined", "forced", "tokens_added"


class ErrorOut(_Out):
    """Every 4xx answer: ``detail`` says what is wrong (FastAPI's own request validation gives a list of
    ``{loc, msg, type}``); ``error`` names the ``ControllerError`` class where the controller refused."""

    detail: str | list[dict[str, Any]]
    error: str | None = None


# Declared on every route, so the OpenAPI schema documents the error answers the service gives.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": text}
    for status, text in {400: "body is not UTF-8 / not parseable JSON", 401: "missing or wrong bearer token (writes, with --token)",
                         404: "unknown run, probe or audit; unknown route", 405: "method not allowed on this route",
                         409: "conflict (already decided, not active, ...)", 413: "request body over the size limit",
                         422: "invalid input (fields, NaN/Inf, lone surrogates, nesting over 64, shapes, empty Idempotency-Key)"}.items()
}
