"""The trainer's probe side (ADWIN section 4.2), as one object: ``ProbeSide``.

It owns everything probes need for one run (the controller conversation, the pool, the workers, the
token ledger that probe lengths feed, the audit settings) and offers the trainer four calls, in step
order: ``offer`` this step's rollouts, ``advance`` the probe rounds, ``audit`` a batch that is ready,
and ``account`` the step's tokens.

Audits run where the probes run (docs/decisions.md, "Audits off the learner"). With ``inline`` workers
the audit is computed in the step, on the trainer's weights, exactly as before. With ``thread`` and
``ray`` workers the learner only scores the batch with the teacher and hands an ``AuditJob`` to a
worker, which computes it on its replica under the same weights version; the result is submitted to
the controller at the first step after it is back (``audit/lag_steps``), and the learner never waits
for it, except at a checkpoint or at the end of the run (``drain``), so that nothing is left half done.

The staleness rule is stated once (``_check_staleness``): no probe the trainer extends or audits may be
more than ``S`` versions stale; the controller's forced fill and expiry guarantee it, so a violation is
a scheduling bug and stops the run.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from adwin.audit.drift import teacher_drift
from adwin.audit.job import AuditJob, AuditOutcome, AuditSettings, adam_snapshot, lag_metrics
from adwin.audit.schedule import AuditSchedule
from adwin.config import ProbeConfig, TrainConfig
from adwin.controller.api import ControllerAPI, ControllerError, InvalidInput
from adwin.controller.schemas import AuditIn, OfferIn, ProbeBatchOut, ProbeOfferItem, ProbeReportIn
from adwin.loop.accounting import TokenLedger
from adwin.loop.distributed import LocalDist
from adwin.loop.parts import Parts
from adwin.loop.probe_rounds import RoundExtender
from adwin.loop.sampler import Batch, Sampler
from adwin.policies.registry import is_audited
from adwin.probes.async_executor import AsyncProbeExecutor
from adwin.probes.executors import build_executor
from adwin.probes.offers import is_complete, offer_indices
from adwin.probes.pool import Probe, ProbePool
from adwin.runtime.guards import is_non_finite_audit
from adwin.sampling.rollout import eos_ids, pad_id_of

log = logging.getLogger(__name__)

Score = Callable[[torch.Tensor, torch.Tensor, list[str]], torch.Tensor]


@dataclass
class _Pending:
    ready: ProbeBatchOut
    version: int  # the weights version the audit runs under
    staleness: list[int]
    probe_tokens: float
    future: Future[AuditOutcome]


@dataclass
class ProbeSide:
    """See the module docstring. ``open_probe_side`` builds one from a config; tests may build it by hand."""

    controller: ControllerAPI
    run_id: str
    probes: ProbeConfig
    pool: ProbePool
    ledger: TokenLedger
    executor: AsyncProbeExecutor | None = None
    settings: AuditSettings | None = None
    score: Score | None = None  # the teacher, for probe batches
    pad_id: int = 0
    adam_moments: Callable[[], dict[str, Any]] | None = None  # metric="adam" off the learner
    # drift/* diagnostics of an audited batch, from (input_ids, attention_mask, response_mask, routes)
    drift: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list[str]], dict[str, float]] | None = None
    pending: deque[_Pending] = field(default_factory=deque)
    # window/changes_per_audit: audits whose decision differed from the window in use, over all decisions
    window: int | None = None
    decisions: int = 0
    changes: int = 0
    schedule: AuditSchedule | None = None  # audit.every / audit.skip_margin: which ready batches to audit

    @property
    def enabled(self) -> bool:
        """Probing runs only for an audited policy with offers (``open_probe_side`` decides)."""
        return self.executor is not None

    @property
    def limit(self) -> int:
        return self.probes.staleness_limit

    # --- 1. offers ------------------------------------------------------------------------------

    def offer(self, step: int, batch: Batch, behavior: torch.Tensor, window: int) -> dict[str, float]:
        """Offer this step's rollouts (``probes.offers.offer_indices``); accepted ones enter the pool.

        behavior: (B, L) the behaviour logprobs of the rollout rows, aligned with their input ids.
        """
        max_len = self.pool.max_response_len
        items = {f"s{step}-{b}": b for b in offer_indices(batch.finished, window, max_len, self.probes.offer_finished)}
        offers = [ProbeOfferItem(sample_id=sid, prompt_id=batch.prompts[b].id, response_len=len(batch.response_ids[b]),
                                 version=step) for sid, b in items.items()]
        accepted = self.controller.offer_probes(self.run_id, OfferIn(step=step, offers=offers),
                                                idempotency_key=f"{self.run_id}-offer-{step}").accepted if offers else []
        for sid in accepted:
            b = items[sid]
            n_p, n_r = len(batch.prompt_ids[b]), len(batch.response_ids[b])
            lp = behavior[b, n_p : n_p + n_r].tolist()
            self.pool.add(Probe(sid, list(batch.prompt_ids[b]), list(batch.response_ids[b]), [step] * n_r, lp,
                                batch.prompts[b].route, submitted_step=step,
                                finished=is_complete(batch.finished[b], n_r, max_len)))
        return {"probe/offered": float(len(offers)), "probe/accepted": float(len(accepted))}

    # --- 2. probe rounds ------------------------------------------------------------------------

    def advance(self, version: int) -> dict[str, float]:
        """Drop probes a controller outage left over-stale, publish weights ``version`` and run the plan.

        Returns at once unless the plan force-completes probes at the staleness limit
        (``probe/blocked_s``; with the inline backend every round blocks).
        """
        if self.executor is None:
            return {}
        m = self.drop_overstale(version)
        sync_s = self.executor.publish(version)
        stats = self.executor.advance(self.controller, self.run_id, version)
        for rep in stats.reports:
            probe = self.pool.get(rep.probe_id) if rep.probe_id in self.pool else None
            if rep.finished and probe is not None and probe.versions and probe.versions[-1] > probe.submitted_step:
                self.ledger.add_completed(len(probe.response_ids))  # a truncated sample's full length
        stale = [self.pool.get(r.probe_id).staleness(version) for r in stats.reports if r.probe_id in self.pool]
        self._check_staleness(stale, version, "extended")
        expired = self.pool.evict_complete_past(version, self.limit)  # the controller expires them too
        return m | {
            "probe/active": float(stats.active), "probe/forced": float(stats.forced),
            "probe/completed": float(stats.completed), "probe/tokens": float(stats.tokens), "probe/pool": float(len(self.pool)),
            "probe/staleness_max": float(max(stale, default=0)),
            "probe/staleness_mean": float(np.mean(stale)) if stale else 0.0,
            "probe/blocked_s": stats.blocked_s, "probe/sync_s": sync_s, "probe/in_flight": float(stats.in_flight),
            "probe/submitted": float(stats.submitted), "probe/reissued": float(stats.reissued),
            "probe/lost": float(stats.lost), "probe/worker_restarts": float(stats.restarts),
            "probe/evicted": float(expired)}

    def drop_overstale(self, version: int) -> dict[str, float]:
        """Unfinished probes already past S missed rounds (e.g. a controller outage): drop and report them."""
        stale = [p for p in self.pool.snapshot() if not p.finished and p.staleness(version) > self.limit]
        if not stale:
            return {}
        for p in self.pool.pop([p.probe_id for p in stale]):
            try:
                self.controller.report_probe(self.run_id, ProbeReportIn(probe_id=p.probe_id, step=version, tokens_added=0,
                                                                        version=version, dropped=True),
                                             idempotency_key=f"{self.run_id}-drop-{p.probe_id}")
            except ControllerError as e:  # e.g. the controller no longer holds it as active: nothing to undo
                log.warning("probe %s: drop report refused (%s)", p.probe_id, e)
        log.warning("dropped %d probe(s) over the staleness limit S=%d at version %d (missed rounds, e.g. a "
                    "controller outage)", len(stale), self.limit, version)
        return {"probe/dropped_stale": float(len(stale))}

    def _check_staleness(self, stale: Sequence[int], version: int, what: str) -> None:
        if stale and max(stale) > self.limit:
            raise RuntimeError(f"{what} probe {max(stale)} versions stale at version {version}, above the limit "
                               f"S={self.limit}: the controller's forced fill and expiry should make this impossible")

    # --- 3. audits ------------------------------------------------------------------------------

    def audit(self, version: int, *, wait: bool = False) -> dict[str, float]:
        """Collect audits that are back, then hand a ready probe batch to the workers (inline: compute it now).

        ``wait``: also wait for every audit still in flight (before a checkpoint and at the end of the run,
        so that no audit is left half done).
        """
        if self.executor is None or self.settings is None or self.score is None:
            return {}
        m: dict[str, float] = {}
        self._collect(m, version, block=False)
        ready = self.controller.next_probe_batch(self.run_id, step=version, idempotency_key=f"{self.run_id}-batch-{version}")
        if ready is None:
            return self._collect(m, version, block=wait)
        probes = self.pool.pop(ready.probe_ids)
        stale = [p.staleness(version) for p in probes]
        self._check_staleness(stale, version, "audited")
        if self.schedule is not None and not self.schedule.should_audit():
            self.controller.submit_audit(self.run_id, ready.audit_id,
                                         AuditIn(skipped=True, stats={"probes": float(len(probes))}),
                                         idempotency_key=f"{self.run_id}-audit-{ready.audit_id}")
            m["audit/skipped"] = m.get("audit/skipped", 0.0) + 1.0
            return self._collect(m, version, block=wait)
        batch = self.pool.probe_batch(probes, self.pad_id, self.score)
        if self.drift is not None:
            m |= self.drift(batch.input_ids, batch.attention_mask, batch.response_mask, [p.route for p in probes])
        job = AuditJob(ready.audit_id, version, batch, self.settings,
                       adam_moments=self.adam_moments() if self.adam_moments is not None else None)
        self.pending.append(_Pending(ready, version, stale, float(batch.response_mask.sum()),
                                     self.executor.submit_audit(job)))
        return self._collect(m, version, block=wait)  # an inline audit is back already

    def drain(self, version: int) -> dict[str, float]:
        """Wait for every audit in flight and submit it."""
        return self._collect({}, version, block=True)

    def _collect(self, m: dict[str, float], version: int, *, block: bool) -> dict[str, float]:
        """Submit the audits that are back, in order, into ``m`` (counts add up: several may be back at once)."""
        while self.pending and (block or self.pending[0].future.done() or self._overdue(self.pending[0], version)):
            one = self._submit(self.pending.popleft(), version)
            counts = {k: m.get(k, 0.0) + one.pop(k, 0.0) for k in ("audit/submitted", "audit/rejected")}
            m |= one | {k: v for k, v in counts.items() if v}
        m["audit/in_flight"] = float(len(self.pending))
        return m

    def _overdue(self, p: _Pending, version: int) -> bool:
        """An audit whose weights are S versions old is waited for: no decision rests on older weights."""
        return version - p.version >= self.limit

    def _submit(self, p: _Pending, version: int) -> dict[str, float]:
        """Send one finished audit to the controller; an audit refused for NaN/Inf leaves the window as it was."""
        try:
            outcome = p.future.result()
            res = outcome.result
            out = self.controller.submit_audit(
                self.run_id, p.ready.audit_id,
                AuditIn(cosines=res.cosines, macro_cosines=res.macro_cosines or None, cosine_ci=res.cosine_ci or None,
                        stats={"elapsed_s": res.elapsed_s, "probes": float(len(p.staleness)),
                               "weights_version": float(outcome.version)}),
                idempotency_key=f"{self.run_id}-audit-{p.ready.audit_id}")
        except (InvalidInput, ValueError) as e:
            if not is_non_finite_audit(e):
                raise
            log.warning("audit %d rejected: %s", p.ready.audit_id, e)
            return {"audit/rejected": 1.0}
        m = {"audit/submitted": 1.0, "audit/id": float(p.ready.audit_id), "audit/time": res.elapsed_s,
             "audit/staleness_max": float(max(p.staleness)), "audit/staleness_mean": float(np.mean(p.staleness)),
             "audit/probe_tokens": p.probe_tokens}
        m |= outcome.is_metrics | lag_metrics(outcome, version)
        m |= {f"audit/micro_cos_{c}": v for c, v in res.cosines.items()}
        m |= {f"audit/macro_cos_{c}": v for c, v in res.macro_cosines.items()}
        m |= res.metrics()
        if self.schedule is not None:
            self.schedule.record(res.cosines)
        if out.decision is not None:
            m["audit/next_window"] = float(out.decision.window)
            self.decisions += 1
            self.changes += int(out.decision.window != self.window)
            self.window = out.decision.window  # a later audit collected in this step compares with it
            m["window/changes_per_audit"] = self.changes / self.decisions
        return m

    # --- 4. accounting and shutdown -------------------------------------------------------------

    def account(self, batch: Batch, window: int) -> dict[str, float]:
        self.window = window
        return self.ledger.record(batch, window, self.pool.tokens_generated)

    def totals(self) -> dict[str, float]:
        return self.ledger.totals(self.pool.tokens_generated)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()


def audit_settings(cfg: TrainConfig) -> AuditSettings:
    a, p = cfg.audit, cfg.probes
    return AuditSettings(candidates=list(cfg.window.candidates), method=a.method, metric=a.metric,
                         sketch_dim=a.sketch_dim, seed=cfg.seed, macro=a.macro, params=a.params,
                         estimator=a.estimator, ci_level=a.ci_level, ci_samples=a.ci_samples,
                         is_method=p.is_method, is_low=p.is_low, is_high=p.is_high, is_level=p.is_level,
                         micro_batch=cfg.optim.micro_batch_size, autocast=cfg.model.autocast)


def open_probe_side(cfg: TrainConfig, controller: ControllerAPI, run_id: str, parts: Parts, gen: Sampler,
                    optimizer: torch.optim.Optimizer, dist: LocalDist | None = None) -> ProbeSide:
    """The run's probe side; its workers (thread, Ray) start here when the policy is audited.

    Data-parallel (``dist`` of world > 1, inline backend; ``controller`` answers every rank alike): every
    rank keeps the same pool, each extends its share of a round (``RoundExtender``) and differentiates its
    share of an audited batch, combined exactly across ranks (``adwin.audit.combine``); the teacher drift
    diagnostics are computed on rank 0 only (it alone logs).
    """
    dist = dist or LocalDist()
    side = ProbeSide(controller, run_id, cfg.probes, ProbePool(cfg.rollout.max_response_len),
                     TokenLedger(cfg.rollout.max_response_len))
    if not (is_audited(cfg.window.policy) and cfg.probes.offers_per_step > 0):
        return side
    p, r = cfg.probes, cfg.rollout
    # inline probes continue on the rollout engine; the thread/Ray workers extend on their own replicas
    extend = RoundExtender(gen.generate, r.temperature, r.top_p, dist,
                           cfg.seed if r.seeding == "per_sample" else None, lambda: side.executor.version)
    side.executor = build_executor(p.backend, side.pool, parts.student, eos=gen.eos, pad_id=gen.pad,
                                   temperature=r.temperature, top_p=r.top_p, extend=extend, workers=p.workers,
                                   ray_address=p.ray_address, ray_num_cpus=p.ray_num_cpus,
                                   fault_policy=p.fault_policy, max_reissues=p.max_reissues, optimizer=optimizer)
    side.settings = audit_settings(cfg)
    if dist.world > 1:
        side.settings.extra["combine"] = dist
    a = cfg.audit
    if a.every > 1 or a.skip_margin > 0:
        side.schedule = AuditSchedule(threshold=cfg.window.threshold, every=a.every, skip_margin=a.skip_margin,
                                      skip_history=a.skip_history, max_skips=a.max_skips)
    side.score = parts.teachers.score
    if dist.is_main and parts.teachers.dense:  # drift/*: rank 0's; needs the teacher's full logits (not vLLM's)
        side.drift = partial(teacher_drift, parts.teachers.logits, candidates=tuple(cfg.window.candidates))
    side.pad_id = pad_id_of(parts.tokenizer, eos_ids(parts.student, parts.tokenizer))
    if cfg.audit.metric == "adam" and p.backend != "inline":
        side.adam_moments = lambda: adam_snapshot(optimizer, parts.student)
    return side
