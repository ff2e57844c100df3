"""One audit as a self-contained job: what the learner hands to whoever computes it.

The same ``run_audit_job`` runs inline on the trainer's model (``probes.backend: inline``) and on a probe
worker's replica (``thread``, ``ray``), so a worker's audit equals the inline audit on the same weights
and probes. The job carries everything the computation needs and nothing that belongs to the learner:
the probe batch (teacher logprobs already scored), the audit and importance-weight settings, the
weights ``version`` the audit must run under, and for ``metric="adam"`` a name-keyed copy of AdamW's
second moments (the replica has no optimizer).

Why a worker may audit with weights that are a few steps old: see docs/decisions.md, "Audits off the
learner". In short, the audit's weights are the newest the worker has when the batch completes
(version ``v``, the same version the batch was formed at), the decision lands ``lag`` steps later, and
the probe tokens are at most ``S`` versions older than ``v`` with or without the move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from adwin.audit.alignment import AuditResult, ProbeBatch, audit
from adwin.audit.stale import stale_token_weights
from adwin.student.fsdp import full_tensor, full_weights, is_sharded


@dataclass
class AuditSettings:
    """The audit's knobs (``audit.*`` and the probe IS settings of the config), as plain values."""

    candidates: list[int]
    method: str = "fast"
    metric: str = "identity"
    sketch_dim: int | None = None
    seed: int = 0
    macro: bool = False  # per-sample cosines: telemetry only, several times the cost (docs/decisions.md)
    params: str = "all"
    estimator: str = "batch"
    ci_level: float | None = None
    ci_samples: int = 200
    is_method: str = "none"
    is_low: float = 0.5
    is_high: float = 2.0
    is_level: str = "token"
    micro_batch: int | None = None  # rows per forward/backward (optim.micro_batch_size); None: the whole batch
    autocast: str = "off"  # model.autocast of the audit's forwards
    evidence_audits: int = 1  # audit.evidence_audits: audits a decision pools (the probe client's, probes/evidence.py)
    evidence_decay: float = 0.7  # audit.evidence_decay
    extra: dict[str, Any] = field(default_factory=dict)  # further keyword arguments of ``audit``


@dataclass
class AuditJob:
    audit_id: int
    version: int  # the weights version the audit runs under (the worker loads it if its replica is older)
    batch: ProbeBatch
    settings: AuditSettings
    adam_moments: dict[str, Any] | None = None  # ``adam_snapshot(optimizer, model)`` for metric="adam"
    weights: Any = None  # that version's weights when the worker's replica is older, else None


@dataclass
class AuditOutcome:
    """A finished job: the audit, its IS diagnostics (``audit/is_*``) and where it ran."""

    audit_id: int
    version: int
    result: AuditResult
    is_metrics: dict[str, float]
    settings: AuditSettings | None = None  # what the audit ran with (the evidence pool keys its vectors on it)


def run_audit_job(model: torch.nn.Module, job: AuditJob, optimizer: Any = None) -> AuditOutcome:
    """Stale-probe IS weights under ``model``'s current weights, then the audit (``adwin.audit.alignment``).

    ``optimizer`` is the trainer's own (inline); a worker passes none and the job's ``adam_moments``
    stand in for it.
    """
    s = job.settings
    if is_sharded(model):  # FSDP2: the audit runs on the gathered weights, Adam's moments gathered by name
        moments = adam_snapshot(optimizer, model, device=None) if s.metric == "adam" and optimizer is not None \
            else job.adam_moments
        with full_weights(model):
            return _run(model, job, None if moments is None else adam_view(model, moments))
    if s.metric == "adam" and optimizer is None and job.adam_moments is not None:
        optimizer = adam_view(model, job.adam_moments)
    return _run(model, job, optimizer)


def _run(model: torch.nn.Module, job: AuditJob, optimizer: Any) -> AuditOutcome:
    s = job.settings
    weights, is_metrics = stale_token_weights(model, job.batch, s.is_method, s.is_low, s.is_high, job.version,
                                              level=s.is_level)
    result = audit(model, job.batch, s.candidates, method=s.method, metric=s.metric, optimizer=optimizer,
                   sketch_dim=s.sketch_dim, seed=s.seed, macro=s.macro, token_weights=weights, params=s.params,
                   estimator=s.estimator, ci_level=s.ci_level, ci_samples=s.ci_samples,
                   micro_batch=s.micro_batch, autocast=s.autocast, **s.extra)
    if s.evidence_audits <= 1:
        result.vectors = None  # only a pooled decision reads them; a Ray worker would ship megabytes for nothing
    return AuditOutcome(job.audit_id, job.version, result, is_metrics, job.settings)


def adam_snapshot(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                  device: str | None = "cpu") -> dict[str, Any]:
    """Name-keyed copy of what the ``adam`` metric reads: second moments, step, beta2, eps, amsgrad.

    A sharded optimizer's moments (DTensor shards, ``model.sharding: fsdp``) are gathered whole: an
    all-gather per parameter, in the same order on every rank. ``device`` None keeps them where they are.
    """
    name_of = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, Any] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            v = state.get("max_exp_avg_sq") if group.get("amsgrad") else state.get("exp_avg_sq")
            if v is None or "step" not in state or id(p) not in name_of:
                continue
            live = v.detach()
            w = full_tensor(live)  # a gathered DTensor is already a copy; a plain tensor must not alias the live state
            out[name_of[id(p)]] = {"v": w.to(w.device if device is None else device, copy=w is live),
                                   "step": float(full_tensor(torch.as_tensor(state["step"]))),
                                   "beta2": float(group["betas"][1]), "eps": float(group["eps"])}
    return out


def adam_view(model: torch.nn.Module, moments: Mapping[str, Any]) -> Any:
    """An object shaped like an AdamW optimizer over ``model``'s parameters, holding ``moments``.

    It only has what ``adwin.audit.grams`` reads (``param_groups``, ``state``); one group per parameter,
    since each may carry its own beta2/eps.
    """
    groups, state = [], {}
    for name, p in model.named_parameters():
        m = moments.get(name)
        if m is None:
            continue
        groups.append({"params": [p], "betas": (0.9, m["beta2"]), "eps": m["eps"], "amsgrad": False})
        state[p] = {"exp_avg_sq": m["v"].to(p.device), "step": torch.tensor(m["step"])}
    return SimpleNamespace(param_groups=groups, state=state)


def lag_metrics(outcome: AuditOutcome, version_now: int) -> dict[str, float]:
    """``audit/weights_version``: the weights the audit ran under; ``audit/lag_steps``: steps since then."""
    return {"audit/weights_version": float(outcome.version), "audit/lag_steps": float(version_now - outcome.version)}

