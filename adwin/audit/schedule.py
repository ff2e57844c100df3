"""When to skip an audit: ``audit.every`` and the stability rule (``audit.skip_margin``).

Math layer, no torch. An audit is only worth its cost when its cosines could change the window. Two rules,
both off by default (every ready probe batch is audited, as the paper does):

- ``every = k``: audit one ready probe batch in k (the others are consumed unaudited).
- ``skip_margin = m > 0``: skip while each of the last ``skip_history`` audits had every candidate's cosine at
  least ``m`` away from the threshold (a decision that no plausible sampling noise flips), but never more than
  ``max_skips`` in a row, so drifting weights are re-checked.

With the decision budget (``audit.budget``, ``adwin/audit/budget.py``) the budget decides how many probes
exist and how ready batches are pooled, and ``every`` must stay 1 (the config refuses both); ``skip_margin``
still applies to each decision the budget allows.

The schedule counts what it saved; ``adwin bench audit-agreement --replay`` replays a run's audits through
it and counts the decisions that would have differed (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AuditSchedule:
    """Decides, per ready probe batch, whether to audit it. ``record`` each audit's cosines."""

    threshold: float
    every: int = 1
    skip_margin: float = 0.0
    skip_history: int = 2
    max_skips: int = 4
    ready: int = 0  # probe batches offered
    audited: int = 0
    skipped: int = 0
    _run: int = 0  # consecutive skips
    _recent: deque[dict[int, float]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"audit.every must be >= 1, got {self.every}")
        if not 0.0 <= self.skip_margin < 1.0:
            raise ValueError(f"audit.skip_margin must be in [0, 1), got {self.skip_margin}")
        if self.skip_history < 1:
            raise ValueError(f"audit.skip_history must be >= 1, got {self.skip_history}")
        if self.max_skips < 0:
            raise ValueError(f"audit.max_skips must be >= 0, got {self.max_skips}")
        self._recent = deque(self._recent, maxlen=self.skip_history)

    def should_audit(self) -> bool:
        """Call once per ready probe batch; False means consume it without an audit (counted as saved)."""
        self.ready += 1
        skip = (self.ready - 1) % self.every != 0 or (self._stable() and self._run < self.max_skips)
        if skip:
            self.skipped += 1
            self._run += 1
        else:
            self._run = 0
        return not skip

    def record(self, cosines: Mapping[int, float]) -> None:
        """The cosines of an audit that ran."""
        self.audited += 1
        self._recent.append({int(c): float(v) for c, v in cosines.items()})

    def _stable(self) -> bool:
        if self.skip_margin <= 0.0 or len(self._recent) < self.skip_history:
            return False
        return all(abs(v - self.threshold) >= self.skip_margin for cos in self._recent for v in cos.values())

    def metrics(self) -> dict[str, float]:
        return {"audit/ready": float(self.ready), "audit/audited": float(self.audited),
                "audit/skipped": float(self.skipped)}

    def state_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "audited": self.audited, "skipped": self.skipped, "run": self._run,
                "recent": [{str(c): v for c, v in cos.items()} for cos in self._recent]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ready, self.audited, self.skipped = int(state["ready"]), int(state["audited"]), int(state["skipped"])
        self._run = int(state["run"])
        self._recent = deque(({int(c): float(v) for c, v in cos.items()} for cos in state["recent"]),
                             maxlen=self.skip_history)
