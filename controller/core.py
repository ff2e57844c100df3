"""The in-process ``Controller``: window policy + probe scheduler + audit aggregation + telemetry.

Thread-safe: one re-entrant lock serializes every call (the SQLite connection is shared). Writes are
single SQLite transactions; the in-memory run cache (policy, current window) is swapped only after the
transaction commits, so a failed write leaves both the database and the cache as they were. The hot
path, ``get_window``, reads the cache only and never touches SQLite.

Semantics (see also ``adwin.controller.api``):

* Probes are chosen from the offered unfinished prefixes: at most ``offers_per_step`` accepted per
  step and never more than ``max_active_probes`` in state ``active``; the rest are declined and
  counted. Accepted probes join the submission-order queue.
* ``next_probe_batch`` is a windowed FIFO: a complete probe may be taken only while it is among the
  first ``P + lookahead`` non-dropped, not-yet-batched probes in submission order, so short probes
  cannot overtake long ones by more than ``lookahead`` places (*Stabilizing and Scaling Async RL Training*).
* ``cosines`` and ``gram`` audits are the whole batch's (already reduced over ranks) and decide at
  once; ``sketch`` audits arrive one per rank and decide once all ``world_size`` ranks are in (the
  sketches are linear in the gradient, so their sum is the sketch of the batch gradient).
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adwin.controller.api import InvalidInput, RunConflict
from adwin.controller.audits import AuditAggregator
from adwin.controller.feasibility import spec_infeasibility
from adwin.controller.scheduler import ProbeScheduler
from adwin.controller.schemas import MAX_INT, RunIn, RunOut, StepMetricsIn, TelemetryOut, WindowOut
from adwin.controller.state import PROBE_STATES, RunState, check_finite
from adwin.controller.store import dumps, loads
from adwin.policies.base import StepObserver, WindowConfigError, validate_candidates
from adwin.policies.registry import build_policy, policy_from_state

logger = logging.getLogger(__name__)


class Controller(ProbeScheduler, AuditAggregator):
    """In-process implementation of ``ControllerAPI``, backed by SQLite (``":memory:"`` by default).

    Runs, windows, step metrics and telemetry live here; probe scheduling in ``ProbeScheduler``
    (``scheduler.py``), audit aggregation in ``AuditAggregator`` (``audits.py``), the shared store and
    write path in ``ControllerBase`` (``state.py``).
    """

    # --- runs ------------------------------------------------------------------------------------

    def register_run(self, spec: RunIn, *, idempotency_key: str | None = None) -> RunOut:
        p = spec.policy
        try:
            policy = build_policy(p.name, max_len=p.max_len, options=p.options, **p.knobs())
        except WindowConfigError as e:
            raise InvalidInput(f"policy: {e}") from e
        if policy.audited:
            reason = "initial"
        else:
            reason = "schedule"
            if p.candidates:  # audits of schedule runs still compute cosines: keep them well formed
                try:
                    validate_candidates(p.candidates, p.max_len)
                except WindowConfigError as e:
                    raise InvalidInput(f"policy: {e}") from e
        infeasible = spec_infeasibility(spec.model_dump(mode="json"), audited=policy.audited)
        if infeasible:  # an audited run that can never form a probe batch would silently keep one window
            raise InvalidInput(infeasible)

        def apply() -> tuple[Any, Callable[[], None] | None]:
            run_id = spec.run_id or f"run-{uuid.uuid4().hex[:12]}"
            full = spec.model_copy(update={"run_id": run_id}).model_dump(mode="json")
            existing = self._runs.get(run_id)
            if existing is not None:
                if existing.spec != full:
                    raise RunConflict(f"run {run_id!r} is already registered with a different spec")
                return existing.out().model_dump(mode="json"), None
            now = time.time()
            window = policy.window(0)
            self._store.execute(
                "INSERT INTO runs (run_id, name, created_at, spec, policy_state) VALUES (?, ?, ?, ?, ?)",
                (run_id, spec.name, now, dumps(full), dumps(policy.state_dict())),
            )
            self._store.execute(
                "INSERT INTO decisions (run_id, seq, step, window, reason) VALUES (?, 0, 0, ?, ?)",
                (run_id, window, reason),
            )
            run = RunState(run_id, spec.name, now, full, policy, reason, candidates=list(p.candidates))

            def on_commit() -> None:
                self._runs[run_id] = run

            return run.out().model_dump(mode="json"), on_commit

        return RunOut.model_validate(self._write("", idempotency_key, "register_run", apply))

    def get_run(self, run_id: str) -> RunOut:
        with self._lock:
            return self._run(run_id).out()

    def list_runs(self) -> list[RunOut]:
        with self._lock:
            return [r.out() for r in self._runs.values()]

    # --- window (hot path: cache only) -----------------------------------------------------------

    def get_window(self, run_id: str, step: int) -> WindowOut:
        if not 0 <= step <= MAX_INT:
            raise InvalidInput(f"step must be in [0, {MAX_INT}], got {step}")
        with self._lock:
            run = self._run(run_id)  # a read: the run's step moves only through writes
            return WindowOut(
                run_id=run_id,
                step=step,
                window=run.policy.window(step),
                reason=run.reason,  # type: ignore[arg-type]
                audit_id=run.audit_id,
                cosines=run.cosines,
            )

    # --- steps and telemetry ---------------------------------------------------------------------

    def report_step(self, run_id: str, metrics: StepMetricsIn, *, idempotency_key: str | None = None) -> None:
        bad = check_finite("metrics", metrics.metrics)
        if bad:
            raise InvalidInput(f"non-finite {bad}")

        def apply() -> tuple[Any, Callable[[], None] | None]:
            run = self._run(run_id)
            row = self._store.one("SELECT metrics FROM steps WHERE run_id=? AND step=?", (run_id, metrics.step))
            merged = {**(loads(row["metrics"]) if row else {}), **metrics.metrics}  # a step may arrive in parts
            self._store.execute(
                "INSERT INTO steps (run_id, step, metrics) VALUES (?, ?, ?) "
                "ON CONFLICT(run_id, step) DO UPDATE SET metrics=excluded.metrics",
                (run_id, metrics.step, dumps(merged)),
            )
            self._touch_step(run, metrics.step)
            policy = self._observe_step(run, metrics)  # step-metric policies (surprise); None: unchanged

            def on_commit() -> None:
                run.last_step = max(run.last_step, metrics.step)
                if policy is not None:
                    run.policy = policy

            return None, on_commit

        self._write(run_id, idempotency_key, "report_step", apply)

    def _observe_step(self, run: Any, metrics: StepMetricsIn) -> Any:
        """Feed a step-observing policy (``StepObserver``) on a copy; persist its state, log a changed window."""
        if not isinstance(run.policy, StepObserver):
            return None
        policy = policy_from_state(run.policy.state_dict())
        try:
            changed = policy.observe_step(metrics.step, metrics.metrics)
        except ValueError as e:
            raise InvalidInput(f"step {metrics.step}: {e}") from e
        self._store.execute("UPDATE runs SET policy_state=? WHERE run_id=?", (dumps(policy.state_dict()), run.run_id))
        if changed:
            seq = self._store.one("SELECT MAX(seq) AS s FROM decisions WHERE run_id=?", (run.run_id,))["s"] + 1
            self._store.execute("INSERT INTO decisions (run_id, seq, step, window, reason) VALUES (?, ?, ?, ?, 'schedule')",
                                (run.run_id, seq, metrics.step + 1, policy.window(metrics.step + 1)))
        return policy

    def telemetry(self, run_id: str, since_step: int = 0) -> TelemetryOut:
        if not 0 <= since_step <= MAX_INT:
            raise InvalidInput(f"since_step must be in [0, {MAX_INT}], got {since_step}")
        with self._lock:
            self._run(run_id)
            st = self._store
            steps = [
                {"step": r["step"], "metrics": loads(r["metrics"])}
                for r in st.all("SELECT * FROM steps WHERE run_id=? AND step>=? ORDER BY step", (run_id, since_step))
            ]
            decisions = [
                {
                    "step": r["step"],
                    "window": r["window"],
                    "reason": r["reason"],
                    "audit_id": r["audit_id"],
                    "cosines": loads(r["cosines"]),
                }
                for r in st.all("SELECT * FROM decisions WHERE run_id=? AND step>=? ORDER BY seq", (run_id, since_step))
            ]
            audits = [
                {
                    "audit_id": r["audit_id"],
                    "step": r["step"],
                    "state": r["state"],
                    "kind": r["kind"],
                    "ranks_received": len(loads(r["ranks"])),
                    "cosines": loads(r["cosines"]),
                    "macro_cosines": loads(r["macro_cosines"]),
                    "probe_ids": loads(r["probe_ids"]),
                    "stats": loads(r["stats"]),
                }
                for r in st.all("SELECT * FROM audits WHERE run_id=? AND step>=? ORDER BY audit_id", (run_id, since_step))
            ]
            return TelemetryOut(run_id=run_id, steps=steps, decisions=decisions, audits=audits, probes=self._probe_counts(run_id))

    def _probe_counts(self, run_id: str) -> dict[str, int]:
        counts = dict.fromkeys(PROBE_STATES, 0)
        for r in self._store.all("SELECT state, COUNT(*) AS n FROM probes WHERE run_id=? GROUP BY state", (run_id,)):
            counts[r["state"]] = r["n"]
        agg = self._store.one(
            "SELECT COALESCE(SUM(forced), 0) AS forced, COALESCE(SUM(tokens_added), 0) AS added FROM probes WHERE run_id=?",
            (run_id,),
        )
        counts["forced"] = agg["forced"]
        counts["tokens_added"] = agg["added"]
        counts["declined"] = self._store.one("SELECT declined FROM runs WHERE run_id=?", (run_id,))["declined"]
        return counts

    # --- service helpers (not part of ControllerAPI) ---------------------------------------------

    def backup(self, dest: str | Path) -> None:
        """Copy the whole database to ``dest``, consistent: taken under the controller's lock."""
        with self._lock:
            target = sqlite3.connect(str(dest))
            try:
                self._store.conn.backup(target)
            finally:
                target.close()

    def revision(self, run_id: str) -> int:
        """Counter bumped by every acknowledged write of the run (cheap change detection for SSE)."""
        with self._lock:
            return self._run(run_id).revision

    def snapshot(self) -> list[dict[str, Any]]:
        """Per-run gauges for ``/metrics``: window, probe counts, audits by state, probe staleness."""
        with self._lock:
            out = []
            for run in self._runs.values():
                audits = {"pending": 0, "decided": 0}
                for r in self._store.all("SELECT state, COUNT(*) AS n FROM audits WHERE run_id=? GROUP BY state", (run.run_id,)):
                    audits[r["state"]] = r["n"]
                oldest = self._store.one(  # unbatched probes: complete ones wait for their batch, and age
                    "SELECT MIN(oldest_version) AS v FROM probes WHERE run_id=? AND state IN ('active', 'complete')",
                    (run.run_id,),
                )["v"]
                out.append(
                    {
                        "run_id": run.run_id,
                        "window": run.policy.window(run.last_step),
                        "last_step": run.last_step,
                        "probes": self._probe_counts(run.run_id),
                        "audits": audits,
                        "staleness_max": 0 if oldest is None else max(0, run.last_step - oldest),
                    }
                )
            return out
