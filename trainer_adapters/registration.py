"""How every adapter joins a run: register (or resume) it, check it can audit, survive a dying controller.

* ``register`` sends a ``RunIn`` under an idempotency key derived from the run id *and* the spec, so a
  retried request counts once while a changed spec under a reused run id reaches the controller's
  check and is refused with ``RunConflict`` (409), as docs/api.md promises. ``resume=True`` continues
  the registered run instead (its stored spec wins; the differing fields are logged).
* ``check_feasible`` refuses, before any training, a run whose probes can never form an audit batch
  (``adwin.controller.feasibility``), also counting the rollouts the host trainer makes per step.
* ``resilient`` wraps the controller in ``ResilientController`` (degraded mode) unless it already is.
"""

from __future__ import annotations

import hashlib
import json
import logging

from adwin.controller.api import ControllerAPI, RunConflict
from adwin.controller.feasibility import spec_infeasibility
from adwin.controller.schemas import RunIn, RunOut
from adwin.policies.registry import is_audited
from adwin.runtime.resilient_controller import ResilientController

logger = logging.getLogger(__name__)


def resilient(controller: ControllerAPI, enabled: bool = True) -> ControllerAPI:
    """``controller`` in degraded mode (train on the last window while it is away); as is when disabled."""
    if not enabled or isinstance(controller, ResilientController):
        return controller
    return ResilientController(controller)


def spec_key(spec: RunIn) -> str:
    """Idempotency key of a registration: the same run id with another spec gets another key."""
    body = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return f"register:{spec.run_id}:{hashlib.blake2b(body.encode(), digest_size=8).hexdigest()}"


def register(controller: ControllerAPI, run: str | RunIn, *, resume: bool = False) -> RunOut:
    """The run a client works on: ``run`` is a registered run id, or a spec to register (or resume)."""
    if isinstance(run, str):
        return controller.get_run(run)
    key = None if run.run_id is None else spec_key(run)
    try:
        return controller.register_run(run, idempotency_key=key)
    except RunConflict as e:
        if not resume or run.run_id is None:
            raise RunConflict(f"{e}; pass resume=True to continue the registered run with its stored spec, "
                              "or use a new run_id") from e
    out = controller.get_run(run.run_id)
    wanted = run.model_dump(mode="json")
    changed = sorted(k for k, v in wanted.items() if out.spec.get(k) != v)
    logger.warning("run %s: resume=True continues the registered run; its stored spec wins over the new one "
                   "in %s", run.run_id, ", ".join(changed))
    return out


def check_feasible(out: RunOut, *, rollouts_per_step: int | None = None) -> None:
    """Raise ``ValueError`` (before training) when the run's probes can never form an audit batch."""
    problem = spec_infeasibility(out.spec, audited=is_audited(out.spec["policy"]["name"]),
                                 rollouts_per_step=rollouts_per_step)
    if problem:
        raise ValueError(f"run {out.run_id} can never audit: {problem}")

