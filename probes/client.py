"""``ProbeClient``: the one conversation with the controller about probes, for every loop.

Offer, pool, extension rounds, the probe batch, its teacher scoring, the drift diagnostics, the audit and its
schedule, the submit and the decision bookkeeping live here once; the loops only drive it:

* the synchronous trainer (``adwin.loop.probing.ProbeSide``) calls ``offer``, ``advance``, ``audit`` each step;
* the generic client and the TRL callback (``adwin.trainer_adapters.generic.WindowClient``) the same, with
  their own extension callable, extending to the horizon in one round (``advance(to_full=True)``);
* the AsyncOPD hooks (``adwin.trainer_adapters.hooks.ControllerWindowHooks``) use the *fresh probe* mode: a
  request is offered at submission with no tokens (``offer_fresh``), the pipeline generates it to full length
  and reports it complete (``complete``), teacher logprobs already scored by its teacher stage.

The client composes collaborators with their own state, none reaching into another's: ``ControllerLink`` (the
keyed calls to the controller, ``adwin.probes.conversation``), ``DecisionRecord`` (the accepted audits,
``adwin.probes.audit_steps``), ``Expiry`` (the staleness clean-ups) and ``HeldBatches`` (the batches held for a pooled
audit, ``adwin.probes.pooling``).

Two ways a probe grows, one record (``adwin.probes.pool.Probe``) and one batch builder
(``adwin.probes.pool.probe_batch``). Audits run where the probes run: a probe executor's workers
(``adwin.probes.async_executor``: inline, thread, Ray) or, without one, an ``InlineAuditor`` on the learner's
model; either way through ``AuditJob`` / ``run_audit_job`` with the run's ``AuditSettings``
(``adwin.probes.settings``). An audit is submitted at the first call after it is back (``audit/lag_steps``),
and waited for once its weights are ``S`` versions old or when asked (``drain``, ``wait=True``).

The staleness rule is stated once (``_check_staleness``): no probe extended or audited may be more than ``S``
versions stale; the controller's forced fill and expiry guarantee it, so a violation stops the run. A refused
audit is decided by type (``adwin.audit.errors.is_non_finite_audit``): NaN/Inf leaves the window as it was,
anything else propagates.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from adwin.audit.budget import DecisionBudget
from adwin.audit.errors import is_non_finite_audit
from adwin.audit.job import AuditOutcome, AuditSettings
from adwin.audit.schedule import AuditSchedule
from adwin.controller.api import ControllerAPI, ProbeConflict
from adwin.controller.schemas import AuditIn, OfferIn, ProbeOfferItem, ProbePlanOut, ProbeReportIn
from adwin.policies.resolution import RESOLUTION_STATS
from adwin.probes.async_executor import AdvanceStats, AsyncProbeExecutor
from adwin.probes.audit_steps import AuditInputs, DecisionRecord, build_audit_job
from adwin.probes.auditors import AuditRunner, Drift, Pending, merged
from adwin.probes.auditors import InlineAuditor as InlineAuditor  # re-exported: the loops build one
from adwin.probes.conversation import ControllerLink
from adwin.probes.evidence import EvidencePool, evidence_pool
from adwin.probes.expiry import Expiry
from adwin.probes.offers import OFFER_FINISHED, is_complete, offer_indices
from adwin.probes.pool import Probe, ProbePool, Score
from adwin.probes.pooling import Held, HeldBatches
from adwin.teacher.client import TeacherUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

@dataclass
class ProbeClient:
    """See the module docstring. ``staleness_limit`` is the run's ``S``."""

    controller: ControllerAPI
    run_id: str
    pool: ProbePool
    staleness_limit: int
    offer_finished: str = "at_horizon"
    executor: AsyncProbeExecutor | None = None  # extends probes (continue-a-prefix mode); audits where they run
    auditor: AuditRunner | None = None  # audits when there is no executor (default: the executor)
    settings: AuditSettings | None = None  # None: no audits
    score: Score | None = None  # the teacher, for probes no teacher stage scored
    pad_id: int = 0
    adam_moments: Callable[[], dict[str, Any]] | None = None  # metric="adam" off the learner
    drift: Drift | None = None
    schedule: AuditSchedule | None = None  # audit.every / audit.skip_*: which ready batches to audit
    probe_batch_size: int = 1  # P, for the expiry warning
    on_completed: Callable[[Probe], None] | None = None  # a probe an extension round completed
    budget: DecisionBudget | None = None  # audit.budget: offers, pooled audits, decision/* (probes.settings)
    clock: Callable[[], float] = time.perf_counter  # the learner's decision seconds (a fake one in tests)
    pending: deque[Pending] = field(default_factory=deque)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("offered", "accepted", "reported", "completed", "forced", "audits", "audited", "rejected", "skipped",
         "expired", "conflicts"), 0))
    # its collaborators, each with its own state: the conversation with the controller, the accepted audits'
    # bookkeeping, the staleness clean-ups, the batches held for a pooled audit
    link: ControllerLink = field(init=False)
    record: DecisionRecord = field(init=False)
    expiry: Expiry = field(init=False)
    held: HeldBatches = field(default_factory=HeldBatches, init=False)
    _budget_lock: threading.Lock = field(default_factory=threading.Lock)  # AsyncOPD offers from its feeder thread
    _evidence: EvidencePool | None = None  # audit.evidence_audits > 1: the audits a decision pools

    def __post_init__(self) -> None:
        if self.offer_finished not in OFFER_FINISHED:
            raise ValueError(f"offer_finished must be one of {OFFER_FINISHED}, got {self.offer_finished!r}")
        self.link = ControllerLink(self.controller, self.run_id)
        self.record = DecisionRecord(self.counts)
        self.expiry = Expiry(self.link, self.pool, self.counts, self.release)

    @property
    def max_len(self) -> int:
        return self.pool.max_response_len

    # --- offers ---------------------------------------------------------------------------------------

    def offer(self, step: int, records: Sequence[Probe], ended: Sequence[bool], window: int | Sequence[int], *,
              limit: int | None = None, complete_now: bool = False) -> list[str]:
        with self._learner():
            return self._offer(step, records, ended, window, limit=limit, complete_now=complete_now)

    def _offer(self, step: int, records: Sequence[Probe], ended: Sequence[bool], window: int | Sequence[int], *,
               limit: int | None, complete_now: bool) -> list[str]:
        """Offer rollouts by the one offer rule (``probes.offers.offer_indices``); accepted ones enter the pool.

        ``records[i]``: rollout ``i`` as a probe (offered at its oldest token's version); ``ended[i]``: it emitted
        EOS; ``window``: the cap it was generated under (one for all, or one per record); ``limit`` caps the
        offers. Complete records (ended, or at the horizon) need no extension: they are reported complete at the
        next ``advance``, or now with ``complete_now`` (a loop without extension rounds, which then offers only
        complete records).
        """
        wins = [window] * len(records) if isinstance(window, int) else list(window)
        chosen = [i for i in range(len(records))
                  if offer_indices([ended[i]], wins[i], self.max_len, self.offer_finished)][:limit]
        for i in chosen:
            records[i].finished = is_complete(ended[i], len(records[i].response_ids), self.max_len)
        if complete_now:  # no rounds will continue a cut rollout: offer only what needs none
            chosen = [i for i in chosen if records[i].finished]
        if self.gating:  # the open round's share of this step
            chosen = chosen[: self.spend(lambda b: b.allow_offers())]
        if not chosen:
            self._record_offers(0)
            return []
        items = [ProbeOfferItem(sample_id=records[i].probe_id, prompt_id=records[i].prompt_id or records[i].probe_id,
                                response_len=len(records[i].response_ids), version=records[i].oldest_version)
                 for i in chosen]
        out = self.link.offer(OfferIn(step=step, offers=items))
        self.counts["offered"] += len(items)
        self.counts["accepted"] += len(out.accepted)
        self._record_offers(len(out.accepted))
        by_id = {records[i].probe_id: records[i] for i in chosen}
        for pid in out.accepted:
            if complete_now:
                self.complete(by_id[pid], step, tokens_added=0)
            else:
                self.pool.add(by_id[pid])
        return list(out.accepted)

    def _record_offers(self, accepted: int) -> None:
        self.spend(lambda b: b.record_offers(accepted))

    def offer_fresh(self, probe_id: str, prompt_id: str, version: int) -> bool:
        """Offer a request as a probe before it has any token (the pipeline generates it to full length);
        False without asking the controller when the decision budget's open round is spent."""
        if self.gating and self.spend(lambda b: b.allow_offers()) <= 0:
            return False
        offer = OfferIn(step=version, offers=[ProbeOfferItem(sample_id=probe_id, prompt_id=prompt_id, response_len=0,
                                                             version=version)])
        accepted = probe_id in self.link.offer(offer).accepted
        self.counts["offered"] += 1
        self.counts["accepted"] += int(accepted)
        self._record_offers(int(accepted))
        return accepted

    def complete(self, probe: Probe, version: int, *, tokens_added: int | None = None) -> bool:
        """Report ``probe`` complete (generated outside the pool: a fresh probe, or offered complete) and keep it
        for its audit batch; False when the controller dropped it meanwhile (nothing to audit)."""
        added = len(probe.response_ids) if tokens_added is None else tokens_added
        newest = probe.versions[-1] if probe.versions else probe.submitted_step
        report = ProbeReportIn(probe_id=probe.probe_id, step=version, tokens_added=added, version=newest,
                               finished=True, forced=probe.forced)
        try:
            self.link.complete(report)
        except ProbeConflict as e:
            log.warning("probe %s not accepted as complete: %s", probe.probe_id, e)
            self.counts["conflicts"] += 1
            self.release(1)
            return False
        if added:  # generated outside the rounds: its tokens are an extension's
            self.spend(lambda b: b.record_decision("extension", float(added)))
        probe.finished = True
        self.pool.add(probe)
        self.counts["reported"] += 1
        self.counts["completed"] += 1
        self.counts["forced"] += int(probe.forced)
        return True

    def plan(self, version: int) -> ProbePlanOut:
        return self.link.plan(version)

    # --- extension rounds -----------------------------------------------------------------------------

    def advance(self, version: int, *, to_full: bool = False, drop_unknown: bool = True,
                plan_at: int | None = None) -> AdvanceStats:
        """Drop probes a controller outage left over-stale, publish weights ``version`` and run the plan.

        Returns at once unless the plan force-completes probes at the staleness limit (``blocked_s``; with an
        inline worker every round blocks). ``to_full``/``drop_unknown``: ``AsyncProbeExecutor.advance``;
        ``plan_at``: the step to ask the plan at (default ``version``).
        """
        if self.executor is None:
            raise RuntimeError("advance needs a probe executor (continue-a-prefix mode)")
        with self._learner():
            return self._advance(version, to_full, drop_unknown, plan_at)

    def _advance(self, version: int, to_full: bool, drop_unknown: bool, plan_at: int | None) -> AdvanceStats:
        t0 = self.clock()
        dropped = self.drop_overstale(version)
        sync_s = self.executor.publish(version)
        stats = self.executor.collect(version)  # reported before the plan is read: it depends on them
        self._report(stats.reports)
        plan = self.plan(version if plan_at is None else plan_at)
        more = self.executor.advance(plan, version, to_full=to_full, drop_unknown=drop_unknown)
        self._report(more.reports)
        stats = merged(stats, more)
        stats.dropped_stale, stats.sync_s = dropped, sync_s
        held = [(rep, self.pool.get(rep.probe_id)) for rep in stats.reports if rep.probe_id in self.pool]
        for rep, probe in held:
            if rep.finished and self.on_completed is not None and probe.versions[-1:] > [probe.submitted_step]:
                self.on_completed(probe)  # extended to its end here (not offered complete)
        stats.staleness = [probe.staleness(version) for _, probe in held]
        self._check_staleness(stats.staleness, version, "extended")
        self.counts["completed"] += stats.completed
        self.counts["forced"] += stats.forced
        seconds = self.clock() - t0  # the learner's: the workers' rounds overlap training
        self.spend(lambda b: b.record_decision("extension", float(stats.tokens), seconds))
        self.release(stats.dropped)
        return stats

    def drop_overstale(self, version: int) -> int:
        """Unfinished probes already past S missed rounds (e.g. a controller outage): dropped and reported."""
        return self.expiry.drop_overstale(version, self.staleness_limit)

    def drop_probes(self, probe_ids: Sequence[str], version: int) -> int:
        """Report probes that will never complete dropped (a resumed AsyncOPD run's in flight); how many."""
        return self.expiry.drop(probe_ids, version)

    def evict(self, version: int) -> int:
        """Forget complete probes past S: the controller expires them, no batch will name them."""
        return self.expiry.evict(version, self.staleness_limit, self.probe_batch_size)

    def release(self, probes: int) -> None:
        """Probes that left without an audit (dropped, expired, closed unaudited), for the decision budget."""
        if probes:
            self.spend(lambda b: b.release(probes))

    @property
    def gating(self) -> bool:
        """A budget that limits offers and pools audits (``audit.budget: null`` only counts)."""
        return self.budget is not None and self.budget.enabled

    @contextmanager
    def _learner(self) -> Iterator[None]:
        """Time a learner-facing call for ``decision/learner_share`` (a worker's own time is not in it)."""
        t0 = self.clock()
        try:
            yield
        finally:
            dt = self.clock() - t0
            self.spend(lambda b: b.record_learner(dt))

    def spend(self, call: Callable[[DecisionBudget], T]) -> T | None:
        """``call`` on the decision budget, one thread at a time; None without one."""
        if self.budget is None:
            return None
        with self._budget_lock:
            return call(self.budget)

    # --- the decision budget's other inputs and outputs ----------------------------------------------

    def record_train(self, tokens: float, seconds: float) -> None:
        """One learner update: its training rollouts' prompt + response tokens and its measured seconds."""
        self.spend(lambda b: b.record_train(tokens, seconds))

    def decision_metrics(self) -> dict[str, float]:
        """``decision/*`` (``DecisionBudget.metrics``); none without a budget."""
        return self.spend(lambda b: b.metrics()) or {}

    def _report(self, reports: Sequence[ProbeReportIn]) -> None:
        self.link.report(reports)
        self.counts["reported"] += len(reports)

    def _check_staleness(self, stale: Sequence[int], version: int, what: str) -> None:
        if stale and max(stale) > self.staleness_limit:
            raise RuntimeError(f"{what} probe {max(stale)} versions stale at version {version}, above the limit "
                               f"S={self.staleness_limit}: the controller's forced fill and expiry should make this "
                               f"impossible")

    # --- audits ---------------------------------------------------------------------------------------

    def audit(self, version: int, *, wait: bool = False, max_batches: int = 1, flush: bool = False,
              release: bool = False) -> dict[str, float]:
        """Collect audits that are back, then hand ready probe batches to the auditor: up to ``max_batches``
        one by one, or, with a decision budget, the batches its ``pool_size`` pools into one audit.

        ``wait``: also wait for every audit still in flight (before a checkpoint, at the end of the run, and in
        loops that audit on the learner between updates). ``flush``: audit every held batch now, pooled (before a
        checkpoint: held batches are the client's alone, a resumed run would never submit them). ``release`` (a
        run's last step): with a decision budget, close the held and ready batches unaudited instead, their
        probes released: no later step would use their decision, so auditing them would only cost the learner.
        """
        runner = self.auditor or self.executor
        if runner is None or self.settings is None:
            self.evict(version)
            return {}
        with self._learner():
            return self._audit(version, runner, wait, max_batches, flush, release)

    def release_held(self, version: int) -> dict[str, float]:
        """A run's end outside a training step (an adapter's ``close``): with a decision budget, close the held and
        ready batches unaudited, their probes released, after the audits in flight are back; without one,
        nothing: no audit is started once training is over."""
        if not self.gating:
            return {}
        return self.audit(version, wait=True, release=True)

    def _audit(self, version: int, runner: AuditRunner, wait: bool, max_batches: int, flush: bool,
               release: bool) -> dict[str, float]:
        m: dict[str, float] = {}
        self._collect(m, version, block=False)
        if self.gating:
            self.held.dispatch(self, m, version, runner, flush=flush, release=release)
        else:
            for _ in range(max_batches):
                ready = self.next_batch(version)
                if ready is None:
                    break
                self.audit_group(m, version, runner, [ready])
        self.evict(version)
        return self._collect(m, version, block=wait)  # an inline audit is back already

    def next_batch(self, version: int) -> Held | None:
        """The controller's next batch of P complete probes, taken out of the pool; None when none is ready."""
        ready = self.link.next_batch(version)
        if ready is None:
            return None
        missing = [pid for pid in ready.probe_ids if pid not in self.pool]
        if missing:
            raise RuntimeError(f"audit {ready.audit_id} names probes this client never completed: {missing[:3]}")
        return ready, self.pool.pop(ready.probe_ids)

    def close_unaudited(self, audit_id: int, probes: int) -> None:
        """Close a batch unaudited, its probes released."""
        self.link.skip(audit_id, probes)
        self.counts["skipped"] += 1
        self.release(probes)

    def audit_group(self, m: dict[str, float], version: int, runner: AuditRunner, group: Sequence[Held]) -> None:
        """Audit the union of ``group``'s batches as one job under the last batch's ``audit_id``; the others are
        closed as skipped with ``pooled_into`` naming it (docs/decisions.md, "Decision budget")."""
        probes = [p for _, batch in group for p in batch]
        stale = [p.staleness(version) for p in probes]
        self._check_staleness(stale, version, "audited")
        audit_id = group[-1][0].audit_id
        for ready, batch in group[:-1]:
            self.link.skip(ready.audit_id, len(batch), pooled_into=audit_id)
        if len(group) > 1:
            m["audit/pooled_batches"] = float(len(group))
        if self.schedule is not None and not self.schedule.should_audit():
            self.close_unaudited(audit_id, len(probes))
            m["audit/skipped"] = m.get("audit/skipped", 0.0) + 1.0
            return
        try:
            assert self.settings is not None  # the client audits only with settings
            inputs = AuditInputs(self.settings, self.pad_id, self.score, self.drift, self.adam_moments, self.budget,
                                 self.clock)
            job, tokens, drift = build_audit_job(inputs, self.spend, audit_id, version, probes)
        except TeacherUnavailable as e:  # the window stays; the next step's scoring stops the run if it stays down
            log.warning("audit %d: closed unaudited, the teacher server did not answer (%s)", audit_id, e)
            self.close_unaudited(audit_id, len(probes))
            m["audit/teacher_unavailable"] = m.get("audit/teacher_unavailable", 0.0) + 1.0
            return
        m |= drift
        self.spend(lambda b: b.record_decision("audit", tokens, probes=len(probes)))  # seconds: ``_submit``
        self.pending.append(Pending(audit_id, version, stale, float(job.batch.response_mask.sum()),
                                     runner.submit_audit(job)))

    def drain(self, version: int) -> dict[str, float]:
        """Wait for every audit in flight and submit it."""
        with self._learner():
            return self._collect({}, version, block=True)

    def _collect(self, m: dict[str, float], version: int, *, block: bool) -> dict[str, float]:
        """Submit the audits that are back, in order, into ``m`` (counts add up: several may be back at once)."""
        while self.pending and (block or self.pending[0].future.done() or self._overdue(self.pending[0], version)):
            one = self._submit(self.pending.popleft(), version)
            counts = {k: m.get(k, 0.0) + one.pop(k, 0.0) for k in ("audit/submitted", "audit/rejected")}
            m |= one | {k: v for k, v in counts.items() if v}
        m["audit/in_flight"] = float(len(self.pending))
        return m

    def _overdue(self, p: Pending, version: int) -> bool:
        """An audit whose weights are S versions old is waited for: no decision rests on older weights."""
        return version - p.version >= self.staleness_limit

    def submit_now(self, audit_id: int, outcome: Future[AuditOutcome], version: int, staleness: list[int],
                   probe_tokens: float) -> dict[str, float]:
        """Submit an audit computed outside ``audit`` (a loop that builds its own batch) like any other."""
        return self._submit(Pending(audit_id, version, staleness or [0], probe_tokens, outcome), version)

    def _submit(self, p: Pending, version: int) -> dict[str, float]:
        """Send one finished audit to the controller; an audit refused for NaN/Inf leaves the window as it was."""
        try:
            outcome = p.future.result()
            # the decision reads this audit's samples with earlier ones (probes/evidence.py); settings: what it ran with
            self._evidence = evidence_pool(self._evidence, outcome.settings or self.settings, self.staleness_limit)
            if self._evidence is not None:
                outcome = dataclasses.replace(outcome, result=self._evidence.apply(outcome.result, outcome.version,
                                                                                   version))
            res = outcome.result
            out = self.link.submit(
                p.audit_id,
                AuditIn(cosines=res.cosines, macro_cosines=res.macro_cosines or None, cosine_ci=res.cosine_ci or None,
                        stats={"elapsed_s": res.elapsed_s, "probes": float(len(p.staleness)),
                               "weights_version": float(outcome.version)}
                        | {f"noise_cos_{c}": v for c, v in res.noise_floor.items()}
                        | {k: res.extra[k] for k in RESOLUTION_STATS if k in res.extra}))
        except Exception as e:
            if not is_non_finite_audit(e):
                raise
            log.warning("audit %d rejected: %s", p.audit_id, e)
            self.counts["rejected"] += 1
            return {"audit/rejected": 1.0}
        return self.record.record(p, outcome, out, version, schedule=self.schedule, spend=self.spend)

    # --- shutdown -------------------------------------------------------------------------------------

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
