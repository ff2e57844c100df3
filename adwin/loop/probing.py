"""The trainer's probe side (ADWIN section 4.2): offer unfinished prefixes, run the controller's probe plan,
audit a ready probe batch and submit the cosines."""

from __future__ import annotations

import logging

import numpy as np
import torch

from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import AuditIn, OfferIn, ProbeOfferItem
from adwin.loop.accounting import TokenLedger
from adwin.loop.parts import Parts
from adwin.loop.step import Batch, Sampler
from adwin.probes.async_executor import AsyncProbeExecutor
from adwin.probes.executors import build_executor
from adwin.probes.pool import Probe, ProbePool
from adwin.sampling.rollout import eos_ids, pad_id_of

log = logging.getLogger(__name__)

def offer_prefixes(controller: ControllerAPI, run_id: str, step: int, batch: Batch, behavior: torch.Tensor,
                   pool: ProbePool, window: int, offer_finished: str = "at_horizon") -> dict[str, float]:
    """Offer this step's unfinished prefixes; the ones the controller accepts enter the pool.

    At the full horizon nothing is unfinished, yet the window must still be able to shrink again: then
    every rollout is offered as an already complete probe (a full rollout costs no extension at all).
    ``offer_finished="always"`` offers finished rollouts at every window, so that a window almost every
    rollout fits into still produces probes (docs/decisions.md, "Finished rollouts as probes").
    """
    offer_all = offer_finished == "always" or window >= pool.max_response_len
    picks = [b for b, done in enumerate(batch.finished) if offer_all or not done]
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


def make_executor(cfg: TrainConfig, pool: ProbePool, parts: Parts, gen: Sampler) -> AsyncProbeExecutor:
    """The configured probe backend. Inline rounds use the trainer's sampler; thread and Ray workers a replica."""
    p, r = cfg.probes, cfg.rollout
    return build_executor(p.backend, pool, parts.student, eos=gen.eos, pad_id=gen.pad, temperature=r.temperature,
                          top_p=r.top_p, extend=gen.extend, workers=p.workers, ray_address=p.ray_address,
                          ray_num_cpus=p.ray_num_cpus, fault_policy=p.fault_policy, max_reissues=p.max_reissues)


def extend_probes(controller: ControllerAPI, run_id: str, version: int, executor: AsyncProbeExecutor,
                  pool: ProbePool, ledger: TokenLedger, limit: int) -> dict[str, float]:
    """Publish weights ``version`` to the workers and advance the probe rounds; report every probe.

    Returns at once unless the plan force-completes probes at the staleness limit (``probe/blocked_s``;
    with the inline backend every round blocks). Rounds in flight keep running into the next step.
    """
    sync_s = executor.publish(version)
    stats = executor.advance(controller, run_id, version)
    for rep in stats.reports:
        probe = pool.get(rep.probe_id) if rep.probe_id in pool else None
        if rep.finished and probe is not None and probe.versions and probe.versions[-1] > probe.submitted_step:
            ledger.completed_lengths.append(len(probe.response_ids))  # a truncated sample's full length
    # Staleness of every probe this round touched (extended or force-completed): the controller forces
    # completion when it reaches S, so anything above S is a scheduling bug, not a tuning matter.
    stale = [pool.get(r.probe_id).staleness(version) for r in stats.reports if r.probe_id in pool]
    if stale and max(stale) > limit:
        raise RuntimeError(f"probe staleness {max(stale)} exceeds the limit S={limit} at version {version}")
    expired = pool.evict_complete_past(version, limit)  # the controller expires them: they can never be audited
    return {"probe/active": float(stats.active), "probe/forced": float(stats.forced),
            "probe/completed": float(stats.completed), "probe/tokens": float(stats.tokens), "probe/pool": float(len(pool)),
            "probe/staleness_max": float(max(stale, default=0)),
            "probe/staleness_mean": float(np.mean(stale)) if stale else 0.0,
            "probe/blocked_s": stats.blocked_s, "probe/sync_s": sync_s, "probe/in_flight": float(stats.in_flight),
            "probe/submitted": float(stats.submitted), "probe/reissued": float(stats.reissued),
            "probe/lost": float(stats.lost), "probe/worker_restarts": float(stats.restarts),
            "probe/evicted": float(expired)}


def audit_ready_batch(controller: ControllerAPI, run_id: str, pool: ProbePool, parts: Parts, cfg: TrainConfig,
                      optimizer: torch.optim.Optimizer, version: int) -> dict[str, float]:
    """When P probes are complete: audit them under the current weights and submit the cosines."""
    from adwin.audit.alignment import audit
    from adwin.audit.stale import stale_token_weights

    ready = controller.next_probe_batch(run_id, step=version, idempotency_key=f"{run_id}-batch-{version}")
    if ready is None:
        return {}
    probes = pool.pop(ready.probe_ids)
    stale = [p.staleness(version) for p in probes]
    if max(stale) > cfg.probes.staleness_limit:  # complete probes can wait in the queue past S
        log.warning("audit %d consumes probes %d steps stale (S=%d): they waited complete for a batch to fill",
                    ready.audit_id, max(stale), cfg.probes.staleness_limit)
    batch = pool.probe_batch(probes, pad_id_of(parts.tokenizer, eos_ids(parts.student, parts.tokenizer)),
                             parts.teachers.score)
    pc = cfg.probes
    weights, is_metrics = stale_token_weights(parts.student, batch, pc.is_method, pc.is_low, pc.is_high, version,
                                              level=pc.is_level)
    res = audit(parts.student, batch, cfg.window.candidates, method=cfg.audit.method, metric=cfg.audit.metric,
                optimizer=optimizer, sketch_dim=cfg.audit.sketch_dim, seed=cfg.seed, token_weights=weights)
    out = controller.submit_audit(run_id, ready.audit_id,
                                  AuditIn(cosines=res.cosines, macro_cosines=res.macro_cosines or None,
                                          stats={"elapsed_s": res.elapsed_s, "probes": float(len(probes))}),
                                  idempotency_key=f"{run_id}-audit-{ready.audit_id}")
    m = {"audit/id": float(ready.audit_id), "audit/time": res.elapsed_s, "audit/staleness_max": float(max(stale)),
         "audit/staleness_mean": float(np.mean(stale)), "audit/probe_tokens": float(batch.response_mask.sum())}
    m |= is_metrics
    m |= {f"audit/micro_cos_{c}": v for c, v in res.cosines.items()}
    m |= {f"audit/macro_cos_{c}": v for c, v in res.macro_cosines.items()}
    if out.decision is not None:
        m["audit/next_window"] = float(out.decision.window)
    return m




def audit_or_keep_window(controller: ControllerAPI, run_id: str, pool: ProbePool, parts: Parts, cfg: TrainConfig,
                         optimizer: torch.optim.Optimizer, version: int) -> dict[str, float]:
    """``audit_ready_batch``, except that an audit refused for NaN/Inf leaves the window where it was."""
    from adwin.controller.api import InvalidInput
    from adwin.runtime.guards import is_non_finite_audit

    try:
        return audit_ready_batch(controller, run_id, pool, parts, cfg, optimizer, version)
    except (InvalidInput, ValueError) as e:
        if not is_non_finite_audit(e):
            raise
        log.warning("audit rejected: %s", e)
        return {"audit/rejected": 1.0}
