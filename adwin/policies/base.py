"""What every window policy is: the ``WindowPolicy`` protocol, the plain fields policies are built from,
and the validators whose messages name the field and its range.

Every policy answers ``window(step)``, learns from ``observe(...)`` (audits) or ``observe_step(...)``
(step metrics), and round-trips its state through a plain dict (checkpoints and the controller's store
keep that dict as JSON). Capabilities are class attributes the rest of the system reads instead of
comparing names: ``audited`` (the policy decides from probe audits, so the trainer must offer probes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable


@dataclass(frozen=True)
class PolicyFields:
    """The plain fields a policy is built from (what configs and the controller's register call carry).

    ``options`` holds policy-specific numbers (``surprise``: ``min``, ``max``, ``ema``).
    """

    max_len: int
    candidates: Sequence[int] = ()
    threshold: float = 0.7
    initial: int | None = None
    window: int | None = None
    start: int | None = None
    step: int | None = None
    options: Mapping[str, float] = field(default_factory=dict)


class WindowConfigError(ValueError):
    """A window policy was built with an invalid field; the message names the field and its range."""


@runtime_checkable
class WindowPolicy(Protocol):
    name: ClassVar[str]
    audited: ClassVar[bool]  # decides from probe audits: the trainer offers probes and audits them
    spec_args: ClassVar[tuple[str, ...]]  # fields of the CLI shorthand ``name:arg:...`` (fixed:W)

    @classmethod
    def from_fields(cls, f: PolicyFields) -> WindowPolicy: ...

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WindowPolicy: ...

    def window(self, step: int) -> int: ...

    def observe(self, result: Any) -> bool:
        """Feed an audit (anything with ``.cosines`` or a ``{candidate: cosine}`` mapping).

        Returns True when the observation changed the window.
        """
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class StepObserver(Protocol):
    """A policy that learns from each step's metrics (the controller feeds them from ``report_step``)."""

    def observe_step(self, step: int, metrics: Mapping[str, float]) -> bool: ...


def check_positive_int(field: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WindowConfigError(f"{field} must be an integer >= 1, got {value!r}")
    return value


def validate_candidates(candidates: Sequence[int], max_len: int) -> list[int]:
    """Candidates must be positive, strictly increasing and at most ``max_len``."""
    cands = list(candidates)
    if not cands:
        raise WindowConfigError("candidates must be a non-empty list of window lengths")
    for i, c in enumerate(cands):
        check_positive_int(f"candidates[{i}]", c)
        if c > max_len:
            raise WindowConfigError(f"candidates[{i}]={c} must be <= max_len={max_len}")
        if i and c <= cands[i - 1]:
            raise WindowConfigError(
                f"candidates must be strictly increasing: candidates[{i}]={c} <= candidates[{i - 1}]={cands[i - 1]}"
            )
    return cands


def validate_threshold(threshold: float) -> float:
    if not isinstance(threshold, (int, float)) or not math.isfinite(threshold) or not 0.0 < threshold <= 1.0:
        raise WindowConfigError(f"threshold must be in (0, 1], got {threshold!r}")
    return float(threshold)


def intervals_of(result: Any) -> dict[int, tuple[float, float]]:
    """The ``cosine_ci`` of an ``AuditResult``-like object (``{candidate: (low, high)}``); {} when it has none."""
    raw = getattr(result, "cosine_ci", None) or {}
    return {int(k): (float(v[0]), float(v[1])) for k, v in dict(raw).items()}


def noise_floors_of(result: Any) -> dict[int, float]:
    """The ``noise_floor`` of an ``AuditResult``-like object (``{candidate: pure-noise reading}``); {} without."""
    raw = getattr(result, "noise_floor", None) or {}
    return {int(k): float(v) for k, v in dict(raw).items()}


def signal_z_of(result: Any) -> float | None:
    """The audit's full-gradient signal z (``signal_z``, or ``extra["signal_z"]`` of an ``AuditResult``); None."""
    z = getattr(result, "signal_z", None)
    if z is None:
        z = (getattr(result, "extra", None) or {}).get("signal_z")
    return None if z is None else float(z)


def cosines_of(result: Any) -> dict[int, float]:
    """Accept an ``AuditResult``-like object or a plain mapping of candidate -> cosine."""
    raw = result.cosines if hasattr(result, "cosines") else result
    return {int(k): float(v) for k, v in dict(raw).items()}
