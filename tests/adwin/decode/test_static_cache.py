"""Compiled decoding (``rollout.compile``): buckets, the ``auto`` rule, ``generate`` on a static cache with
transformers' compiled step giving the eager path's tokens, and a bounded number of compiled shapes.

CPU compiles with inductor's default mode (CUDA graphs need CUDA); the compiled tests share one module-scoped
model, so each shape compiles once per test run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import make_tiny_llama, make_tiny_sliding_window_model

from adwin.decode.generate import generate
from adwin.decode.static_cache import LEDGER, MIN_CACHE, batch_bucket, cache_bucket, compile_wanted
from adwin.sampling.compact import generate_compacting
from adwin.sampling.seeding import row_seed

EOS = {2}
CONTEXTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = make_tiny_llama(seed=0)
    with torch.no_grad():  # EOS likely enough that rows stop at different lengths
        m.lm_head.weight[2] += 0.3 * m.lm_head.weight.norm(dim=1).mean()
    return m


@given(st.integers(1, 5000))
def test_a_batch_bucket_is_the_next_power_of_two(n: int) -> None:
    b = batch_bucket(n)
    assert n <= b < 2 * n and b & (b - 1) == 0


@given(st.integers(0, 100_000))
def test_a_cache_bucket_holds_the_tokens_and_is_a_power_of_two(n: int) -> None:
    c = cache_bucket(n)
    assert c >= max(n, MIN_CACHE) and c & (c - 1) == 0 and (c == MIN_CACHE or c < 2 * n)


def test_auto_compiles_on_cuda_only_and_true_or_false_are_taken_as_said() -> None:
    assert compile_wanted("auto", "cuda:1") and not compile_wanted("auto", "cpu")
    assert compile_wanted(True, "cpu") and not compile_wanted(False, "cuda")


def test_decode_steps_count_the_call_s_positions_before_budgets_cut_rows(model) -> None:
    g = generate(model, CONTEXTS, [3, 12, 5], eos=set(), pad_id=0, temperature=0.0)  # no EOS: the longest budget
    assert g.decode_steps == 12 and [len(r) for r in g.response_ids] == [3, 12, 5]
    c = generate_compacting(model, CONTEXTS, 9, eos=set(), pad_id=0, temperature=0.0)
    assert c.decode_steps == 9
    stopped = generate_compacting(model, CONTEXTS, 60, eos=EOS, pad_id=0, temperature=0.0)
    assert stopped.decode_steps == max(len(r) for r in stopped.response_ids) < 60  # the loop ended at the last EOS


@pytest.mark.parametrize("seeding", ["greedy", "per_sample"])
def test_compiled_generate_gives_the_eager_tokens_and_logprobs(model, seeding: str) -> None:
    kw = {"temperature": 0.0} if seeding == "greedy" else {
        "temperature": 0.9, "top_p": 0.8, "row_seeds": [row_seed(1, "rollout", 0, i) for i in range(len(CONTEXTS))]}
    eager = generate(model, CONTEXTS, [20, 6, 20], eos=EOS, pad_id=0, with_logprobs=True, **kw)
    compiled = generate(model, CONTEXTS, [20, 6, 20], eos=EOS, pad_id=0, with_logprobs=True, compile=True, **kw)
    assert compiled.response_ids == eager.response_ids and compiled.finished == eager.finished
    assert compiled.decode_steps == eager.decode_steps  # the dummy row stopped at once: it never kept the call going
    for a, b in zip(compiled.logprobs, eager.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    if seeding == "greedy":  # some rows stop, some use their budget
        assert any(not f for f in eager.finished) and any(eager.finished)


@pytest.mark.parametrize("rows", [3, 4])
def test_batch_seeding_draws_the_eager_noise_whether_or_not_dummy_rows_fill_the_bucket(model, rows: int) -> None:
    """The global RNG's noise is drawn for the real rows only, in order: dummy rows never move a real row's
    draw, so the compiled call gives the eager tokens."""
    ctx = (CONTEXTS + [[1, 20, 21]])[:rows]
    torch.manual_seed(5)
    eager = generate(model, ctx, [15] * rows, eos=EOS, pad_id=0)
    torch.manual_seed(5)
    compiled = generate(model, ctx, [15] * rows, eos=EOS, pad_id=0, compile=True)
    assert compiled.response_ids == eager.response_ids


def test_changing_windows_and_batch_sizes_compile_one_shape_per_bucket(model) -> None:
    """Windows (budgets), prompt lengths and batch sizes inside a bucket change the steps, never a shape."""
    LEDGER.hook()
    before_shapes, before = LEDGER.count(), LEDGER.compiles
    generate(model, CONTEXTS, [4, 4, 4], eos=EOS, pad_id=0, compile=True)  # (4 rows, 64 columns): compiled once
    warm = LEDGER.compiles
    for window in (2, 7, 16, 31, 40):
        for rows in (3, 4):
            ctx = [[1, *range(5, 5 + (window % 9) + r)] for r in range(rows)]
            generate(model, ctx, [window] * rows, eos=EOS, pad_id=0, temperature=0.0, compile=True)
    assert LEDGER.compiles == warm, "a window, prompt length or batch size inside a bucket recompiled the step"
    assert LEDGER.count() - before_shapes <= 1 and warm - before <= 1
    metrics = LEDGER.step_metrics()
    assert metrics["rollout/compiled_shapes"] >= 1 and metrics["rollout/compile_s"] >= 0.0


COMPACT = CONTEXTS + [[1, 10, 11], [1, 12]]  # 5 rows: a bucket of 8 with 3 dummy rows


@pytest.mark.parametrize("shrink", [False, True])
@pytest.mark.parametrize("seeding", ["greedy", "per_sample", "batch"])
def test_compiled_compact_sampling_gives_the_eager_compact_tokens(model, seeding: str, shrink: bool) -> None:
    """Stopped rows stay masked (or move to smaller buckets with ``shrink``): every row draws what the eager
    sampler draws, under batch seeding too (both draw for the live rows only, in row order)."""
    kw: dict = {"temperature": 0.0} if seeding == "greedy" else {"temperature": 0.9, "top_p": 0.8}
    if seeding == "per_sample":
        kw["row_seeds"] = [row_seed(2, "eval", 0, i) for i in range(len(COMPACT))]
    torch.manual_seed(3)
    eager = generate_compacting(model, COMPACT, 40, eos=EOS, pad_id=0, **kw)
    torch.manual_seed(3)
    compiled = generate_compacting(model, COMPACT, 40, eos=EOS, pad_id=0, compile=True, shrink=shrink, **kw)
    assert compiled.response_ids == eager.response_ids and compiled.finished == eager.finished
    assert compiled.decode_steps == eager.decode_steps
    if seeding == "greedy":
        assert len({len(r) for r in eager.response_ids}) > 2  # rows left at several lengths


def test_compiled_compact_shapes_are_the_buckets_the_live_rows_pass_through(model) -> None:
    generate_compacting(model, COMPACT, 40, eos=EOS, pad_id=0, temperature=0.0, compile=True, shrink=False)
    generate_compacting(model, COMPACT, 40, eos=EOS, pad_id=0, temperature=0.0, compile=True)  # shrinks
    assert LEDGER.shapes["compact"] <= {(8, 64), (4, 64), (2, 64), (1, 64)}
    assert (8, 64) in LEDGER.shapes["compact"]


def test_a_deep_copy_of_a_compiled_model_decodes_with_its_own_weights(model) -> None:
    """transformers caches the compiled call on the model; a replica (probe worker) must not inherit it."""
    import copy

    from adwin.decode.static_cache import without_compiled

    generate(model, CONTEXTS, [4, 4, 4], eos=EOS, pad_id=0, temperature=0.0, compile=True)  # the original compiled
    replica = without_compiled(copy.deepcopy(model))
    with torch.no_grad():
        replica.lm_head.weight.mul_(-1.0)  # other weights: other greedy tokens
    eager = generate(replica, CONTEXTS, [6, 6, 6], eos=EOS, pad_id=0, temperature=0.0)
    compiled = generate(replica, CONTEXTS, [6, 6, 6], eos=EOS, pad_id=0, temperature=0.0, compile=True)
    assert compiled.response_ids == eager.response_ids
    assert eager.response_ids != generate(model, CONTEXTS, [6, 6, 6], eos=EOS, pad_id=0, temperature=0.0).response_ids


def test_a_sliding_window_cache_is_refused_by_the_row_laying_decoders_before_any_decode(model) -> None:
    """Sliding-window layers roll their columns: compact evaluation and the AsyncOPD engine cannot lay rows
    into them. ``true`` refuses by type; ``auto`` (on CUDA) decodes such a model eagerly instead."""
    from adwin.decode.static_cache import StaticCacheError, lays_rows

    sliding = make_tiny_sliding_window_model()
    assert lays_rows(model) and not lays_rows(sliding)
    with pytest.raises(StaticCacheError):
        generate_compacting(sliding, CONTEXTS, 5, eos=EOS, pad_id=0, temperature=0.0, compile=True)


def test_a_sliding_window_model_decodes_compiled_through_generate_on_a_bucket_sized_cache() -> None:
    """A model the row-laying decoders refuse runs transformers' ``generate`` on a static cache adwin builds at
    the bucket's size (no ``max_cache_len`` argument, which older releases lack), to the eager tokens."""
    sliding = make_tiny_sliding_window_model()
    with torch.no_grad():  # EOS likely enough that rows stop at different lengths
        sliding.lm_head.weight[2] += 0.3 * sliding.lm_head.weight.norm(dim=1).mean()
    kw = {"eos": EOS, "pad_id": 0, "temperature": 0.0, "with_logprobs": True}
    eager = generate(sliding, CONTEXTS, [9, 5, 9], **kw)
    compiled = generate(sliding, CONTEXTS, [9, 5, 9], compile=True, **kw)
    assert compiled.response_ids == eager.response_ids and compiled.finished == eager.finished
    for got, want in zip(compiled.logprobs, eager.logprobs, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    assert (batch_bucket(len(CONTEXTS)), cache_bucket(7 + 9)) in LEDGER.shapes["generate"]


def test_transformers_generate_ignores_the_checkpoints_own_generation_settings_under_the_sampler() -> None:
    """A checkpoint's generation_config.json may ask for a repetition penalty, n-gram bans or a minimum length;
    transformers' ``generate`` (the compiled path of a sliding-window model) would apply them where the eager loop
    does not, so its tokens and logprobs would no longer be the sampler's."""
    sliding = make_tiny_sliding_window_model()
    with torch.no_grad():  # EOS likely enough that rows stop at different lengths
        sliding.lm_head.weight[2] += 0.3 * sliding.lm_head.weight.norm(dim=1).mean()
    kw = {"eos": EOS, "pad_id": 0, "temperature": 0.0, "with_logprobs": True}
    eager = generate(sliding, CONTEXTS, [9, 5, 9], **kw)
    assert any(len(set(r)) < len(r) for r in eager.response_ids), "a repeated token, which the penalty would ban"
    g = sliding.generation_config
    g.repetition_penalty, g.no_repeat_ngram_size, g.min_new_tokens = 3.0, 1, 4
    compiled = generate(sliding, CONTEXTS, [9, 5, 9], compile=True, **kw)
    assert compiled.response_ids == eager.response_ids and compiled.finished == eager.finished
    for got, want in zip(compiled.logprobs, eager.logprobs, strict=True):
        assert got == pytest.approx(want, abs=1e-4)


def test_a_lora_student_decodes_compiled_to_the_eager_tokens_and_follows_its_adapters(model) -> None:
    """peft's ``generate`` runs transformers' compiled step of the wrapped model, adapters included; an in-place
    update of the adapters (an optimizer step) reaches the compiled step."""
    import copy

    pytest.importorskip("peft")
    from adwin.config import LoraSection
    from adwin.decode.static_cache import without_compiled
    from adwin.student.lora import apply_lora, trainable_parameters

    student = apply_lora(without_compiled(copy.deepcopy(model)), LoraSection(r=4))
    kw = {"eos": EOS, "pad_id": 0, "temperature": 0.9, "top_p": 0.8,
          "row_seeds": [row_seed(4, "rollout", 0, i) for i in range(len(CONTEXTS))]}
    g = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(2):
        with torch.no_grad():  # adapters off their zero start: tokens that are not the base model's
            for p in trainable_parameters(student):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
        eager = generate(student, CONTEXTS, [12, 6, 12], **kw)
        assert generate(student, CONTEXTS, [12, 6, 12], compile=True, **kw).response_ids == eager.response_ids
        seen.append(eager.response_ids)
    assert seen[0] != seen[1] and seen[0] != generate(model, CONTEXTS, [12, 6, 12], **kw).response_ids
