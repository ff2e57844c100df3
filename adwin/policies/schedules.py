"""Schedules: policies whose window is fixed in advance (no audits, no step inputs).

``full`` is standard OPD, ``fixed`` the paper's prefix-OPD ablation (Table 3), ``linear`` Fast OPD.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from adwin.policies.base import PolicyFields, WindowConfigError, check_positive_int


class FullRollout:
    """Standard OPD: every step generates up to the full horizon."""

    name: ClassVar[str] = "full"
    audited: ClassVar[bool] = False
    spec_args: ClassVar[tuple[str, ...]] = ()

    def __init__(self, max_len: int) -> None:
        self.max_len = check_positive_int("max_len", max_len)

    @classmethod
    def from_fields(cls, f: PolicyFields) -> FullRollout:
        return cls(f.max_len)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> FullRollout:
        policy = cls(int(state["max_len"]))
        policy.load_state_dict(state)
        return policy

    def window(self, step: int) -> int:
        return self.max_len

    def observe(self, result: Any) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_len": self.max_len}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.max_len = int(state["max_len"])


class FixedWindow:
    """Prefix OPD with a manually chosen window (the paper's Table 3 ablation)."""

    name: ClassVar[str] = "fixed"
    audited: ClassVar[bool] = False
    spec_args: ClassVar[tuple[str, ...]] = ("window",)

    def __init__(self, w: int, max_len: int | None = None) -> None:
        self.w = check_positive_int("window", w)
        if max_len is not None and w > max_len:
            raise WindowConfigError(f"window={w} must be <= max_len={max_len}")

    @classmethod
    def from_fields(cls, f: PolicyFields) -> FixedWindow:
        if f.window is None:
            raise WindowConfigError("window is required for the fixed policy")
        return cls(f.window, max_len=f.max_len)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> FixedWindow:
        policy = cls(int(state["w"]))
        policy.load_state_dict(state)
        return policy

    def window(self, step: int) -> int:
        return self.w

    def observe(self, result: Any) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "w": self.w}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.w = int(state["w"])


class LinearWindow:
    """Fast OPD: the window starts at ``start`` and grows by ``step_size`` per optimizer step."""

    name: ClassVar[str] = "linear"
    audited: ClassVar[bool] = False
    spec_args: ClassVar[tuple[str, ...]] = ("start", "step")

    def __init__(self, start: int, step: int, max_len: int) -> None:
        self.start = check_positive_int("start", start)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise WindowConfigError(f"step must be an integer >= 0, got {step!r}")
        self.step_size = step
        self.max_len = check_positive_int("max_len", max_len)
        if start > max_len:
            raise WindowConfigError(f"start={start} must be <= max_len={max_len}")

    @classmethod
    def from_fields(cls, f: PolicyFields) -> LinearWindow:
        if f.start is None or f.step is None:
            raise WindowConfigError("start and step are required for the linear policy")
        return cls(f.start, f.step, f.max_len)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LinearWindow:
        policy = cls(int(state["start"]), int(state["step"]), int(state["max_len"]))
        policy.load_state_dict(state)
        return policy

    def window(self, step: int) -> int:
        return min(self.max_len, self.start + self.step_size * max(0, step))

    def observe(self, result: Any) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "start": self.start, "step": self.step_size, "max_len": self.max_len}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.start, self.step_size, self.max_len = int(state["start"]), int(state["step"]), int(state["max_len"])
