"""The trainer's probe side (ADWIN section 4.2): offer unfinished prefixes, run the controller's probe plan,
audit a ready probe batch and submit the cosines."""

from __future__ import annotations

import logging

import numpy as np
import torch

from adwin.accounting import TokenLedger
from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import AuditIn, OfferIn, ProbeOfferItem
from adwin.parts import Parts
from adwin.probes.pool import InlineProbeExecutor, Probe, ProbePool
from adwin.rollout import eos_ids, pad_id_of
from adwin.step import Batch

log = logging.getLogger(__name__)

def offer_prefixes(controller: ControllerAPI, run_id: str, step: int, batch: Batch, behavior: torch.Tensor,
                   pool: ProbePool, window: int) -> dict[str, float]:
    """Offer this step's unfinished prefixes; the ones the controller accepts enter the pool.

    At the full horizon nothing is unfinished, yet the window must still be able to shrink again: then
    every rollout is offered as an already complete probe (a full rollout costs no extension at all).
    """
    at_horizon = window >= pool.max_response_len
    picks = [b for b, done in enumerate(batch.finished) if at_horizon or not done]
    items = {f"s{step}-{b}": b for b in picks}
    offers = [ProbeOfferItem(sample_id=sid, prompt_id=batch.prompts[b].id, response_len=len(batch.response_ids[b]),
                             version=step) for sid, b in items.items()]
    accepted = controller.offer_probes(run_id, OfferIn(step=step, offers=offers),
                                       idempotency_key=f"{run_id}-offer-{step}").accepted if offers else []
    for sid in accepted:
        b = items[sid]
        n_p, n_r = len(batch.prompt_ids[b]), len(batch.response_ids[b])
        lp = behavior[b, n_p : n_p + n_r].tolist()
        pool.add(Probe(sid, list(batch.prompt_ids[b]), list(batch.response_ids[b]), [step] * n_r, lp,
                       batch.prompts[b].route, submitted_step=step,
                       finished=batch.finished[b] or n_r >= pool.max_response_len))
    return {"probe/offered": float(len(offers)), "probe/accepted": float(len(accepted))}


def extend_probes(controller: ControllerAPI, run_id: str, version: int, executor: InlineProbeExecutor,
                  pool: ProbePool, ledger: TokenLedger, limit: int) -> dict[str, float]:
    """One probe round under the controller's plan with weights ``version``; report every probe."""
    plan = controller.probe_plan(run_id, version)
    stats = executor.run_round(plan, version)
    for rep in stats.reports:
        controller.report_probe(run_id, rep, idempotency_key=f"{run_id}-probe-{rep.probe_id}-{version}")
        probe = pool.get(rep.probe_id) if rep.probe_id in pool else None
        if rep.finished and probe is not None and probe.versions and probe.versions[-1] > probe.submitted_step:
            ledger.completed_lengths.append(len(probe.response_ids))  # a truncated sample's full length
    # Staleness of every probe this round touched (extended or force-completed): the controller forces
    # completion when it reaches S, so anything above S is a scheduling bug, not a tuning matter.
    stale = [pool.get(r.probe_id).staleness(version) for r in stats.reports if r.probe_id in pool]
    if stale and max(stale) > limit:
        raise RuntimeError(f"probe staleness {max(stale)} exceeds the limit S={limit} at version {version}")
    return {"probe/active": float(len(plan.active)), "probe/forced": float(stats.forced),
            "probe/completed": float(stats.completed), "probe/tokens": float(stats.tokens), "probe/pool": float(len(pool)),
            "probe/staleness_max": float(max(stale, default=0)),
            "probe/staleness_mean": float(np.mean(stale)) if stale else 0.0}


def audit_ready_batch(controller: ControllerAPI, run_id: str, pool: ProbePool, parts: Parts, cfg: TrainConfig,
                      optimizer: torch.optim.Optimizer, version: int) -> dict[str, float]:
    """When P probes are complete: audit them under the current weights and submit the cosines."""
    from adwin.alignment import audit

    ready = controller.next_probe_batch(run_id, idempotency_key=f"{run_id}-batch-{version}")
    if ready is None:
        return {}
    probes = pool.pop(ready.probe_ids)
    stale = [p.staleness(version) for p in probes]
    if max(stale) > cfg.probes.staleness_limit:  # complete probes can wait in the queue past S
        log.warning("audit %d consumes probes %d steps stale (S=%d): they waited complete for a batch to fill",
                    ready.audit_id, max(stale), cfg.probes.staleness_limit)
    batch = pool.probe_batch(probes, pad_id_of(parts.tokenizer, eos_ids(parts.student, parts.tokenizer)),
                             parts.teachers.score)
    res = audit(parts.student, batch, cfg.window.candidates, method=cfg.audit.method, metric=cfg.audit.metric,
                optimizer=optimizer, sketch_dim=cfg.audit.sketch_dim, seed=cfg.seed)
    out = controller.submit_audit(run_id, ready.audit_id,
                                  AuditIn(cosines=res.cosines, macro_cosines=res.macro_cosines or None,
                                          stats={"elapsed_s": res.elapsed_s, "probes": float(len(probes))}),
                                  idempotency_key=f"{run_id}-audit-{ready.audit_id}")
    m = {"audit/id": float(ready.audit_id), "audit/time": res.elapsed_s, "audit/staleness_max": float(max(stale)),
         "audit/staleness_mean": float(np.mean(stale)), "audit/probe_tokens": float(batch.response_mask.sum())}
    m |= {f"audit/micro_cos_{c}": v for c, v in res.cosines.items()}
    m |= {f"audit/macro_cos_{c}": v for c, v in res.macro_cosines.items()}
    if out.decision is not None:
        m["audit/next_window"] = float(out.decision.window)
    return m


