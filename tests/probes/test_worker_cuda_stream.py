"""On CUDA a thread worker's jobs run on its own stream (the learner's kernels are not queued behind
them) and give the same audit as the inline one. Skipped without a CUDA GPU."""

from __future__ import annotations

import copy

import pytest
import torch
from test_worker_audit import CANDS, _batch, _close
from tiny_models import make_tiny_llama

from adwin.audit.job import AuditJob, AuditSettings, run_audit_job
from adwin.probes.executors import build_executor
from adwin.probes.pool import ProbePool
from adwin.probes.workers import ThreadWorker

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.device))


def test_thread_worker_audits_on_its_own_stream_and_matches_inline() -> None:
    student = make_tiny_llama(seed=1).cuda()
    settings = AuditSettings(candidates=CANDS, macro=False)
    seen: list[torch.cuda.Stream] = []
    ex = build_executor("thread", ProbePool(32), student, eos={2}, pad_id=0)
    try:
        _perturb(student, seed=2)
        ex.publish(1)
        at_v1 = copy.deepcopy(student)
        workers = [s.worker for s in ex.slots]
        assert all(isinstance(w, ThreadWorker) for w in workers)
        for w in workers:  # record the stream the audit runs on
            audit = w.audit
            w.audit = lambda job, audit=audit: (seen.append(torch.cuda.current_stream()), audit(job))[1]
        worker = ex.submit_audit(AuditJob(1, 1, _batch(), settings)).result(timeout=120)
    finally:
        ex.close()
    inline = run_audit_job(at_v1, AuditJob(1, 1, _batch(), settings))
    assert seen and all(s != torch.cuda.default_stream() for s in seen)
    assert all(v.is_cuda for v in ex._weights.values())  # the snapshot stays on the GPU
    assert _close(worker.result.cosines, inline.result.cosines)
