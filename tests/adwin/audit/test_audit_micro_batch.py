"""The audit under the trainer's memory options: micro-batches (``optim.micro_batch_size``), activation
checkpointing and bf16 autocast (``model.*``), through the job a probe worker runs."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.audit.alignment import ProbeBatch, audit
from adwin.audit.job import AuditJob, AuditSettings, run_audit_job
from adwin.config import load_config
from adwin.loop.memory import enable_checkpointing, training_forward

CANDS = [4, 8, 16]


def probe_batch(n: int = 6, seed: int = 0) -> ProbeBatch:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, 7, (n,), generator=g).tolist()
    resp = torch.randint(5, 30, (n,), generator=g).tolist()
    width = max(p + r for p, r in zip(prompt, resp, strict=True)) + 2
    ids = torch.randint(3, 64, (n, width), generator=g)
    am, rm = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, (p, r) in enumerate(zip(prompt, resp, strict=True)):
        am[b, : p + r] = 1
        rm[b, p : p + r] = 1
        ids[b, p + r :] = 0
    return ProbeBatch(ids, am, rm, -torch.rand(n, width, generator=g) * 4 * rm)


def job(settings: AuditSettings) -> AuditJob:
    return AuditJob(audit_id=0, version=0, batch=probe_batch(), settings=settings)


def assert_same_cosines(a: dict[int, float], b: dict[int, float], tol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for c in a:
        assert b[c] == pytest.approx(a[c], abs=tol), c


@pytest.mark.parametrize("method", ["fast", "sketch"])
def test_the_audit_job_in_micro_batches_equals_the_whole_batch_audit(method: str) -> None:
    model = make_tiny_llama(seed=1)
    base = dict(candidates=CANDS, method=method, sketch_dim=4096)
    whole = run_audit_job(model, job(AuditSettings(**base))).result
    for mb in (1, 4):  # 4: rows 4 + 2
        micro = run_audit_job(model, job(AuditSettings(**base, micro_batch=mb))).result
        assert_same_cosines(whole.cosines, micro.cosines)
        assert micro.tokens_per_segment == whole.tokens_per_segment


def test_per_sample_audits_forward_at_most_micro_batch_rows_at_a_time() -> None:
    model, batch = make_tiny_llama(seed=1), probe_batch()
    ref = audit(model, batch, CANDS, macro=True)
    seen: list[int] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda _m, a, _o: seen.append(a[0].shape[0]))
    got = audit(model, batch, CANDS, macro=True, micro_batch=4)
    hook.remove()
    assert max(seen) <= 4
    assert_same_cosines(ref.cosines, got.cosines)
    assert_same_cosines(ref.macro_cosines, got.macro_cosines)


def test_the_trainer_ships_its_micro_batch_size_and_autocast_to_the_audit() -> None:
    from adwin.probes.settings import run_audit_settings

    s = run_audit_settings(load_config(None, {"optim.micro_batch_size": 3, "model.autocast": "bf16"}))
    assert (s.micro_batch, s.autocast) == (3, "bf16")
    assert run_audit_settings(load_config(None)).micro_batch is None


def test_activation_checkpointing_leaves_the_audit_unchanged() -> None:
    """HF drops the KV cache the chunked audit reads while a checkpointed layer trains; the audit runs in eval
    mode, where checkpointing is off, also when it starts from inside the training forward's state."""
    batch = probe_batch()
    plain = audit(make_tiny_llama(seed=1), batch, CANDS, macro=False)
    model = make_tiny_llama(seed=1)
    enable_checkpointing(model)
    with training_forward(model, load_config(None, {"model.gradient_checkpointing": True})):
        inside = audit(model, batch, CANDS, macro=False)
    after = audit(model, batch, CANDS, macro=False)
    assert_same_cosines(plain.cosines, inside.cosines)
    assert_same_cosines(plain.cosines, after.cosines)


def test_bf16_autocast_runs_the_audit_forward_in_bf16_close_to_float32() -> None:
    model = make_tiny_llama(seed=1)
    dtypes: list[torch.dtype] = []
    model.lm_head.register_forward_hook(lambda _m, _a, out: dtypes.append(out.dtype))
    fp32 = run_audit_job(model, job(AuditSettings(candidates=CANDS))).result
    bf16 = run_audit_job(model, job(AuditSettings(candidates=CANDS, autocast="bf16"))).result
    assert dtypes[0] == torch.float32 and dtypes[-1] == torch.bfloat16
    assert_same_cosines(fp32.cosines, bf16.cosines, tol=0.05)
