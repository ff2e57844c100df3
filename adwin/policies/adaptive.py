"""ADWIN's policy: the shortest candidate window whose prefix-full gradient cosine clears the threshold."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from adwin.policies.base import (
    PolicyFields,
    WindowConfigError,
    check_positive_int,
    cosines_of,
    intervals_of,
    noise_floors_of,
    signal_z_of,
    validate_candidates,
    validate_threshold,
)
from adwin.policies.resolution import (
    UNRESOLVED,
    Resolution,
    check_criteria,
    evidence_of,
    fallback_window,
    judge,
    unresolved_option,
)

# window.grow_to, in the order the controller's float options encode them (0.0, 1.0)
GROW_TO: tuple[str, ...] = ("sure", "point")


def _grow_to_option(value: float) -> str:
    """The controller carries ``grow_to`` as a float option: its index in ``GROW_TO``."""
    if value not in (0.0, 1.0):
        raise WindowConfigError(f"option grow_to must be 0 (sure) or 1 (point), got {value}")
    return GROW_TO[int(value)]


class AdaptiveWindow:
    """ADWIN: the next window is the shortest candidate whose prefix-full cosine clears ``threshold``.

    If no candidate clears it, the window is the full horizon ``max_len``. Before the first audit the
    window is ``initial``; the default is the largest candidate, the conservative choice: the run starts
    close to full-rollout OPD and only shrinks once a probe batch has shown that a shorter prefix keeps
    the update direction (see docs/decisions.md).

    ``confidence`` (``window.confidence``): decide from each candidate's cosine interval (``cosine_ci`` of the
    audit, ``audit.ci_level``) instead of its point value, and change the window only on evidence: shrink
    to the shortest candidate whose interval lies entirely above the threshold; grow only when the current
    window's interval lies entirely below it (to the shortest candidate entirely above, else the full
    horizon); otherwise keep the window. An interval that straddles the threshold never moves it.

    ``noise_hold`` (``window.noise_hold``, with ``confidence``): an interval that contains the candidate's
    pure-noise reading (the audit's ``noise_floor``: what its estimator reads when the samples share no signal)
    carries no information about that candidate, so it neither shrinks the window to it nor grows the window
    away from it. ``grow_to`` (``window.grow_to``): where a growth goes, ``sure`` the shortest longer candidate
    whose interval lies above the threshold (else the horizon), ``point`` the shortest longer candidate whose
    point cosine clears it (else the horizon). With ``noise_hold`` an audit whose full-gradient signal ``z``
    (``adwin.audit.truth.signal_z``) is below ``signal_z`` (``window.signal_z``) moves nothing: its samples show
    no shared direction to align with. docs/decisions.md, "The shortest admissible window".

    ``unresolved`` (``window.unresolved``), ``signal_z`` and ``resolve_samples`` (``window.resolve_samples``): an
    audit whose evidence cannot resolve the full gradient's signal (its z below ``signal_z``, or its samples below
    ``resolve_samples`` times the noise scale it measured) is marked (``resolution``) and the window follows the
    fallback instead of the rule (``adwin.policies.resolution``). The default here, ``decide``, is the paper's rule
    (the audit only marked); a run's config defaults to ``hold`` (``window.unresolved``).
    """

    name: ClassVar[str] = "adwin"
    audited: ClassVar[bool] = True
    spec_args: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        candidates: Sequence[int],
        threshold: float = 0.7,
        max_len: int = 8192,
        initial: int | None = None,
        confidence: bool = False,
        noise_hold: bool = False,
        grow_to: str = "sure",
        signal_z: float = 3.0,
        unresolved: str = "decide",
        resolve_samples: float = 1.0,
    ) -> None:
        self.max_len = check_positive_int("max_len", max_len)
        self.confidence = bool(confidence)
        self.noise_hold = bool(noise_hold)
        if grow_to not in GROW_TO:
            raise WindowConfigError(f"grow_to must be one of {GROW_TO}, got {grow_to!r}")
        self.grow_to = grow_to
        check_criteria(unresolved, signal_z, resolve_samples)
        self.signal_z = float(signal_z)
        self.unresolved = unresolved
        self.resolve_samples = float(resolve_samples)
        self.resolution = Resolution(None)  # the last audit's (the controller marks its decision with it)
        self.changes = 0
        self.candidates = validate_candidates(candidates, self.max_len)
        self.threshold = validate_threshold(threshold)
        if initial is None:
            initial = self.candidates[-1]
        self.initial = check_positive_int("initial", initial)
        if self.initial > self.max_len:
            raise WindowConfigError(f"initial={initial} must be <= max_len={max_len}")
        self.current = self.initial
        self.decisions = 0

    @classmethod
    def from_fields(cls, f: PolicyFields) -> AdaptiveWindow:
        return cls(f.candidates, threshold=f.threshold, max_len=f.max_len, initial=f.initial,
                   confidence=bool(f.options.get("confidence", 0.0)),
                   noise_hold=bool(f.options.get("noise_hold", 0.0)),
                   grow_to=_grow_to_option(f.options.get("grow_to", 0.0)),
                   signal_z=float(f.options.get("signal_z", 3.0)),
                   unresolved=unresolved_option(f.options.get("unresolved", float(UNRESOLVED.index("decide")))),
                   resolve_samples=float(f.options.get("resolve_samples", 1.0)))

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> AdaptiveWindow:
        policy = cls(state["candidates"], state["threshold"], int(state["max_len"]), int(state["initial"]),
                     confidence=bool(state.get("confidence", False)), noise_hold=bool(state.get("noise_hold", False)),
                     grow_to=str(state.get("grow_to", "sure")), signal_z=float(state.get("signal_z", 3.0)),
                     unresolved=str(state.get("unresolved", "decide")),
                     resolve_samples=float(state.get("resolve_samples", 1.0)))
        policy.load_state_dict(state)
        return policy

    def window(self, step: int) -> int:
        return self.current

    def decide(self, cosines: Mapping[int, float]) -> int:
        """Shortest candidate with ``cos >= threshold``; the full horizon when none clears it."""
        admissible = [c for c in self.candidates if c in cosines and cosines[c] >= self.threshold]
        return min(admissible) if admissible else self.max_len

    def decide_on_evidence(self, intervals: Mapping[int, tuple[float, float]],
                           cosines: Mapping[int, float] | None = None,
                           noise: Mapping[int, float] | None = None, z: float | None = None) -> int:
        """The ``confidence`` rule (class docstring): move only to or away from an interval clear of the threshold
        (and, with ``noise_hold``, clear of the candidate's pure-noise reading ``noise``)."""
        if self.noise_hold and z is not None and z < self.signal_z:
            return self.current  # no shared full-gradient direction in the samples: nothing to decide on

        def informative(c: int) -> bool:
            if not self.noise_hold or noise is None or c not in noise:
                return True
            lo, hi = intervals[c]
            return not lo <= noise[c] <= hi

        sure = [c for c in self.candidates if c in intervals and intervals[c][0] >= self.threshold and informative(c)]
        if sure and min(sure) < self.current:
            return min(sure)
        here = intervals.get(self.current)
        if here is None or here[1] >= self.threshold or not informative(self.current):
            return self.current
        if self.grow_to == "point" and cosines is not None:
            longer = [c for c in self.candidates if c > self.current and cosines.get(c, float("-inf")) >= self.threshold
                      and (c not in intervals or informative(c))]
        else:
            longer = [c for c in sure if c > self.current]
        return min(longer) if longer else self.max_len

    def observe(self, result: Any) -> bool:
        cos = cosines_of(result)
        unknown = sorted(set(cos) - set(self.candidates) - {self.max_len})
        if unknown:
            raise WindowConfigError(f"audit has cosines for unknown candidates {unknown}; known: {self.candidates}")
        bad = [c for c, v in cos.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"audit cosines are not finite for candidates {sorted(bad)}")
        self.resolution = judge(*evidence_of(result), min_z=self.signal_z, resolve_samples=self.resolve_samples)
        nxt = self._fallback(result) if self.resolution.resolved is False else None
        if nxt is None:
            nxt = self._rule(result, cos)
        previous, self.current = self.current, nxt
        self.decisions += 1
        self.changes += self.current != previous
        return self.current != previous

    def _fallback(self, result: Any) -> int | None:
        """Where an unresolved audit sends the window (``window.unresolved``); None: the rule decides."""
        return fallback_window(self.unresolved, current=self.current, max_len=self.max_len,
                               candidates=self.candidates, threshold=self.threshold, noise=noise_floors_of(result))

    def _rule(self, result: Any, cos: dict[int, float]) -> int:
        """The configured rule on the audit's cosines: the paper's point rule, or ``confidence``'s."""
        if not self.confidence:
            return self.decide(cos)
        ci = intervals_of(result)
        missing = sorted(set(cos) - set(ci))
        if missing:
            raise ValueError(f"window.confidence needs a cosine interval per candidate (audit.ci_level); "
                             f"the audit has none for {missing}")
        return self.decide_on_evidence(ci, cos, noise_floors_of(result), signal_z_of(result))

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "candidates": list(self.candidates),
            "threshold": self.threshold,
            "max_len": self.max_len,
            "initial": self.initial,
            "current": self.current,
            "decisions": self.decisions,
            "changes": self.changes,
            "confidence": self.confidence,
            "noise_hold": self.noise_hold,
            "grow_to": self.grow_to,
            "signal_z": self.signal_z,
            "unresolved": self.unresolved,
            "resolve_samples": self.resolve_samples,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.candidates = validate_candidates(state["candidates"], int(state["max_len"]))
        self.threshold = validate_threshold(state["threshold"])
        self.max_len = int(state["max_len"])
        self.initial = int(state["initial"])
        self.current = int(state["current"])
        self.decisions = int(state.get("decisions", 0))
        self.changes = int(state.get("changes", 0))
        self.confidence = bool(state.get("confidence", False))
        self.noise_hold = bool(state.get("noise_hold", False))
        self.grow_to = str(state.get("grow_to", "sure"))
        self.signal_z = float(state.get("signal_z", 3.0))
        self.unresolved = str(state.get("unresolved", "decide"))
        self.resolve_samples = float(state.get("resolve_samples", 1.0))
