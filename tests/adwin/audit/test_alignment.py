"""The prefix-full alignment audit: the three methods agree, the metric, masks and side effects."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import make_tiny_llama

from adwin.audit.alignment import (
    AuditResult,
    ProbeBatch,
    audit,
    cosines_from_gram,
    countsketch_hashes,
    gram_from_sketches,
)

CANDS = [4, 8, 16, 32]  # 32 exceeds two of the responses below


def make_tiny_qwen3(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,  # a shared parameter must be counted once
        pad_token_id=0,
    )
    return Qwen3ForCausalLM(cfg).eval()


def make_batch(
    prompt_lens: list[int] = (5, 9, 3, 12), response_lens: list[int] = (40, 20, 55, 30), seed: int = 0
) -> ProbeBatch:
    """Variable prompt lengths, right padding, teacher logprobs only on the response."""
    g = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    length = max(p + r for p, r in zip(prompt_lens, response_lens, strict=True)) + 3  # >= 3 pad columns
    ids = torch.randint(3, 64, (n, length), generator=g)
    am = torch.zeros(n, length, dtype=torch.long)
    rm = torch.zeros(n, length, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        am[b, : p + r] = 1
        rm[b, p : p + r] = 1
        ids[b, p + r :] = 0  # pad id
    teacher = -torch.rand(n, length, generator=g) * 4 * rm
    return ProbeBatch(ids, am, rm, teacher)


def assert_same_audit(a: AuditResult, b: AuditResult, tol: float = 1e-4, macro: bool = True) -> None:
    assert a.candidates == b.candidates
    for c in a.candidates:
        assert a.cosines[c] == pytest.approx(b.cosines[c], abs=tol)
        if macro:
            assert a.macro_cosines[c] == pytest.approx(b.macro_cosines[c], abs=tol)
    scale = np.abs(a.gram).max()
    assert np.abs(a.gram - b.gram).max() <= tol * scale
    assert a.tokens_per_segment == b.tokens_per_segment


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return make_tiny_llama()


@pytest.fixture(scope="module")
def batch() -> ProbeBatch:
    return make_batch()


@pytest.mark.parametrize("maker", [make_tiny_llama, make_tiny_qwen3], ids=["llama", "qwen3"])
def test_fast_matches_reference_on_every_candidate(maker) -> None:
    model = maker()
    batch = make_batch()
    ref = audit(model, batch, CANDS, method="reference")
    fast = audit(model, batch, CANDS, method="fast")
    assert_same_audit(ref, fast)
    # and the candidates are informative: cosines differ, increase towards the full window here
    assert len({round(v, 3) for v in ref.cosines.values()}) == len(CANDS)
    for c in CANDS:
        assert fast.grad_norms[c] == pytest.approx(ref.grad_norms[c], rel=1e-4)


def test_fast_without_macro_and_in_micro_batches_matches_reference(llama, batch) -> None:
    ref = audit(llama, batch, CANDS, method="reference", macro=False)
    whole = audit(llama, batch, CANDS, method="fast", macro=False)
    pieces = audit(llama, batch, CANDS, method="fast", macro=False, micro_batch=3)
    assert ref.macro_cosines == {} and whole.macro_cosines == {}
    assert_same_audit(ref, whole, macro=False)
    assert_same_audit(ref, pieces, macro=False)


def test_tokens_per_segment_counts_response_tokens_by_candidate(llama, batch) -> None:
    res = audit(llama, batch, CANDS, method="fast", macro=False)
    # responses 40, 20, 55, 30 split at 4, 8, 16, 32
    assert res.tokens_per_segment == [4 * 4, 4 * 4, 8 * 4, 16 + 4 + 16 + 14, 8 + 0 + 23 + 0]
    assert sum(res.tokens_per_segment) == int(batch.response_mask.sum())


def test_sketch_cosines_are_within_0_02_of_exact(llama, batch) -> None:
    ref = audit(llama, batch, CANDS, method="reference")
    sk = audit(llama, batch, CANDS, method="sketch", sketch_dim=16384, seed=3)
    assert sk.sketch is not None and sk.sketch.shape == (len(CANDS) + 1, 16384)
    for c in CANDS:
        assert sk.cosines[c] == pytest.approx(ref.cosines[c], abs=0.02)
        assert sk.macro_cosines[c] == pytest.approx(ref.macro_cosines[c], abs=0.02)
    np.testing.assert_allclose(sk.gram, gram_from_sketches(sk.sketch), rtol=1e-5)


def test_candidate_covering_every_response_has_cosine_one(llama, batch) -> None:
    cands = [8, 55, 100]  # the longest response has 55 tokens
    for method in ("reference", "fast", "sketch"):
        res = audit(llama, batch, cands, method=method)
        assert res.cosines[55] == pytest.approx(1.0, abs=1e-6)
        assert res.cosines[100] == pytest.approx(1.0, abs=1e-6)
        assert res.macro_cosines[100] == pytest.approx(1.0, abs=1e-6)
        assert res.cosines[8] < 0.99
        assert res.tokens_per_segment[-1] == 0 and res.tokens_per_segment[-2] == 0
        assert res.grad_norms[55] == pytest.approx(res.grad_norms[100], rel=1e-6)


def test_sketches_of_shards_add_up_to_the_sketch_of_the_batch(llama, batch) -> None:
    def rows(sl: slice) -> ProbeBatch:
        return ProbeBatch(
            batch.input_ids[sl], batch.attention_mask[sl], batch.response_mask[sl], batch.teacher_logprobs[sl]
        )

    whole = audit(llama, batch, CANDS, method="sketch", sketch_dim=4096, seed=7, macro=False)
    a = audit(llama, rows(slice(0, 1)), CANDS, method="sketch", sketch_dim=4096, seed=7, macro=False)
    b = audit(llama, rows(slice(1, 4)), CANDS, method="sketch", sketch_dim=4096, seed=7, macro=False)
    scale = np.abs(whole.sketch).max()
    assert np.abs(a.sketch + b.sketch - whole.sketch).max() <= 1e-5 * scale
    merged = cosines_from_gram(gram_from_sketches([a.sketch, b.sketch]), CANDS)
    for c in CANDS:
        assert merged[c] == pytest.approx(whole.cosines[c], abs=1e-5)
    # a different seed is a different sketch of the same gradients
    other = audit(llama, batch, CANDS, method="sketch", sketch_dim=4096, seed=8, macro=False)
    assert np.abs(other.sketch - whole.sketch).max() > 0.1 * scale


def test_sketch_hashes_are_identical_in_a_fresh_process() -> None:
    bucket, sign = countsketch_hashes("model.layers.0.mlp.up_proj.weight", 5000, seed=11, dim=97)
    code = (
        "import json; from adwin.audit.alignment import countsketch_hashes as h; "
        "b, s = h('model.layers.0.mlp.up_proj.weight', 5000, seed=11, dim=97); "
        "print(json.dumps([b.tolist(), s.tolist()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    b2, s2 = json.loads(out.stdout)
    assert bucket.tolist() == b2 and sign.tolist() == s2
    assert 0 <= int(bucket.min()) and int(bucket.max()) < 97
    assert set(sign.tolist()) == {-1.0, 1.0}
    counts = torch.bincount(bucket, minlength=97).float()
    assert counts.min() > 20 and counts.max() < 90  # roughly uniform: 5000 / 97 ~ 52 per bucket
    assert abs(float(sign.mean())) < 0.1


def _adamw_after_steps(model: torch.nn.Module, batch: ProbeBatch) -> torch.optim.AdamW:
    """AdamW with state on every parameter except lm_head (left out of the optimizer: weight 1)."""
    params = [p for n, p in model.named_parameters() if not n.startswith("lm_head")]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-6)
    for _ in range(3):
        opt.zero_grad()
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        out.float().pow(2).mean().backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def test_adam_metric_equals_an_explicit_weighted_inner_product(batch) -> None:
    from adwin.objectives.losses import reverse_kl_pg, token_logprobs

    model = make_tiny_llama(seed=2)
    opt = _adamw_after_steps(model, batch)
    # explicit: per-segment gradients, then sum_i w_i a_i b_i with w = 1 / (sqrt(v / (1 - b2^t)) + eps)
    weights = []
    for n, p in model.named_parameters():
        st = opt.state.get(p)
        if n.startswith("lm_head"):
            assert not st
            weights.append(torch.ones_like(p).reshape(-1).double())
        else:
            t = float(st["step"])
            v_hat = st["exp_avg_sq"].double() / (1 - 0.95**t)
            weights.append((1.0 / (v_hat.sqrt() + 1e-6)).reshape(-1))
    w = torch.cat(weights)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = token_logprobs(logits, batch.input_ids)
    per = reverse_kl_pg(logp, batch.teacher_logprobs.float(), batch.response_mask.float())
    res0 = audit(model, batch, CANDS, method="fast", macro=False)
    seg_edges = [0, *CANDS, 10**9]
    pos = batch.response_mask.cumsum(1) - 1
    rows = []
    for lo, hi in zip(seg_edges, seg_edges[1:], strict=False):
        m = (batch.response_mask > 0) & (pos >= lo) & (pos < hi)
        gs = torch.autograd.grad((per * m).sum(), list(model.parameters()), retain_graph=True)
        rows.append(torch.cat([g.reshape(-1).double() for g in gs]))
    mat = torch.stack(rows)
    explicit = ((mat * w) @ mat.T).numpy()
    expected = cosines_from_gram(explicit, CANDS)
    for method in ("reference", "fast"):
        res = audit(model, batch, CANDS, method=method, metric="adam", optimizer=opt)
        assert res.metric == "adam"
        np.testing.assert_allclose(res.gram, explicit, rtol=1e-4, atol=1e-4 * np.abs(explicit).max())
        for c in CANDS:
            assert res.cosines[c] == pytest.approx(expected[c], abs=1e-4)
    sk = audit(model, batch, CANDS, method="sketch", metric="adam", optimizer=opt, sketch_dim=16384)
    for c in CANDS:
        assert sk.cosines[c] == pytest.approx(expected[c], abs=0.02)
    # the metric matters: the adam cosines are not the identity ones
    assert max(abs(expected[c] - res0.cosines[c]) for c in CANDS) > 1e-3


def test_tokens_off_the_response_mask_change_nothing(llama, batch) -> None:
    base = audit(llama, batch, CANDS, method="fast")
    off = batch.response_mask == 0
    pad = batch.attention_mask == 0
    teacher = torch.where(off, torch.full_like(batch.teacher_logprobs, -123.0), batch.teacher_logprobs)
    ids = torch.where(pad, torch.full_like(batch.input_ids, 7), batch.input_ids)  # padding token ids
    moved = ProbeBatch(ids, batch.attention_mask, batch.response_mask, teacher)
    for method in ("reference", "fast"):
        assert_same_audit(base, audit(llama, moved, CANDS, method=method), tol=1e-5)
    # but teacher logprobs on the response do matter
    on = torch.where(off, batch.teacher_logprobs, batch.teacher_logprobs - 2.0)
    shifted = audit(llama, ProbeBatch(batch.input_ids, batch.attention_mask, batch.response_mask, on), CANDS)
    assert np.abs(shifted.gram - base.gram).max() > 1e-3 * np.abs(base.gram).max()


def test_token_weights_multiply_the_per_token_loss(llama, batch) -> None:
    base = audit(llama, batch, CANDS, method="fast", macro=False)
    ones = audit(
        llama, batch, CANDS, method="fast", macro=False, token_weights=torch.ones_like(batch.teacher_logprobs)
    )
    assert_same_audit(base, ones, tol=1e-6, macro=False)
    twice = audit(
        llama,
        batch,
        CANDS,
        method="fast",
        macro=False,
        token_weights=2 * torch.ones_like(batch.teacher_logprobs),
    )
    np.testing.assert_allclose(twice.gram, 4 * base.gram, rtol=1e-4, atol=1e-6 * np.abs(base.gram).max())
    # zero weight on the first segment: that segment's gradient vanishes, in every method alike
    pos = batch.response_mask.cumsum(1) - 1
    w = torch.where((batch.response_mask > 0) & (pos < CANDS[0]), 0.0, 1.0)
    ref = audit(llama, batch, CANDS, method="reference", macro=False, token_weights=w)
    fast = audit(llama, batch, CANDS, method="fast", macro=False, token_weights=w)
    assert ref.gram[0, 0] == 0.0 and fast.gram[0, 0] == 0.0
    assert_same_audit(ref, fast, macro=False)


def test_audit_leaves_grads_and_train_mode_as_they_were(batch) -> None:
    model = make_tiny_llama(seed=1)
    model.train()
    params = list(model.parameters())
    for i, p in enumerate(params):
        p.grad = torch.randn_like(p) if i % 2 == 0 else None
    before = [(p.grad, None if p.grad is None else p.grad.clone()) for p in params]
    for method in ("reference", "fast", "sketch"):
        audit(model, batch, CANDS, method=method, sketch_dim=256)
        assert model.training
        for p, (obj, val) in zip(params, before, strict=True):
            assert p.grad is obj
            if val is not None:
                assert torch.equal(p.grad, val)
    model.eval()
    audit(model, batch, CANDS, method="fast")
    assert not model.training


def test_audit_under_no_grad_still_measures_gradients(llama, batch) -> None:
    ref = audit(llama, batch, CANDS, method="fast", macro=False)
    with torch.no_grad():
        res = audit(llama, batch, CANDS, method="fast", macro=False)
    assert_same_audit(ref, res, tol=1e-6, macro=False)


def test_result_round_trips_through_json_with_and_without_sketch(llama, batch) -> None:
    res = audit(llama, batch, CANDS, method="sketch", sketch_dim=512)
    slim = json.loads(json.dumps(res.to_dict()))
    assert "sketch" not in slim
    back = AuditResult.from_dict(slim)
    assert back.cosines == res.cosines and back.macro_cosines == res.macro_cosines and back.sketch is None
    full = AuditResult.from_dict(json.loads(json.dumps(res.to_dict(include_sketch=True))))
    assert full.sketch is not None and np.array_equal(full.sketch, res.sketch)
    np.testing.assert_allclose(full.gram, res.gram)


def test_audit_rejects_bad_input(llama, batch) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        audit(llama, batch, [8, 4])
    with pytest.raises(ValueError, match=">= 1"):
        audit(llama, batch, [0, 4])
    with pytest.raises(ValueError, match="optimizer"):
        audit(llama, batch, CANDS, metric="adam")
    with pytest.raises(ValueError, match="method"):
        audit(llama, batch, CANDS, method="approx")
    rm = batch.response_mask.clone()
    rm[0, 0] = 1
    with pytest.raises(ValueError, match="column 0"):
        audit(llama, ProbeBatch(batch.input_ids, batch.attention_mask, rm, batch.teacher_logprobs), CANDS)
    with pytest.raises(ValueError, match="token_weights"):
        audit(llama, batch, CANDS, token_weights=torch.ones(2, 2))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 30)), min_size=1, max_size=3),
    cands=st.lists(st.integers(1, 40), min_size=1, max_size=4, unique=True).map(sorted),
    seed=st.integers(0, 1000),
)
def test_fast_and_reference_agree_on_random_lengths_and_candidates(llama, lens, cands, seed) -> None:
    """Empty responses, empty segments, candidate 1, windows past every response: still exact."""
    batch = make_batch([p for p, _ in lens], [r for _, r in lens], seed=seed)
    ref = audit(llama, batch, cands, method="reference")
    fast = audit(llama, batch, cands, method="fast")
    for c in cands:
        assert fast.cosines[c] == pytest.approx(ref.cosines[c], abs=1e-4)
    assert fast.macro_cosines.keys() == ref.macro_cosines.keys()
    for c in ref.macro_cosines:
        assert fast.macro_cosines[c] == pytest.approx(ref.macro_cosines[c], abs=1e-4)
    scale = max(np.abs(ref.gram).max(), 1e-12)
    assert np.abs(fast.gram - ref.gram).max() <= 1e-4 * scale
    if sum(r for _, r in lens) == 0:
        assert not fast.gram.any() and fast.macro_cosines == {}


@pytest.mark.parametrize("where", ["gram", "sketch"])
def test_non_finite_segment_statistics_raise_the_typed_non_finite_error(where: str) -> None:
    from adwin.audit.errors import NonFiniteAuditError
    from adwin.runtime.guards import is_non_finite_audit

    bad = np.eye(3)
    bad[0, 1] = np.nan
    with pytest.raises(NonFiniteAuditError) as err:
        cosines_from_gram(bad, [4, 8]) if where == "gram" else gram_from_sketches(bad)
    assert is_non_finite_audit(err.value)
    with pytest.raises(ValueError) as shape_err:  # a shape error of the math is not a refused audit
        cosines_from_gram(np.eye(2), [4, 8])
    assert not is_non_finite_audit(shape_err.value)
