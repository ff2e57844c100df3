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
    validate_candidates,
    validate_threshold,
)


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
    ) -> None:
        self.max_len = check_positive_int("max_len", max_len)
        self.confidence = bool(confidence)
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
                   confidence=bool(f.options.get("confidence", 0.0)))

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> AdaptiveWindow:
        policy = cls(state["candidates"], state["threshold"], int(state["max_len"]), int(state["initial"]),
                     confidence=bool(state.get("confidence", False)))
        policy.load_state_dict(state)
        return policy

    def window(self, step: int) -> int:
        return self.current

    def decide(self, cosines: Mapping[int, float]) -> int:
        """Shortest candidate with ``cos >= threshold``; the full horizon when none clears it."""
        admissible = [c for c in self.candidates if c in cosines and cosines[c] >= self.threshold]
        return min(admissible) if admissible else self.max_len

    def decide_on_evidence(self, intervals: Mapping[int, tuple[float, float]]) -> int:
        """The ``confidence`` rule (class docstring): move only to or away from an interval clear of the threshold."""
        sure = [c for c in self.candidates if c in intervals and intervals[c][0] >= self.threshold]
        target = min(sure) if sure else self.max_len
        if target < self.current:
            return target
        here = intervals.get(self.current)
        return target if here is not None and here[1] < self.threshold else self.current

    def observe(self, result: Any) -> bool:
        cos = cosines_of(result)
        unknown = sorted(set(cos) - set(self.candidates) - {self.max_len})
        if unknown:
            raise WindowConfigError(f"audit has cosines for unknown candidates {unknown}; known: {self.candidates}")
        bad = [c for c, v in cos.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"audit cosines are not finite for candidates {sorted(bad)}")
        if self.confidence:
            ci = intervals_of(result)
            missing = sorted(set(cos) - set(ci))
            if missing:
                raise ValueError(f"window.confidence needs a cosine interval per candidate (audit.ci_level); "
                                 f"the audit has none for {missing}")
            nxt = self.decide_on_evidence(ci)
        else:
            nxt = self.decide(cos)
        previous, self.current = self.current, nxt
        self.decisions += 1
        self.changes += self.current != previous
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
            "changes": self.changes,
            "confidence": self.confidence,
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
