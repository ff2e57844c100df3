"""Probe scheduling: which offered prefixes become probes, extension plans, reports, windowed-FIFO batches.

* At most ``offers_per_step`` offers are accepted per step and never more than ``max_active_probes``
  probes are ``active``; the rest are declined and counted. Selection is ``uniform`` (seeded by the
  run seed, the step and the offer's sequence number, recorded in ``offers``) or ``stratified``
  (round-robin over prompt ids). Accepted probes keep offer order: the submission order.
* ``next_probe_batch`` is a windowed FIFO: a complete probe may be taken only while it is among the
  first ``P + lookahead`` non-dropped, not-yet-batched probes in submission order, so short probes
  cannot overtake long ones by more than ``lookahead`` places (*Stabilizing and Scaling Async RL Training*).
* Staleness never exceeds ``S`` in a batch. The staleness of a probe at version ``v`` is
  ``v - oldest_version``. When the plan for version ``v`` finds an unbatched probe at staleness ``S``,
  it also force-completes the active probes among the first ``P`` unbatched ones, so that the batch
  is formable at ``v`` (forced fill). ``next_probe_batch`` (at the newest version seen) expires complete
  probes past ``S``, and those at ``S`` when fewer than ``P`` unbatched probes exist at all: no batch can
  hold them within ``S`` any more. Expired probes are counted (state ``expired``), never batched.
* ``probe_plan`` is a read (HTTP GET): it only records the version it was asked about as the newest
  step seen (like ``get_window``); every state change happens in the POSTs (reports, batches).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from adwin.controller.api import InvalidInput, ProbeConflict, UnknownProbe
from adwin.controller.schemas import (
    MAX_INT,
    OfferIn,
    OfferOut,
    ProbeBatchOut,
    ProbeOut,
    ProbePlanOut,
    ProbeReportIn,
)
from adwin.controller.state import ControllerBase
from adwin.controller.store import dumps

logger = logging.getLogger(__name__)


class ProbeScheduler(ControllerBase):
    # --- probes ----------------------------------------------------------------------------------

    def offer_probes(self, run_id: str, offer: OfferIn, *, idempotency_key: str | None = None) -> OfferOut:
        def apply() -> tuple[Any, Callable[[], None] | None]:
            run = self._run(run_id)
            spec = run.spec
            st = self._store
            this_step = st.one(
                "SELECT COUNT(*) AS n FROM probes WHERE run_id=? AND submitted_step=?", (run_id, offer.step)
            )["n"]
            active = st.one("SELECT COUNT(*) AS n FROM probes WHERE run_id=? AND state='active'", (run_id,))["n"]
            ids = [o.sample_id for o in offer.offers]
            known: set[str] = set()
            for chunk in range(0, len(ids), 500):
                part = ids[chunk : chunk + 500]
                q = f"SELECT probe_id FROM probes WHERE run_id=? AND probe_id IN ({','.join('?' * len(part))})"
                known.update(r["probe_id"] for r in st.all(q, [run_id, *part]))
            eligible: list[int] = []
            seen: set[str] = set()
            for i, o in enumerate(offer.offers):
                if o.sample_id not in known and o.sample_id not in seen:  # duplicates are declined
                    eligible.append(i)
                    seen.add(o.sample_id)
            k = min(
                max(0, spec["offers_per_step"] - this_step),
                max(0, spec["max_active_probes"] - active),
                len(eligible),
            )
            row = st.one("SELECT next_seq FROM runs WHERE run_id=?", (run_id,))
            offer_seq = st.one("SELECT COUNT(*) AS n FROM offers WHERE run_id=?", (run_id,))["n"]
            rng_seed = f"{spec['seed']}:{offer.step}:{offer_seq}"
            picked = self._select(spec["selection"], eligible, offer, k, rng_seed)
            seq = row["next_seq"]
            accepted: list[str] = []
            for i in picked:
                o = offer.offers[i]
                st.execute(
                    "INSERT INTO probes (run_id, probe_id, seq, prompt_id, state, tokens, oldest_version, "
                    "newest_version, submitted_step) VALUES (?, ?, ?, ?, 'active', ?, ?, ?, ?)",
                    (run_id, o.sample_id, seq, o.prompt_id, o.response_len, o.version, o.version, offer.step),
                )
                seq += 1
                accepted.append(o.sample_id)
            declined = len(offer.offers) - len(accepted)
            st.execute(
                "UPDATE runs SET next_seq=?, declined=declined+? WHERE run_id=?", (seq, declined, run_id)
            )
            st.execute(
                "INSERT INTO offers (run_id, step, seq, selection, rng_seed, offered, accepted, declined) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, offer.step, offer_seq, spec["selection"], rng_seed, len(offer.offers), dumps(accepted), declined),
            )
            self._touch_step(run, offer.step)
            return OfferOut(accepted=accepted, declined=declined).model_dump(mode="json"), None

        return OfferOut.model_validate(self._write(run_id, idempotency_key, "offer_probes", apply))

    @staticmethod
    def _select(selection: str, eligible: list[int], offer: OfferIn, k: int, rng_seed: str) -> list[int]:
        """Indices into ``offer.offers`` to accept, in offer (= submission) order."""
        if k >= len(eligible):
            return list(eligible)
        rng = random.Random(rng_seed)
        if selection == "uniform":
            return sorted(rng.sample(eligible, k))
        # stratified: round-robin over prompt ids (in a seeded order), earliest sample of each first,
        # so one prompt's many rollouts cannot fill the probe budget.
        groups: dict[str, list[int]] = {}
        for i in eligible:
            groups.setdefault(offer.offers[i].prompt_id, []).append(i)
        order = list(groups)
        rng.shuffle(order)
        picked: list[int] = []
        depth = 0
        while len(picked) < k:
            for pid in order:
                if depth < len(groups[pid]) and len(picked) < k:
                    picked.append(groups[pid][depth])
            depth += 1
        return sorted(picked)

    def probe_plan(self, run_id: str, step: int) -> ProbePlanOut:
        if not 0 <= step <= MAX_INT:
            raise InvalidInput(f"step must be in [0, {MAX_INT}], got {step}")
        with self._lock:
            run = self._run(run_id)  # a read: the run's step moves only through writes
            queue = self._unbatched(run_id)
            limit, p = run.spec["staleness_limit"], run.spec["probe_batch_size"]
            force = {r["probe_id"] for r in queue if r["state"] == "active" and step - r["oldest_version"] >= limit}
            # Forced fill: probes past S are expired at the next batch call, so only those still
            # batchable (staleness <= S) count; if one of them is at S, the first P must be complete now.
            live = [r for r in queue if step - r["oldest_version"] <= limit]
            if len(live) >= p and any(step - r["oldest_version"] >= limit for r in live):
                force.update(r["probe_id"] for r in live[:p] if r["state"] == "active")
            active = [r["probe_id"] for r in queue if r["state"] == "active"]
            return ProbePlanOut(
                step=step,
                extend_by=run.policy.window(step),
                active=active,
                force_complete=[pid for pid in active if pid in force],
            )

    def _unbatched(self, run_id: str) -> list[Any]:
        """Active and complete probes (not dropped, expired or batched) in submission order."""
        return self._store.all(
            "SELECT probe_id, state, oldest_version FROM probes WHERE run_id=? AND state IN ('active', 'complete') "
            "ORDER BY seq",
            (run_id,),
        )

    def report_probe(self, run_id: str, report: ProbeReportIn, *, idempotency_key: str | None = None) -> ProbeOut:
        def apply() -> tuple[Any, Callable[[], None] | None]:
            run = self._run(run_id)
            row = self._store.one(
                "SELECT * FROM probes WHERE run_id=? AND probe_id=?", (run_id, report.probe_id)
            )
            if row is None:
                raise UnknownProbe(f"run {run_id!r} has no probe {report.probe_id!r}")
            if row["state"] != "active":
                raise ProbeConflict(f"probe {report.probe_id!r} is {row['state']}; only active probes take reports")
            if report.dropped:
                state = "dropped"
            elif report.finished or report.forced:
                state = "complete"
            else:
                state = "active"
            tokens = row["tokens"] + report.tokens_added
            newest = max(row["newest_version"], report.version)
            forced = bool(row["forced"]) or report.forced
            self._store.execute(
                "UPDATE probes SET state=?, tokens=?, tokens_added=tokens_added+?, newest_version=?, forced=? "
                "WHERE run_id=? AND probe_id=?",
                (state, tokens, report.tokens_added, newest, int(forced), run_id, report.probe_id),
            )
            self._touch_step(run, report.step)
            out = ProbeOut(
                probe_id=report.probe_id,
                state=state,  # type: ignore[arg-type]
                tokens=tokens,
                oldest_version=row["oldest_version"],
                newest_version=newest,
                submitted_step=row["submitted_step"],
                forced=forced,
            )
            return out.model_dump(mode="json"), None

        return ProbeOut.model_validate(self._write(run_id, idempotency_key, "report_probe", apply))

    def next_probe_batch(
        self, run_id: str, *, step: int | None = None, idempotency_key: str | None = None
    ) -> ProbeBatchOut | None:
        if step is not None and not 0 <= step <= MAX_INT:
            raise InvalidInput(f"step must be in [0, {MAX_INT}], got {step}")

        def apply() -> tuple[Any, Callable[[], None] | None]:
            run = self._run(run_id)
            p, lookahead, limit = run.spec["probe_batch_size"], run.spec["lookahead"], run.spec["staleness_limit"]
            # the caller's student version, if given: reads (window, plan) never move the run's step
            version = max(run.last_step, step or 0)
            self._touch_step(run, version)
            queue = self._expire(run_id, self._unbatched(run_id), version, limit, p)
            head = queue[: p + lookahead]
            ready = [r for r in head if r["state"] == "complete"]
            if len(ready) < p:
                return None, None
            batch = [r["probe_id"] for r in ready[:p]]
            staleness = max(version - r["oldest_version"] for r in ready[:p])
            self._purge_sketches(run_id)
            audit_id = self._store.one("SELECT next_audit_id FROM runs WHERE run_id=?", (run_id,))["next_audit_id"]
            self._store.execute(
                f"UPDATE probes SET state='batched', audit_id=? WHERE run_id=? AND probe_id IN ({','.join('?' * p)})",
                (audit_id, run_id, *batch),
            )
            self._store.execute("UPDATE runs SET next_audit_id=? WHERE run_id=?", (audit_id + 1, run_id))
            self._store.execute(
                "INSERT INTO audits (run_id, audit_id, step, probe_ids, state, created_at) "
                "VALUES (?, ?, ?, ?, 'pending', ?)",
                (run_id, audit_id, version, dumps(batch), time.time()),
            )
            out = ProbeBatchOut(audit_id=audit_id, probe_ids=batch, version=version, staleness_max=staleness)
            return out.model_dump(mode="json"), None

        answer = self._write(run_id, idempotency_key, "next_probe_batch", apply)
        return None if answer is None else ProbeBatchOut.model_validate(answer)

    def _purge_sketches(self, run_id: str) -> None:
        """Drop the per-rank sketches of decided audits (kept off the audit-to-decision path)."""
        decided = "SELECT audit_id FROM audits WHERE run_id=? AND state='decided'"
        if self._sketch_files is not None:
            parts = self._store.all(f"SELECT audit_id, rank FROM audit_parts WHERE run_id=? AND audit_id IN ({decided})",
                                    (run_id, run_id))
            self._sketch_files.remove(run_id, [(p["audit_id"], p["rank"]) for p in parts])
        self._store.execute(f"DELETE FROM audit_parts WHERE run_id=? AND audit_id IN ({decided})", (run_id, run_id))

    def _expire(self, run_id: str, queue: list[Any], version: int, limit: int, p: int) -> list[Any]:
        """Expire complete probes that no batch can take within the staleness limit; the rest of ``queue``.

        Past ``S`` always. At ``S`` too when fewer than ``P`` unbatched probes remain: no batch can form at
        this version, and at the next one they would be past ``S``. Active probes are left alone (the plan
        force-completes them and their report must still be accepted); they expire once complete.
        """
        doomed = {r["probe_id"] for r in queue if r["state"] == "complete" and version - r["oldest_version"] > limit}
        if len(queue) - len(doomed) < p:
            doomed.update(
                r["probe_id"] for r in queue if r["state"] == "complete" and version - r["oldest_version"] >= limit
            )
        ids = sorted(doomed)
        for chunk in range(0, len(ids), 500):
            part = ids[chunk : chunk + 500]
            self._store.execute(
                f"UPDATE probes SET state='expired' WHERE run_id=? AND probe_id IN ({','.join('?' * len(part))})",
                (run_id, *part),
            )
        if ids:
            logger.info("run %s: %d probe(s) expired at version %d (staleness limit %d)", run_id, len(ids), version, limit)
        return [r for r in queue if r["probe_id"] not in doomed]
