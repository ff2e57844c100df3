"""Audit aggregation: validate a submission, sum per-rank sketches, decide the next window.

``cosines`` and ``gram`` submissions are the whole batch's (already reduced over ranks) and decide at
once; ``sketch`` submissions arrive one per rank and decide once all ``world_size`` ranks are in (the
sketches are linear in the gradient, so their sum is the sketch of the batch gradient). A submission
with non-finite values is refused (422) and logged as a ``fallback`` decision: the window stays.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from pydantic import ValidationError

from adwin.controller.api import AuditConflict, InvalidInput, NonFiniteAudit
from adwin.controller.schemas import MAX_INT, AuditIn, AuditOut, WindowOut
from adwin.controller.state import ControllerBase, RunState, check_finite
from adwin.controller.store import dumps, loads
from adwin.policies.base import WindowConfigError
from adwin.policies.registry import policy_from_state
from adwin.policies.resolution import unresolved

logger = logging.getLogger(__name__)


def _decode_sketch(b64: str, shape: tuple[int, int]) -> np.ndarray:
    """(K+1, D) float32 from base64 of little-endian bytes; 422 on bad base64 or a wrong byte count."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidInput(f"sketch_b64 is not valid base64: {e}") from e
    if len(raw) != 4 * shape[0] * shape[1]:
        raise InvalidInput(f"sketch_b64 holds {len(raw)} bytes; shape {tuple(shape)} float32 needs {4 * shape[0] * shape[1]}")
    return np.frombuffer(raw, dtype="<f4").reshape(shape)


def _finite(a: np.ndarray) -> bool:
    """All entries finite. A float64 sum of float32 values cannot overflow, so it is NaN/Inf iff an entry is."""
    return bool(np.isfinite(a.sum(dtype=np.float64)))


def _unit_scale(gram: np.ndarray) -> np.ndarray:
    """Gram / max|entry|: cosines are scale-free, and a huge finite Gram (1e308) would overflow to NaN."""
    top = float(np.max(np.abs(gram)))
    return gram / top if top > 0 else gram


def _alignment() -> ModuleType:
    """Imported lazily: ``adwin.audit.alignment`` pulls in torch, which the bare service does not otherwise need."""
    from adwin.audit import alignment

    return alignment


@dataclass(frozen=True)
class _Evidence:
    """What a policy observes: the cosines and, when the trainer sent one, the interval of each."""

    cosines: dict[int, float]
    cosine_ci: dict[int, tuple[float, float]] | None
    noise_floor: dict[int, float]  # the audit's pure-noise reading per candidate (stats noise_cos_<c>)
    signal_z: float | None  # its full-gradient signal z (stats signal_z)
    noise_scale: float | None = None  # the full gradient's noise scale B it measured (stats noise_scale)
    samples: float | None = None  # the samples it read, pooled (stats evidence_samples)


def _noise_floor(stats: dict[str, float]) -> dict[int, float]:
    prefix = "noise_cos_"
    return {int(k[len(prefix):]): v for k, v in stats.items() if k.startswith(prefix) and k[len(prefix):].isdigit()}


def _check_intervals(audit: AuditIn, world_size: int, kind: str) -> None:
    if audit.cosine_ci is None:
        return
    if kind == "sketch" and world_size > 1:
        raise InvalidInput("cosine_ci needs world_size 1 with sketch audits: one rank's interval covers its shard only")
    for c, (lo, hi) in audit.cosine_ci.items():
        if math.isfinite(lo) and math.isfinite(hi) and not -1.0 <= lo <= hi <= 1.0:
            raise InvalidInput(f"cosine_ci[{c}] must satisfy -1 <= low <= high <= 1, got ({lo}, {hi})")


class AuditAggregator(ControllerBase):
    # --- audits ----------------------------------------------------------------------------------

    def submit_audit(
        self, run_id: str, audit_id: int, audit: AuditIn, *, idempotency_key: str | None = None
    ) -> AuditOut:
        return self._submit(run_id, audit_id, audit, None, idempotency_key)

    def submit_sketch(
        self,
        run_id: str,
        audit_id: int,
        rank: int,
        sketch: np.ndarray,
        *,
        macro_cosines: dict[int, float] | None = None,
        stats: dict[str, float] | None = None,
        idempotency_key: str | None = None,
    ) -> AuditOut:
        """One rank's (K+1, D) float32 sketch as an array: ``submit_audit`` without the base64 round trip.

        The service's binary route (``application/octet-stream``) lands here; validation, persistence
        and the decision are the same as for ``sketch_b64``.
        """
        if sketch.ndim != 2 or sketch.dtype != np.dtype("<f4"):
            raise InvalidInput(f"sketch must be a 2-d little-endian float32 array, got {sketch.dtype} {sketch.shape}")
        try:
            audit = AuditIn(rank=rank, sketch_shape=sketch.shape, macro_cosines=macro_cosines, stats=stats or {})
        except ValidationError as e:
            raise InvalidInput(f"sketch audit: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from e
        return self._submit(run_id, audit_id, audit, sketch, idempotency_key)

    def _submit(
        self, run_id: str, audit_id: int, audit: AuditIn, raw: np.ndarray | None, idempotency_key: str | None
    ) -> AuditOut:
        if not 1 <= audit_id <= MAX_INT:
            raise InvalidInput(f"audit_id must be in [1, {MAX_INT}], got {audit_id}")
        with self._lock:
            if idempotency_key is not None and self._store.idem_get(run_id, idempotency_key) is not None:
                return AuditOut.model_validate(self._write(run_id, idempotency_key, "submit_audit", lambda: (None, None)))
            run = self._run(run_id)
            row = self._store.one("SELECT * FROM audits WHERE run_id=? AND audit_id=?", (run_id, audit_id))
            if row is None:
                raise AuditConflict(f"run {run_id!r} has no audit {audit_id}")
            if row["state"] == "decided":
                raise AuditConflict(f"audit {audit_id} of run {run_id!r} is already decided")
            kind, sketch = self._validate_audit(run, row, audit, raw)
            return AuditOut.model_validate(
                self._write(run_id, idempotency_key, "submit_audit", lambda: self._apply_audit(run, row, audit, kind, sketch))
            )

    def _validate_audit(self, run: RunState, row: Any, audit: AuditIn, raw: np.ndarray | None) -> tuple[str, np.ndarray | None]:
        given = [n for n in ("cosines", "gram", "sketch_b64") if getattr(audit, n) is not None]
        if raw is not None:
            given.append("sketch_b64")
        if audit.skipped:
            extra = given + [n for n in ("macro_cosines", "cosine_ci") if getattr(audit, n) is not None]
            if extra:
                raise InvalidInput(f"a skipped audit carries no measurement; got {extra}")
            if run.spec["world_size"] != 1:
                raise InvalidInput("skipping an audit needs world_size 1 (every rank would have to agree)")
            bad = check_finite("stats", audit.stats)
            if bad:
                raise InvalidInput(f"{bad} must be finite")
            return "skipped", None
        if len(given) != 1:
            raise InvalidInput(f"give exactly one of cosines, gram, sketch_b64; got {given or 'none'}")
        kind = "sketch" if given[0] == "sketch_b64" else given[0]
        if row["kind"] is not None and row["kind"] != kind:
            raise InvalidInput(f"audit {row['audit_id']} already has {row['kind']} submissions; got {kind}")
        if audit.rank >= run.spec["world_size"]:
            raise InvalidInput(f"rank {audit.rank} out of range for world_size {run.spec['world_size']}")
        allowed = set(run.candidates) | {run.spec["policy"]["max_len"]}
        for name in ("cosines", "macro_cosines", "cosine_ci"):
            keys = getattr(audit, name)
            if keys is not None:
                unknown = sorted(set(keys) - allowed)
                if unknown:
                    raise InvalidInput(f"{name} has unknown candidates {unknown}; the run's candidates are {run.candidates}")
        if audit.cosines is not None and not audit.cosines:
            raise InvalidInput("cosines is empty")
        k1 = len(run.candidates) + 1
        if audit.gram is not None and (len(audit.gram) != k1 or any(len(r) != k1 for r in audit.gram)):
            raise InvalidInput(f"gram must be ({k1}, {k1}) for {k1 - 1} candidates")
        _check_intervals(audit, run.spec["world_size"], kind)
        sketch = None
        if kind == "sketch":
            shape = audit.sketch_shape
            if shape is None or shape[0] != k1 or shape[1] < 1:
                raise InvalidInput(f"sketch_shape must be ({k1}, D) with D >= 1, got {shape}")
            if row["sketch_shape"] is not None and tuple(loads(row["sketch_shape"])) != tuple(shape):
                raise InvalidInput(f"sketch_shape {tuple(shape)} differs from earlier ranks' {tuple(loads(row['sketch_shape']))}")
            if audit.rank in loads(row["ranks"]):
                raise AuditConflict(f"rank {audit.rank} already submitted audit {row['audit_id']}")
            sketch = raw if raw is not None else _decode_sketch(audit.sketch_b64 or "", shape)  # (K+1, D)
        bad = (
            check_finite("cosines", audit.cosines)
            or check_finite("macro_cosines", audit.macro_cosines)
            or check_finite("gram", audit.gram)
            or check_finite("stats", audit.stats)
            or check_finite("cosine_ci", None if audit.cosine_ci is None else {c: list(v) for c, v in audit.cosine_ci.items()})
            or (None if sketch is None or _finite(sketch) else "sketch")
        )
        if bad:
            self._record_fallback(run, row["audit_id"], bad)
            raise NonFiniteAudit(f"audit {row['audit_id']} rejected: non-finite {bad}; the window stays {run.policy.window(run.last_step)}")
        return kind, sketch

    def _read_part(self, run_id: str, audit_id: int, rank: int, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """A pending rank's sketch after a restart: from its file, or (in-memory store, older databases) its blob."""
        if payload or self._sketch_files is None:
            return np.frombuffer(payload, dtype="<f4").reshape(shape)
        return self._sketch_files.read(run_id, audit_id, rank, shape)

    def _record_fallback(self, run: RunState, audit_id: int, why: str) -> None:
        """A rejected audit leaves the window as it is; the decision log says so (reason ``fallback``)."""
        window = run.policy.window(run.last_step)
        with self._store.transaction():
            seq = self._store.one("SELECT MAX(seq) AS s FROM decisions WHERE run_id=?", (run.run_id,))["s"] + 1
            self._store.execute(
                "INSERT INTO decisions (run_id, seq, step, window, reason, audit_id) VALUES (?, ?, ?, ?, 'fallback', ?)",
                (run.run_id, seq, run.last_step, window, audit_id),
            )
        run.reason, run.audit_id, run.cosines = "fallback", audit_id, None
        run.revision += 1
        logger.warning("run %s: audit %d rejected (%s); window stays %d", run.run_id, audit_id, why, window)

    def _apply_skip(self, run: RunState, audit_id: int, audit: AuditIn) -> tuple[Any, Callable[[], None] | None]:
        """Close the audit unmeasured: its probes are consumed, the policy and the window stay as they are."""
        self._store.execute(
            "UPDATE audits SET state='decided', kind='skipped', ranks=?, stats=?, decided_at=? WHERE run_id=? AND audit_id=?",
            (dumps([audit.rank]), dumps(dict(audit.stats)), time.time(), run.run_id, audit_id),
        )
        self._store.execute("UPDATE probes SET state='audited' WHERE run_id=? AND audit_id=?", (run.run_id, audit_id))
        return AuditOut(audit_id=audit_id, state="decided", ranks_received=1).model_dump(mode="json"), None

    def _apply_audit(
        self, run: RunState, row: Any, audit: AuditIn, kind: str, sketch: np.ndarray | None
    ) -> tuple[Any, Callable[[], None] | None]:
        st, audit_id = self._store, row["audit_id"]
        ranks = loads(row["ranks"]) + [audit.rank]
        if kind == "skipped":
            return self._apply_skip(run, audit_id, audit)
        gram = None
        if kind == "sketch":
            assert sketch is not None
            deciding = len(ranks) >= run.spec["world_size"]
            # A pending rank's sketch is persisted before it is acknowledged (a restarted service resumes
            # the audit); the deciding rank's is not: the decision commits with it and needs no blob.
            payload = b""
            if not deciding:
                if self._sketch_files is not None:
                    self._sketch_files.write(run.run_id, audit_id, audit.rank, sketch)
                else:
                    payload = sketch.tobytes()  # in-memory store: the blob lives with the rest
            st.execute(
                "INSERT INTO audit_parts (run_id, audit_id, rank, macro_cosines, stats, payload) VALUES (?, ?, ?, ?, ?, ?)",
                (run.run_id, audit_id, audit.rank, dumps(audit.macro_cosines), dumps(audit.stats), payload),
            )
            st.execute(
                "UPDATE audits SET kind='sketch', ranks=?, sketch_shape=? WHERE run_id=? AND audit_id=?",
                (dumps(ranks), dumps(list(sketch.shape)), run.run_id, audit_id),
            )
            key = (run.run_id, audit_id)
            if not deciding:

                def keep_pending() -> None:  # in memory too, so the deciding rank need not read blobs back
                    self._pending_sketches.setdefault(key, {})[audit.rank] = sketch

                out = AuditOut(audit_id=audit_id, state="pending", ranks_received=len(ranks))
                return out.model_dump(mode="json"), keep_pending
            cached = {**self._pending_sketches.get(key, {}), audit.rank: sketch}
            if set(cached) != set(ranks):  # re-opened controller: the earlier ranks live only in SQLite
                for p in st.all(
                    "SELECT rank, payload FROM audit_parts WHERE run_id=? AND audit_id=? AND rank!=?",
                    (run.run_id, audit_id, audit.rank),
                ):
                    if p["rank"] not in cached:
                        cached[p["rank"]] = self._read_part(run.run_id, audit_id, p["rank"], p["payload"], sketch.shape)
            total = np.zeros(sketch.shape, dtype=np.float64)  # (K+1, D): the batch's sketch, summed over ranks
            for r in sorted(cached):
                total += cached[r]
            gram = _alignment().gram_from_sketches(total)  # (K+1, K+1)
            parts = st.all(
                "SELECT macro_cosines, stats FROM audit_parts WHERE run_id=? AND audit_id=?", (run.run_id, audit_id)
            )
            macros = [m for m in (loads(p["macro_cosines"]) for p in parts) if m]
            macro = {int(c): float(np.mean([m[c] for m in macros if c in m])) for c in {c for m in macros for c in m}} if macros else None
            stat_list = [loads(p["stats"]) for p in parts]
            stats = {s: float(np.mean([d[s] for d in stat_list if s in d])) for s in {s for d in stat_list for s in d}}
            # The parts' blobs are purged later (next_probe_batch): freeing megabytes of overflow pages
            # here would sit on the audit-to-decision path.
        else:
            macro = audit.macro_cosines
            stats = dict(audit.stats)
            if kind == "gram":
                gram = np.asarray(audit.gram, dtype=np.float64)  # (K+1, K+1)
        cosines = _alignment().cosines_from_gram(_unit_scale(gram), run.candidates) if gram is not None else dict(audit.cosines or {})
        if audit.cosine_ci is not None:  # kept with the audit (and its telemetry) as plain stats
            stats |= {f"cos_ci_{end}_{c}": v for c, ci in audit.cosine_ci.items() for end, v in zip(("low", "high"), ci, strict=True)}
        # Cosines computed from a Gram are finite by construction; cosines given directly were checked.
        policy = policy_from_state(run.policy.state_dict())  # decide on a copy; swap after COMMIT
        adaptive = policy.audited
        if adaptive:
            try:
                policy.observe(_Evidence(cosines, audit.cosine_ci, _noise_floor(stats), stats.get("signal_z"),
                                         stats.get("noise_scale"), stats.get("evidence_samples")))
            except (WindowConfigError, ValueError) as e:
                raise InvalidInput(f"audit {audit_id}: {e}") from e
        reason = ("unresolved" if unresolved(policy) else "audit") if adaptive else "schedule"
        step = run.last_step
        window = policy.window(step)
        decision = WindowOut(run_id=run.run_id, step=step, window=window, reason=reason, audit_id=audit_id, cosines=cosines)
        seq = st.one("SELECT MAX(seq) AS s FROM decisions WHERE run_id=?", (run.run_id,))["s"] + 1
        st.execute(
            "INSERT INTO decisions (run_id, seq, step, window, reason, audit_id, cosines) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run.run_id, seq, step, window, reason, audit_id, dumps(cosines)),
        )
        st.execute(
            "UPDATE audits SET state='decided', kind=?, ranks=?, cosines=?, macro_cosines=?, gram=?, stats=?, "
            "decision=?, decided_at=? WHERE run_id=? AND audit_id=?",
            (
                kind,
                dumps(ranks),
                dumps(cosines),
                dumps(macro),
                dumps(None if gram is None else gram.tolist()),
                dumps(stats),
                decision.model_dump_json(),
                time.time(),
                run.run_id,
                audit_id,
            ),
        )
        st.execute("UPDATE probes SET state='audited' WHERE run_id=? AND audit_id=?", (run.run_id, audit_id))
        st.execute("UPDATE runs SET policy_state=? WHERE run_id=?", (dumps(policy.state_dict()), run.run_id))

        def on_commit() -> None:
            run.policy, run.reason, run.audit_id, run.cosines = policy, reason, audit_id, cosines
            self._pending_sketches.pop((run.run_id, audit_id), None)

        out = AuditOut(audit_id=audit_id, state="decided", ranks_received=len(ranks), decision=decision, cosines=cosines)
        return out.model_dump(mode="json"), on_commit

