"""Runtime guards of the training loop: non-finite steps and probes left over-stale by a controller outage.

* A step whose loss or gradient norm is NaN/Inf is skipped (``adwin.loop.step.optimize`` does not apply it) and
  counted (``optim/skipped_steps``). ``optim.max_bad_steps`` consecutive skipped steps stop the run with
  ``NumericalFault`` after a checkpoint of the last good state (skipped steps never touch the weights).
* An audit with NaN/Inf cosines (or Gram) is refused, by the controller (422, logged as a ``fallback``
  decision) or already by the audit math; the trainer counts it (``audit/rejected``) and the window stays.
* After a controller outage, active probes may have missed extension rounds and aged past the staleness
  limit S (normally the controller forces completion at exactly S). They are dropped and reported as
  dropped (``probe/dropped_stale``) rather than audited with over-stale tokens.
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)


class NumericalFault(RuntimeError):
    """Too many consecutive non-finite steps; the message names the checkpoint of the last good state."""


def is_finite(*values: float) -> bool:
    return all(math.isfinite(float(v)) for v in values)


def is_non_finite_audit(e: Exception) -> bool:
    """An audit refused for NaN/Inf: by the controller (``InvalidInput``, 422) or by the audit math itself."""
    from adwin.controller.api import InvalidInput

    return isinstance(e, InvalidInput) or (isinstance(e, ValueError) and "non-finite" in str(e))


class FaultCounter:
    """Skipped (non-finite) steps: total and consecutive; ``exhausted`` once ``limit`` in a row."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.consecutive = 0

    def record(self, skipped: bool) -> dict[str, float]:
        if skipped:
            self.total += 1
            self.consecutive += 1
        else:
            self.consecutive = 0
        return {"optim/skipped_steps": float(self.total), "optim/consecutive_skipped": float(self.consecutive)}

    @property
    def exhausted(self) -> bool:
        return self.consecutive >= self.limit

    def state_dict(self) -> dict[str, int]:
        return {"total": self.total, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total, self.consecutive = int(state["total"]), int(state["consecutive"])


def drop_overstale_probes(controller: Any, run_id: str, pool: Any, version: int, limit: int) -> dict[str, float]:
    """Drop unfinished probes whose staleness already exceeds ``limit`` (rounds missed during an outage)."""
    from adwin.controller.api import ControllerError
    from adwin.controller.schemas import ProbeReportIn

    stale = [p for p in pool.snapshot() if not p.finished and p.staleness(version) > limit]
    if not stale:
        return {}
    for p in pool.pop([p.probe_id for p in stale]):
        try:
            controller.report_probe(run_id, ProbeReportIn(probe_id=p.probe_id, step=version, tokens_added=0,
                                                          version=version, dropped=True),
                                    idempotency_key=f"{run_id}-drop-{p.probe_id}")
        except ControllerError as e:  # e.g. the controller no longer holds it as active: nothing to undo
            log.warning("probe %s: drop report refused (%s)", p.probe_id, e)
    log.warning("dropped %d probe(s) over the staleness limit S=%d at version %d (missed rounds, e.g. a "
                "controller outage)", len(stale), limit, version)
    return {"probe/dropped_stale": float(len(stale))}
