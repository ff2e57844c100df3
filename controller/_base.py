"""Shared state of the in-process controller: the run cache, the SQLite store and the write path.

``ControllerBase`` owns the lock, the store and ``_write`` (one transaction per acknowledged write,
idempotency keys, cache updates after COMMIT); the probe scheduler, the audit aggregator and the
``Controller`` itself build on it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adwin.controller.api import InvalidInput, UnknownRun
from adwin.controller.schemas import RunOut
from adwin.controller.sketch_files import SketchFiles
from adwin.controller.store import Store, loads
from adwin.policies.base import WindowPolicy
from adwin.policies.registry import policy_from_state

logger = logging.getLogger(__name__)



PROBE_STATES = ("active", "complete", "batched", "audited", "dropped", "expired")


@dataclass
class _Run:
    """Cached state of one run; replaced field by field only after a commit."""

    run_id: str
    name: str
    created_at: float
    spec: dict[str, Any]
    policy: WindowPolicy
    reason: str
    audit_id: int | None = None
    cosines: dict[int, float] | None = None
    last_step: int = 0
    revision: int = 0  # bumped on every acknowledged write; the SSE stream polls it
    candidates: list[int] = field(default_factory=list)

    def out(self) -> RunOut:
        return RunOut(
            run_id=self.run_id,
            name=self.name,
            created_at=self.created_at,
            policy_state=self.policy.state_dict(),
            spec=self.spec,
        )


def _int_keys(d: dict | None) -> dict[int, float] | None:
    return None if d is None else {int(k): float(v) for k, v in d.items()}


def _check_finite(name: str, values: dict | list | None) -> str | None:
    """Name of the first non-finite entry, or None."""
    if values is None:
        return None
    items = values.items() if isinstance(values, dict) else enumerate(values)
    for k, v in items:
        if isinstance(v, list):
            bad = _check_finite(f"{name}[{k}]", v)
            if bad:
                return bad
        elif not math.isfinite(v):
            return f"{name}[{k}]={v}"
    return None


class ControllerBase:
    """The lock, the store, the run cache and the transactional write path shared by the mixins."""

    def __init__(self, db: str = ":memory:") -> None:
        self._lock = threading.RLock()
        self._store = Store(db)
        # pending sketch ranks of a file database live in files next to it (see sketch_files.py)
        self._sketch_files = None if db == ":memory:" else SketchFiles(db)
        self._runs: dict[str, _Run] = {}
        self._pending_sketches: dict[tuple[str, int], dict[int, np.ndarray]] = {}  # (run, audit) -> rank -> (K+1, D)
        self._load()

    # --- lifecycle -------------------------------------------------------------------------------

    def _load(self) -> None:
        """Rebuild the run cache from the database (a re-opened controller serves the same runs)."""
        for row in self._store.all("SELECT * FROM runs ORDER BY created_at"):
            spec = loads(row["spec"])
            last = self._store.one(
                "SELECT * FROM decisions WHERE run_id=? ORDER BY seq DESC LIMIT 1", (row["run_id"],)
            )
            run = _Run(
                run_id=row["run_id"],
                name=row["name"],
                created_at=row["created_at"],
                spec=spec,
                policy=policy_from_state(loads(row["policy_state"])),
                reason=last["reason"] if last else "initial",
                audit_id=last["audit_id"] if last else None,
                cosines=_int_keys(loads(last["cosines"])) if last else None,
                last_step=row["last_step"],
                candidates=list(spec["policy"]["candidates"]),
            )
            self._runs[run.run_id] = run
        if self._runs:
            logger.info("controller: loaded %d run(s) from %s", len(self._runs), self._store.path)

    def close(self) -> None:
        with self._lock:
            self._store.close()

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise UnknownRun(f"unknown run {run_id!r}")
        return run

    def _write(
        self,
        scope: str,
        key: str | None,
        op: str,
        apply: Callable[[], tuple[Any, Callable[[], None] | None]],
    ) -> Any:
        """Run ``apply`` in one transaction; store its JSON answer under ``(scope, key)``.

        ``apply`` returns ``(answer_json, on_commit)``; ``on_commit`` updates the cache after COMMIT.
        A repeated key returns the stored answer without applying anything.
        """
        with self._lock:
            if key is not None:
                hit = self._store.idem_get(scope, key)
                if hit is not None:
                    if hit[0] != op:
                        raise InvalidInput(f"Idempotency-Key {key!r} was already used for a {hit[0]} request")
                    return hit[1]
            with self._store.transaction():
                answer, on_commit = apply()
                if key is not None:
                    self._store.idem_put(scope, key, op, answer)
            if on_commit is not None:
                on_commit()
            if scope in self._runs:
                self._runs[scope].revision += 1
            return answer

    def _touch_step(self, run: _Run, step: int) -> None:
        """Persist the newest step seen; the cache moves too (monotone, so a rollback is harmless)."""
        if step >= run.last_step:
            run.last_step = step
            self._store.execute("UPDATE runs SET last_step=? WHERE run_id=?", (step, run.run_id))

