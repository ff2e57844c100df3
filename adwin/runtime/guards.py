"""Runtime guards of the training loop: non-finite steps and audits.

* A step whose loss or gradient norm is NaN/Inf is skipped (``adwin.loop.learner.learner_step`` does not apply it) and
  counted (``adwin.loop.learner.FaultCounter``, ``optim/skipped_steps``). ``optim.max_bad_steps`` consecutive skipped
  steps stop the run with ``NumericalFault`` after a checkpoint of the last good state (skipped steps never touch the weights).
* An audit with NaN/Inf cosines (or Gram) is refused, by the controller (``NonFiniteAudit``, 422, logged as a
  ``fallback`` decision) or already by the audit math (``NonFiniteAuditError``); the probe client decides by type
  (``is_non_finite_audit``), counts it (``audit/rejected``) and the window stays. Any other refusal propagates.
* A teacher server that still fails after the client's retries stops the run with ``TeacherOutage`` after a
  checkpoint of the step's start (``adwin.loop.outage``).
* Probes that a controller outage left past the staleness limit are the probe client's business
  (``adwin.probes.client.ProbeClient.drop_overstale``, ``probe/dropped_stale``).
"""

from __future__ import annotations

import logging
import math

from adwin.audit.errors import is_non_finite_audit  # noqa: F401  (the refused-audit test lives with the error)

log = logging.getLogger(__name__)


class NumericalFault(RuntimeError):
    """Too many consecutive non-finite steps; the message names the checkpoint of the last good state."""


class TeacherOutage(RuntimeError):
    """A teacher server stopped answering; the message names it and the checkpoint to resume from
    (``adwin.loop.outage``)."""


def is_finite(*values: float) -> bool:
    return all(math.isfinite(float(v)) for v in values)
