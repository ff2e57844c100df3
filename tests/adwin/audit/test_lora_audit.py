"""The audit of a LoRA student: cosines over the adapters' gradients, which are the full fine-tuning gradient
pushed through the LoRA Jacobian (docs/decisions.md, "LoRA students")."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.audit.alignment import ProbeBatch, audit
from adwin.audit.params import audited_parameters
from adwin.config import LoraSection
from adwin.objectives.losses import reverse_kl_pg, token_logprobs
from adwin.student.lora import apply_lora, trainable_named_parameters

peft = pytest.importorskip("peft")  # the lora extra

CANDS = [4, 8, 16]
SCALE = 8.0 / 4  # alpha / r of the students below


def _batch(seed: int = 0) -> ProbeBatch:
    """Four right-padded probes of 3-9 prompt and 6-30 response tokens, teacher logprobs on the responses."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = (5, 9, 3, 7), (30, 12, 24, 6)
    length = max(p + r for p, r in zip(prompts, responses, strict=True)) + 2
    ids = torch.randint(3, 64, (4, length), generator=g)
    am, rm = torch.zeros(4, length, dtype=torch.long), torch.zeros(4, length, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        am[b, : p + r], rm[b, p : p + r] = 1, 1
        ids[b, p + r :] = 0
    return ProbeBatch(ids, am, rm, (-torch.rand(4, length, generator=g, dtype=torch.float64) * 4 * rm))


def _student(trained: bool = True) -> torch.nn.Module:
    """A float64 LoRA student (so hand and audit agree to 1e-6); ``trained``: adapters moved off peft's init."""
    student = apply_lora(make_tiny_llama(seed=2).double(), LoraSection(r=4, alpha=8))
    if trained:
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for _, p in trainable_named_parameters(student):
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.2)
    return student


def _segment_losses(model: torch.nn.Module, batch: ProbeBatch) -> list[torch.Tensor]:
    """The OPD loss summed over each segment [0, 4), [4, 8), [8, 16), [16, inf) of the responses, by hand."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    per = reverse_kl_pg(token_logprobs(logits, batch.input_ids), batch.teacher_logprobs, batch.response_mask.double())
    pos = batch.response_mask.cumsum(1) - 1  # (B, L) response position
    edges = [0, *CANDS, 10**9]
    spans = zip(edges, edges[1:], strict=False)
    return [(per * ((batch.response_mask > 0) & (pos >= lo) & (pos < hi))).sum() for lo, hi in spans]


def _hand_cosines(model: torch.nn.Module, batch: ProbeBatch, weight: torch.Tensor | None = None) -> dict[int, float]:
    params = [p for _, p in trainable_named_parameters(model)]
    segs = []
    for loss in _segment_losses(model, batch):
        grads = torch.autograd.grad(loss, params, retain_graph=True)
        segs.append(torch.cat([g.reshape(-1) for g in grads]))
    w = torch.ones_like(segs[0]) if weight is None else weight
    full = sum(segs)
    out = {}
    for k, c in enumerate(CANDS):
        prefix = sum(segs[: k + 1])
        out[c] = float((prefix * w * full).sum() / ((prefix * w * prefix).sum() * (full * w * full).sum()).sqrt())
    return out


@pytest.mark.parametrize("method", ["reference", "fast"])
def test_lora_cosines_equal_the_hand_computed_adapter_gradient_cosines(method: str) -> None:
    student, batch = _student(), _batch()
    hand = _hand_cosines(student, batch)
    res = audit(student, batch, CANDS, method=method, macro=False)
    for c in CANDS:
        assert res.cosines[c] == pytest.approx(hand[c], abs=1e-6)
    assert len({round(v, 4) for v in hand.values()}) == len(CANDS)  # informative: the candidates differ


def test_lora_adam_cosines_weight_the_adapter_gradients_by_the_adapters_second_moments() -> None:
    student, batch = _student(), _batch()
    params = [p for _, p in trainable_named_parameters(student)]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-6)
    for seed in (1, 2):  # two steps: every adapter gets a second moment
        opt.zero_grad()
        sum(_segment_losses(student, _batch(seed))).backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    weight = torch.cat([(1.0 / ((opt.state[p]["exp_avg_sq"] / (1 - 0.95**2)).sqrt() + 1e-6)).reshape(-1)
                        for p in params])
    hand = _hand_cosines(student, batch, weight)
    res = audit(student, batch, CANDS, method="fast", metric="adam", optimizer=opt, macro=False)
    for c in CANDS:
        assert res.cosines[c] == pytest.approx(hand[c], abs=1e-6)
    assert max(abs(hand[c] - _hand_cosines(student, batch)[c]) for c in CANDS) > 1e-4  # the metric matters


def test_adapter_gradients_are_the_full_gradient_through_the_lora_jacobian() -> None:
    """grad_B = s G A^T and grad_A = s B^T G, with G the full fine-tuning gradient of the merged weight."""
    student, batch = _student(), _batch()
    merged = copy.deepcopy(student).merge_and_unload().requires_grad_(True)  # full fine-tuning of the merged weights
    loss = sum(_segment_losses(student, batch)[:2])  # the prefix of window 8
    lora = dict(zip([n for n, _ in trainable_named_parameters(student)],
                    torch.autograd.grad(loss, [p for _, p in trainable_named_parameters(student)]), strict=True))
    full_loss = sum(_segment_losses(merged, batch)[:2])
    weights = dict(merged.named_parameters())
    full = dict(zip(weights, torch.autograd.grad(full_loss, list(weights.values())), strict=True))
    for name, module in student.named_modules():
        if not hasattr(module, "lora_A"):
            continue
        key = name.removeprefix("base_model.model.") + ".weight"
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight  # (r, in), (out, r)
        g = full[key]  # (out, in)
        torch.testing.assert_close(lora[f"{name}.lora_B.default.weight"], SCALE * g @ a.T, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(lora[f"{name}.lora_A.default.weight"], SCALE * b.T @ g, rtol=1e-9, atol=1e-12)


def test_at_peft_init_b_is_zero_so_the_first_audit_sees_only_the_b_gradients() -> None:
    student, batch = _student(trained=False), _batch()
    params = trainable_named_parameters(student)
    grads = torch.autograd.grad(sum(_segment_losses(student, batch)), [p for _, p in params])
    for (name, _), g in zip(params, grads, strict=True):
        if ".lora_A." in name:
            assert float(g.abs().max()) == 0.0, name
        else:
            assert float(g.abs().max()) > 0.0, name
    # the audit is then the one over the B matrices alone
    only_b = copy.deepcopy(student)
    for name, p in only_b.named_parameters():
        if ".lora_A." in name:
            p.requires_grad_(False)
    whole, b_only = audit(student, batch, CANDS, macro=False), audit(only_b, batch, CANDS, macro=False)
    for c in CANDS:
        assert whole.cosines[c] == pytest.approx(b_only.cosines[c], abs=1e-9)


def test_top_n_audits_the_adapters_of_the_upper_blocks_only() -> None:
    student = _student()
    names = [n for n, _ in audited_parameters(student, "top:1")]
    assert names and all(".layers.1." in n and "lora_" in n for n in names)
    assert len(names) == 14  # 7 projections x (A, B) of the last block
