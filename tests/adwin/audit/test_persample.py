"""The batched per-sample engine: every row's segment gradients in one pass, the same Grams and sketches as one
backward per row and segment (float64: to 1e-10; float32: to float32 rounding), and a fallback for models it cannot
differentiate per row."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from numerics import f32_sum_tol
from tiny_models import make_tiny_llama

from adwin.audit import grams, persample
from adwin.audit.alignment import ProbeBatch, audit
from adwin.audit.grams import canonical_name, chunked_grams, metric_scaler, prepare, reference_grams
from adwin.audit.params import audited_parameters
from adwin.audit.sketch import countsketch_hashes

ENGINE = persample.segment_grads
CANDS = [4, 8, 16, 32]
N_SEG = len(CANDS) + 1
RTOL_F64 = 1e-10
DIM = 64  # sketch dimension: small, so a bucket holds many elements


def _batch(seed: int = 0) -> ProbeBatch:
    """Five right-padded probes; the pad id 0 also occurs inside prompts and responses (its embedding row takes
    no gradient there, as ``nn.Embedding``'s backward says)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = (5, 9, 3, 12, 6), (40, 20, 55, 30, 3)
    length = max(p + r for p, r in zip(prompts, responses, strict=True)) + 3
    ids = torch.randint(0, 64, (5, length), generator=g)
    am, rm = torch.zeros(5, length, dtype=torch.long), torch.zeros(5, length, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        am[b, : p + r], rm[b, p : p + r] = 1, 1
        ids[b, p + r :] = 0
        ids[b, p + 1] = 0  # a pad id inside the response
    return ProbeBatch(ids, am, rm, -torch.rand(5, length, generator=g, dtype=torch.float64) * 4 * rm)


def _qwen3_tied() -> torch.nn.Module:
    """Tied head and embeddings, per-head q/k RMSNorms."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=0)).eval()


def _lora() -> torch.nn.Module:
    pytest.importorskip("peft")
    from adwin.config import LoraSection
    from adwin.student.lora import apply_lora, trainable_named_parameters

    student = apply_lora(make_tiny_llama(seed=2), LoraSection(r=4, alpha=8))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # adapters off peft's zero init, so lora_A's gradient is not zero
        for _, p in trainable_named_parameters(student):
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.2)
    return student


def _adamw(model: torch.nn.Module, batch: ProbeBatch) -> torch.optim.AdamW:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.pow(2).mean().backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


MODELS = {
    "llama": lambda: make_tiny_llama(),
    "qwen3-tied": _qwen3_tied,
    "lora": _lora,
}


def _setup(model: torch.nn.Module, batch: ProbeBatch, params: str = "all", metric: str = "identity"):
    named = [(canonical_name(n), p) for n, p in audited_parameters(model, params)]
    b = prepare(batch, None, CANDS, named[0][1].device)
    opt = _adamw(model, batch) if metric == "adam" else None
    return named, b, metric_scaler([p for _, p in named], metric, opt)


def _sketch(flat: np.ndarray, named: list[tuple[str, torch.nn.Parameter]], dim: int) -> np.ndarray:
    """(K+1, dim) float64 CountSketch of one sample's flattened (K+1, D) segment gradients."""
    out, at = np.zeros((flat.shape[0], dim)), 0
    for name, p in named:
        bucket, sign = countsketch_hashes(name, p.numel(), 0, dim)
        for s in range(flat.shape[0]):
            np.add.at(out[s], bucket.numpy(), flat[s, at : at + p.numel()] * sign.double().numpy())
        at += p.numel()
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.mark.parametrize(("model_name", "params", "metric"), [
    ("llama", "all", "identity"), ("qwen3-tied", "all", "identity"), ("llama", "top:1", "identity"),
    ("llama", "all", "adam"), ("lora", "all", "identity"),
])
def test_batched_rows_give_the_reference_per_sample_grams_and_sketches_in_float64(model_name, params, metric) -> None:
    model, batch = MODELS[model_name]().double(), _batch()
    named, b, scale = _setup(model, batch, params, metric)
    _, ref_grams, ref_vecs = reference_grams(model, named, b, N_SEG, scale, True, keep_vectors=True)
    calls = []

    def spy(*a, **k):
        calls.append(a[3])
        yield from ENGINE(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(persample, "segment_grads", spy)
        mp.setattr(persample, "PAD_SLACK", 100.0)  # rows of any length share a pass
        _, fast_grams, _, fast_vecs = chunked_grams(model, named, b, N_SEG, scale, True, None, None, 0, DIM)
        _, sk_grams, sk, sk_vecs = chunked_grams(model, named, b, N_SEG, scale, True, None, DIM, 0, DIM)
    assert calls == [slice(0, 5), slice(0, 5)]  # one pass over all five rows, no fallback
    expected_vecs = [_sketch(v, named, DIM) for v in ref_vecs]
    for i in range(5):
        assert _rel(fast_grams[i], ref_grams[i]) <= RTOL_F64
        assert _rel(fast_vecs[i], expected_vecs[i]) <= RTOL_F64
        assert _rel(sk_vecs[i], expected_vecs[i]) <= RTOL_F64
        assert _rel(sk_grams[i], expected_vecs[i] @ expected_vecs[i].T) <= RTOL_F64
    assert _rel(sk, sum(expected_vecs)) <= 1e-6  # the batch sketch is published in float32
    assert np.abs(ref_grams[0]).max() > 0 and _rel(ref_grams[0], ref_grams[1]) > 1e-3  # informative rows


def test_batched_rows_match_one_backward_per_row_within_float32_rounding() -> None:
    model, batch = _qwen3_tied(), _batch(seed=1)
    named, b, scale = _setup(model, batch)
    per_row = [chunked_grams(model, named, b, N_SEG, scale, True, None, sk, 0, DIM, engine=engine)
               for engine in ("row", "batched") for sk in (None, DIM)]
    tol = f32_sum_tol(int(b.response_mask.sum()) * 64)  # a gradient entry sums over tokens, a Gram over a row
    for old, new in zip(per_row[:2], per_row[2:], strict=True):
        assert _rel(new[0], old[0]) <= tol  # the batch Gram
        for i in range(5):
            assert _rel(new[1][i], old[1][i]) <= tol  # the per-sample Grams
            assert _rel(new[3][i], old[3][i]) <= tol  # the per-sample sketches


def test_rows_per_pass_stay_within_the_gradient_budget(monkeypatch) -> None:
    model, batch = make_tiny_llama().double(), _batch()
    named, b, scale = _setup(model, batch)
    monkeypatch.setattr(persample, "PAD_SLACK", 100.0)
    whole = chunked_grams(model, named, b, N_SEG, scale, True, None, None, 0, DIM)
    n_params = sum(p.numel() for _, p in named)
    monkeypatch.setattr(persample, "ROW_GRAD_BYTES", 2 * N_SEG * n_params * 4)  # two rows' K+1 gradients
    seen = []

    def spy(*a, **k):
        seen.append(a[3].stop - a[3].start)
        yield from ENGINE(*a, **k)

    monkeypatch.setattr(persample, "segment_grads", spy)
    split = chunked_grams(model, named, b, N_SEG, scale, True, None, None, 0, DIM)
    assert seen == [2, 2, 1]  # shortest rows first
    assert _rel(split[0], whole[0]) <= RTOL_F64
    for i in range(5):
        assert _rel(split[1][i], whole[1][i]) <= RTOL_F64
        assert _rel(split[3][i], whole[3][i]) <= RTOL_F64


def test_passes_group_rows_of_similar_length_up_to_the_step(monkeypatch) -> None:
    monkeypatch.setattr(persample, "PAD_SLACK", 0.1)
    lengths = [100, 500, 105, 108, 520, 111, 50, 300]
    assert persample.passes(lengths, step=3) == [[6], [0, 2, 3], [5], [7], [1, 4]]
    assert persample.passes(lengths, step=1) == [[6], [0], [2], [3], [5], [7], [1], [4]]


def test_rows_regrouped_by_length_keep_their_sample_order() -> None:
    model, batch = make_tiny_llama().double(), _batch()
    named, b, scale = _setup(model, batch)
    _, ref_grams, ref_vecs = reference_grams(model, named, b, N_SEG, scale, True, keep_vectors=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(persample, "PAD_SLACK", 0.5)  # lengths 44, 28, 57, 41, 8: passes 4 | 1, 3 | 0, 2
        assert persample.passes([int(x) for x in grams.forwarded_lengths(b)], 5) == [[4], [1, 3], [0, 2]]
        _, got, _, vecs = chunked_grams(model, named, b, N_SEG, scale, True, None, None, 0, DIM)
    for i in range(5):
        assert _rel(got[i], ref_grams[i]) <= RTOL_F64
        assert _rel(vecs[i], _sketch(ref_vecs[i], named, DIM)) <= RTOL_F64


class _Gain(torch.nn.Module):
    """A learned per-channel gain: a module type the batched engine has no per-row formula for."""

    def __init__(self, inner: torch.nn.Module, width: int) -> None:
        super().__init__()
        self.inner, self.gain = inner, torch.nn.Parameter(1.0 + 0.1 * torch.randn(width, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.gain


class _HeadFromTable(torch.nn.Module):
    """An LM head that multiplies by the embedding table outside the embedding's own forward."""

    def __init__(self, table: torch.nn.Embedding) -> None:
        super().__init__()
        self.table = [table]  # not a submodule: the table's parameter stays the embedding's alone

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(h, self.table[0].weight)


def _gained() -> torch.nn.Module:
    model = make_tiny_llama().double()
    mlp = model.model.layers[0].mlp
    mlp.down_proj = _Gain(mlp.down_proj, 32)
    return model


def _head_from_table() -> torch.nn.Module:
    model = make_tiny_llama().double()
    model.lm_head = _HeadFromTable(model.model.embed_tokens)
    return model


@pytest.mark.parametrize("maker", [_gained, _head_from_table], ids=["unknown-module", "use-outside-its-module"])
def test_a_model_the_engine_cannot_split_falls_back_to_one_row_at_a_time(maker, caplog) -> None:
    model, batch = maker(), _batch()
    named, b, scale = _setup(model, batch)
    with pytest.raises(persample.PerSampleUnsupported):
        for _ in persample.segment_grads(model, named, b, slice(0, 5), N_SEG, scale):
            pass
    _, ref_grams, ref_vecs = reference_grams(model, named, b, N_SEG, scale, True, keep_vectors=True)
    with caplog.at_level(logging.WARNING, logger=grams.__name__):
        _, got, _, vecs = chunked_grams(model, named, b, N_SEG, scale, True, None, None, 0, DIM)
    assert caplog.records  # the fallback says so
    for i in range(5):
        assert _rel(got[i], ref_grams[i]) <= 1e-6  # the row engine's Grams pass through float32
        assert _rel(vecs[i], _sketch(ref_vecs[i], named, DIM)) <= 1e-6


def test_bf16_autocast_keeps_the_batched_engine_within_bf16_rounding(caplog) -> None:
    model, batch = make_tiny_llama(), _batch()
    with caplog.at_level(logging.WARNING, logger=grams.__name__):
        new = audit(model, batch, CANDS, autocast="bf16", ci_level=0.9, ci_samples=10, sketch_dim=DIM)
    assert not caplog.records  # autograd's bf16-rounded weight gradient passes the check
    old = audit(model, batch, CANDS, ci_level=0.9, ci_samples=10, sketch_dim=DIM)
    for c in CANDS:
        assert new.macro_cosines[c] == pytest.approx(old.macro_cosines[c], abs=0.05)
