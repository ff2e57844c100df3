"""Window policies: how many response tokens the student may generate at each step.

Math layer: imports nothing from the controller, probes or application modules.

Every policy answers ``window(step)``, learns from ``observe(...)`` and round-trips its state through
a plain dict (checkpoints and the controller's store keep that dict as JSON).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


class WindowConfigError(ValueError):
    """A window policy was built with an invalid field; the message names the field and its range."""


@runtime_checkable
class WindowPolicy(Protocol):
    name: str

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


def _check_positive_int(field: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WindowConfigError(f"{field} must be an integer >= 1, got {value!r}")
    return value


def validate_candidates(candidates: Sequence[int], max_len: int) -> list[int]:
    """Candidates must be positive, strictly increasing and at most ``max_len``."""
    cands = list(candidates)
    if not cands:
        raise WindowConfigError("candidates must be a non-empty list of window lengths")
    for i, c in enumerate(cands):
        _check_positive_int(f"candidates[{i}]", c)
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


def cosines_of(result: Any) -> dict[int, float]:
    """Accept an ``AuditResult``-like object or a plain mapping of candidate -> cosine."""
    raw = result.cosines if hasattr(result, "cosines") else result
    return {int(k): float(v) for k, v in dict(raw).items()}


class FullRollout:
    """Standard OPD: every step generates up to the full horizon."""

    name = "full"

    def __init__(self, max_len: int) -> None:
        self.max_len = _check_positive_int("max_len", max_len)

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

    name = "fixed"

    def __init__(self, w: int, max_len: int | None = None) -> None:
        self.w = _check_positive_int("window", w)
        if max_len is not None and w > max_len:
            raise WindowConfigError(f"window={w} must be <= max_len={max_len}")

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

    name = "linear"

    def __init__(self, start: int, step: int, max_len: int) -> None:
        self.start = _check_positive_int("start", start)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise WindowConfigError(f"step must be an integer >= 0, got {step!r}")
        self.step_size = step
        self.max_len = _check_positive_int("max_len", max_len)
        if start > max_len:
            raise WindowConfigError(f"start={start} must be <= max_len={max_len}")

    def window(self, step: int) -> int:
        return min(self.max_len, self.start + self.step_size * max(0, step))

    def observe(self, result: Any) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "start": self.start, "step": self.step_size, "max_len": self.max_len}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.start, self.step_size, self.max_len = int(state["start"]), int(state["step"]), int(state["max_len"])


class AdaptiveWindow:
    """ADWIN: the next window is the shortest candidate whose prefix-full cosine clears ``threshold``.

    If no candidate clears it, the window is the full horizon ``max_len``. Before the first audit the
    window is ``initial``; the default is the largest candidate, the conservative choice: the run starts
    close to full-rollout OPD and only shrinks once a probe batch has shown that a shorter prefix keeps
    the update direction (see docs/decisions.md).
    """

    name = "adwin"

    def __init__(
        self,
        candidates: Sequence[int],
        threshold: float = 0.7,
        max_len: int = 8192,
        initial: int | None = None,
    ) -> None:
        self.max_len = _check_positive_int("max_len", max_len)
        self.candidates = validate_candidates(candidates, self.max_len)
        self.threshold = validate_threshold(threshold)
        if initial is None:
            initial = self.candidates[-1]
        self.initial = _check_positive_int("initial", initial)
        if self.initial > self.max_len:
            raise WindowConfigError(f"initial={initial} must be <= max_len={max_len}")
        self.current = self.initial
        self.decisions = 0

    def window(self, step: int) -> int:
        return self.current

    def decide(self, cosines: Mapping[int, float]) -> int:
        """Shortest candidate with ``cos >= threshold``; the full horizon when none clears it."""
        admissible = [c for c in self.candidates if c in cosines and cosines[c] >= self.threshold]
        return min(admissible) if admissible else self.max_len

    def observe(self, result: Any) -> bool:
        cos = cosines_of(result)
        unknown = sorted(set(cos) - set(self.candidates) - {self.max_len})
        if unknown:
            raise WindowConfigError(f"audit has cosines for unknown candidates {unknown}; known: {self.candidates}")
        bad = [c for c, v in cos.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"audit cosines are not finite for candidates {sorted(bad)}")
        previous, self.current = self.current, self.decide(cos)
        self.decisions += 1
        return self.current != previous

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "candidates": list(self.candidates),
            "threshold": self.threshold,
            "max_len": self.max_len,
            "initial": self.initial,
            "current": self.current,
            "decisions": self.decisions,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.candidates = validate_candidates(state["candidates"], int(state["max_len"]))
        self.threshold = validate_threshold(state["threshold"])
        self.max_len = int(state["max_len"])
        self.initial = int(state["initial"])
        self.current = int(state["current"])
        self.decisions = int(state.get("decisions", 0))


class SurpriseWindow:
    """Teacher-surprise horizon: a gradient-free adaptive baseline (no probes, no audits).

    Each step the trainer reports ``rollout/surprise_horizon`` (``adwin.policies.surprise``: ``scale`` x the
    ``quantile`` over samples of the response position of the ``rank``-th token whose teacher logprob is
    below ``threshold``). The next window is an EMA of those proposals, ``(1 - ema) * old + ema * new``,
    rounded and clipped to ``[min_window, max_window]``. Before the first observation the window is
    ``initial`` (default: the full horizon, so the first observations see whole rollouts).

    Observations arrive as step metrics (``observe_step``), once per step: a repeated or older step is
    ignored, so a step reported twice (in parts, or retried) cannot move the EMA twice.
    """

    name = "surprise"
    METRIC = "rollout/surprise_horizon"

    def __init__(
        self,
        max_len: int,
        *,
        min_window: int = 1,
        max_window: int | None = None,
        ema: float = 0.3,
        initial: int | None = None,
    ) -> None:
        self.max_len = _check_positive_int("max_len", max_len)
        self.min_window = _check_positive_int("min", min_window)
        self.max_window = _check_positive_int("max", max_window if max_window is not None else max_len)
        if self.max_window > self.max_len:
            raise WindowConfigError(f"max={self.max_window} must be <= max_len={self.max_len}")
        if self.min_window > self.max_window:
            raise WindowConfigError(f"min={self.min_window} must be <= max={self.max_window}")
        if isinstance(ema, bool) or not isinstance(ema, (int, float)) or not 0.0 < ema <= 1.0:
            raise WindowConfigError(f"ema must be in (0, 1] (the weight of the newest observation), got {ema!r}")
        self.ema = float(ema)
        self.initial = _check_positive_int("initial", initial if initial is not None else self.max_window)
        if not self.min_window <= self.initial <= self.max_window:
            raise WindowConfigError(f"initial={self.initial} must be in [min={self.min_window}, max={self.max_window}]")
        self.level = float(self.initial)  # the EMA, before rounding and clipping
        self.last_step = -1
        self.observations = 0

    def window(self, step: int) -> int:
        return min(self.max_window, max(self.min_window, int(round(self.level))))

    def observe(self, result: Any) -> bool:
        return False  # audits do not steer this policy

    def observe_step(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Fold step ``step``'s surprise horizon into the EMA; True when the window changed."""
        value = metrics.get(self.METRIC)
        if value is None or step <= self.last_step:
            return False
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{self.METRIC} must be finite and >= 0, got {value}")
        before = self.window(step)
        self.level = (1.0 - self.ema) * self.level + self.ema * value
        self.last_step, self.observations = step, self.observations + 1
        return self.window(step + 1) != before

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_len": self.max_len,
            "min": self.min_window,
            "max": self.max_window,
            "ema": self.ema,
            "initial": self.initial,
            "level": self.level,
            "last_step": self.last_step,
            "observations": self.observations,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.max_len, self.min_window, self.max_window = int(state["max_len"]), int(state["min"]), int(state["max"])
        self.ema, self.initial = float(state["ema"]), int(state["initial"])
        self.level, self.last_step = float(state["level"]), int(state["last_step"])
        self.observations = int(state.get("observations", 0))


def parse_policy_spec(spec: str) -> dict[str, Any]:
    """Parse the CLI shorthand ``adwin``, ``full``, ``surprise``, ``fixed:W``, ``linear:START:STEP``."""
    name, _, rest = spec.partition(":")
    args = [a for a in rest.split(":") if a] if rest else []
    try:
        if name in ("adwin", "full", "surprise") and not args:
            return {"name": name}
        if name == "fixed" and len(args) == 1:
            return {"name": "fixed", "window": int(args[0])}
        if name == "linear" and len(args) == 2:
            return {"name": "linear", "start": int(args[0]), "step": int(args[1])}
    except ValueError:
        pass
    raise WindowConfigError(
        f"window_policy {spec!r} is not one of: adwin, full, surprise, fixed:W, linear:START:STEP (integers)"
    )


def build_policy(
    name: str,
    *,
    max_len: int,
    candidates: Sequence[int] = (),
    threshold: float = 0.7,
    initial: int | None = None,
    window: int | None = None,
    start: int | None = None,
    step: int | None = None,
    options: Mapping[str, float] | None = None,
) -> WindowPolicy:
    """Build a policy from plain fields (what configs and the controller's register call carry).

    ``options`` holds policy-specific numbers; ``surprise`` reads ``min`` (default: the smallest
    candidate, else 1), ``max`` (default ``max_len``) and ``ema`` (default 0.3) and ignores the rest
    (the trainer's measurement parameters travel along for the record).
    """
    if name == "adwin":
        return AdaptiveWindow(candidates, threshold=threshold, max_len=max_len, initial=initial)
    if name == "full":
        return FullRollout(max_len)
    if name == "fixed":
        if window is None:
            raise WindowConfigError("window is required for the fixed policy")
        return FixedWindow(window, max_len=max_len)
    if name == "linear":
        if start is None or step is None:
            raise WindowConfigError("start and step are required for the linear policy")
        return LinearWindow(start, step, max_len)
    if name == "surprise":
        opts = dict(options or {})
        lo = opts.get("min")
        hi = opts.get("max")
        return SurpriseWindow(
            max_len,
            min_window=int(lo) if lo is not None else (int(candidates[0]) if candidates else 1),
            max_window=int(hi) if hi is not None else None,
            ema=float(opts.get("ema", 0.3)),
            initial=initial,
        )
    raise WindowConfigError(f"policy name must be one of adwin, full, fixed, linear, surprise; got {name!r}")


def policy_from_state(state: Mapping[str, Any]) -> WindowPolicy:
    """Rebuild a policy from its ``state_dict()``."""
    name = state.get("name")
    if name == "adwin":
        policy: WindowPolicy = AdaptiveWindow(state["candidates"], state["threshold"], int(state["max_len"]), int(state["initial"]))
    elif name == "full":
        policy = FullRollout(int(state["max_len"]))
    elif name == "fixed":
        policy = FixedWindow(int(state["w"]))
    elif name == "linear":
        policy = LinearWindow(int(state["start"]), int(state["step"]), int(state["max_len"]))
    elif name == "surprise":
        policy = SurpriseWindow(int(state["max_len"]), min_window=int(state["min"]), max_window=int(state["max"]),
                                ema=float(state["ema"]), initial=int(state["initial"]))
    else:
        raise WindowConfigError(f"unknown policy name in state: {name!r}")
    policy.load_state_dict(state)
    return policy
