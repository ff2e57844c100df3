"""Audits off the learner: a worker computes the audit on its own replica under the published weights
version, and it equals the inline audit of the same probes under the same weights."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.audit.alignment import ProbeBatch
from adwin.audit.job import AuditJob, AuditSettings, adam_snapshot, run_audit_job
from adwin.probes.executors import build_executor
from adwin.probes.pool import ProbePool

pytestmark = pytest.mark.numerics  # parity of numbers across code paths: rerun per CPU capability

CANDS = [2, 4, 8]


def _batch(seed: int = 0, n: int = 4, prompt: int = 3, resp: int = 10) -> ProbeBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (n, prompt + resp), generator=g)  # (B, L)
    rm = torch.zeros_like(ids)
    rm[:, prompt:] = 1
    teacher = -torch.rand(ids.shape, generator=g) * 3 * rm  # (B, L)
    behavior = -torch.rand(ids.shape, generator=g) * 3 * rm  # (B, L)
    versions = torch.where(rm > 0, 0, -1)  # (B, L): every token from version 0
    return ProbeBatch(ids, torch.ones_like(ids), rm, teacher, behavior_logprobs=behavior, versions=versions)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def _close(a: dict[int, float], b: dict[int, float], tol: float = 1e-4) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= tol for k in a)


@pytest.mark.parametrize("is_method", ["none", "clip"])
def test_thread_worker_audit_equals_the_inline_audit_on_the_published_weights(is_method: str) -> None:
    student = make_tiny_llama(seed=1)
    settings = AuditSettings(candidates=CANDS, is_method=is_method, macro=False)
    ex = build_executor("thread", ProbePool(32), student, eos={2}, pad_id=0)
    try:
        _perturb(student, seed=2)
        ex.publish(1)  # version 1's weights are snapshotted now ...
        at_v1 = copy.deepcopy(student)
        job = AuditJob(audit_id=1, version=1, batch=_batch(), settings=settings)
        fut = ex.submit_audit(job)
        _perturb(student, seed=3)  # ... so the trainer may move on while the worker audits
        worker = fut.result(timeout=120)
    finally:
        ex.close()
    inline = run_audit_job(at_v1, AuditJob(audit_id=1, version=1, batch=_batch(), settings=settings))
    assert worker.version == 1 and worker.audit_id == 1  # tagged with the weights it ran under
    assert _close(worker.result.cosines, inline.result.cosines)
    moved = run_audit_job(student, AuditJob(audit_id=1, version=2, batch=_batch(), settings=settings))
    assert not _close(worker.result.cosines, moved.result.cosines, tol=1e-6), "the worker must not see later weights"


def test_adam_metric_off_the_learner_uses_the_snapshot_of_the_second_moments() -> None:
    student = make_tiny_llama(seed=1)
    opt = torch.optim.AdamW([{"params": [p for n, p in student.named_parameters() if "norm" in n], "weight_decay": 0.0},
                             {"params": [p for n, p in student.named_parameters() if "norm" not in n]}],
                            lr=1e-2, betas=(0.9, 0.95))
    for seed in range(3):  # a few real steps so that the second moments differ between parameters
        batch = _batch(seed)
        loss = student(input_ids=batch.input_ids).logits.float().pow(2).mean() * (seed + 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    settings = AuditSettings(candidates=CANDS, metric="adam", macro=False)
    job = AuditJob(audit_id=1, version=3, batch=_batch(9), settings=settings)
    with_optimizer = run_audit_job(student, job, optimizer=opt).result.cosines
    replica = copy.deepcopy(student)
    snap = AuditJob(audit_id=1, version=3, batch=_batch(9), settings=settings, adam_moments=adam_snapshot(opt, student))
    from_snapshot = run_audit_job(replica, snap).result.cosines
    identity = run_audit_job(replica, AuditJob(1, 3, _batch(9), AuditSettings(candidates=CANDS, macro=False)))
    assert _close(from_snapshot, with_optimizer, tol=1e-5)
    assert not _close(from_snapshot, identity.result.cosines, tol=1e-6), "the metric must change the cosines"


def test_inline_executor_audits_on_the_trainers_model_at_once() -> None:
    student = make_tiny_llama(seed=1)
    ex = build_executor("inline", ProbePool(32), student, eos={2}, pad_id=0)
    ex.publish(1)
    settings = AuditSettings(candidates=CANDS, macro=False)
    fut = ex.submit_audit(AuditJob(audit_id=7, version=1, batch=_batch(), settings=settings))
    assert fut.done()
    expected = run_audit_job(student, AuditJob(audit_id=7, version=1, batch=_batch(), settings=settings))
    assert fut.result().result.cosines == expected.result.cosines


def test_an_audit_for_weights_other_than_the_published_ones_is_refused() -> None:
    ex = build_executor("inline", ProbePool(32), make_tiny_llama(seed=1), eos={2}, pad_id=0)
    ex.publish(2)
    with pytest.raises(ValueError, match="published weights are version 2"):
        ex.submit_audit(AuditJob(audit_id=1, version=1, batch=_batch(), settings=AuditSettings(candidates=CANDS)))


def test_ray_worker_audit_equals_the_inline_audit(ray_cluster: None) -> None:
    student = make_tiny_llama(seed=1)
    settings = AuditSettings(candidates=CANDS, macro=False)
    ex = build_executor("ray", ProbePool(32), student, eos={2}, pad_id=0)
    try:
        _perturb(student, seed=2)
        ex.publish(1)
        worker = ex.submit_audit(AuditJob(audit_id=3, version=1, batch=_batch(), settings=settings)).result(timeout=180)
    finally:
        ex.close()
    inline = run_audit_job(student, AuditJob(audit_id=3, version=1, batch=_batch(), settings=settings))
    assert worker.version == 1 and _close(worker.result.cosines, inline.result.cosines)
