"""The KV-cached continuous-batching rollout engine against a full re-encode of every prefix.

The reference engine is the previous one: no cache, every step re-encodes each request's whole prefix
(left padded, positions over real tokens) and samples with the same ``behavior_sample``. While weights do
not change both see the same logits (up to float rounding), so with the same seed they draw the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from tiny_models import make_tiny_llama, make_tiny_sliding_window_model

from adwin.decode.loop import left_pad
from adwin.decode.sampler import TokenSampler
from adwin.decode.slots import DECODER
from adwin.decode.static_cache import LEDGER
from adwin.trainer_adapters.asyncopd.engine import HFRolloutEngine, behavior_sample
from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut

pytestmark = pytest.mark.numerics  # parity of numbers across code paths: rerun per CPU capability

EOS = 2


class ReencodeEngine(HFRolloutEngine):
    """The engine without a cache: each step encodes every prefix from scratch."""

    @torch.no_grad()
    def next_logits(self, items: Sequence[StreamItem]) -> torch.Tensor:
        ids, attn = left_pad([it.prompt_ids + it.tokens for it in items], self.pad_id, "cpu")  # (n, L)
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        return self.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -1]  # (n, V)


def request(seq: int, prompt: list[int], max_tokens: int) -> StreamItem:
    return StreamItem(f"r{seq}", seq, f"p{seq}", prompt, "default", max_tokens, max_tokens, False, 0)


PROMPTS = [[1, 5, 9], [1, 7], [1, 3, 4, 5, 6, 8], [1, 11, 12, 13], [1, 20], [1, 30, 31, 32, 33]]
JOINS = [0, 0, 2, 3, 3, 6]  # the step at which request i is admitted
LENGTHS = [9, 4, 7, 12, 3, 5]  # its token budget


def drive(engine: HFRolloutEngine, steps: int = 16) -> list[StreamItem]:
    """A worker's loop: requests join at ``JOINS``, leave at EOS or at their budget."""
    reqs = [request(i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True))]
    active: list[StreamItem] = []
    for step in range(steps):
        active += [r for r, j in zip(reqs, JOINS, strict=True) if j == step]
        if not active:
            continue
        for it, out in zip(active, engine.step(active), strict=True):
            if out is None:  # a newcomer waiting for company: one prefill for several
                continue
            it.append(out, engine.version)
            if out.eos or it.response_len >= it.max_tokens:
                it.finish_reason = "eos" if out.eos else "window"
        active = [it for it in active if it.finish_reason is None]
    return reqs


@pytest.mark.parametrize(("m", "top_p", "temperature"), [(0, 1.0, 1.0), (3, 1.0, 0.7), (2, 0.8, 1.3)])
def test_same_tokens_logprobs_and_mc_actions_as_a_full_reencode_for_the_same_seed(m: int, top_p: float,
                                                                                   temperature: float) -> None:
    kw = {"eos": {EOS}, "pad_id": 0, "temperature": temperature, "top_p": top_p, "mc_samples": m, "seed": 11}
    cached = drive(HFRolloutEngine(make_tiny_llama(seed=4), **kw))
    reference = drive(ReencodeEngine(make_tiny_llama(seed=4), **kw))
    assert sum(it.response_len for it in reference) > 20, "the scenario must decode more than a few tokens"
    assert {it.finish_reason for it in reference} >= {"window"}
    for got, ref in zip(cached, reference, strict=True):
        assert got.tokens == ref.tokens and got.finish_reason == ref.finish_reason
        assert got.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
        assert got.mc_actions == ref.mc_actions
        for a, b in zip(got.mc_logprobs, ref.mc_logprobs, strict=True):
            assert a == pytest.approx(b, abs=1e-4)


# the sliding-window model attends through a window of 4 in its first layer: every prefix here is longer
@pytest.mark.parametrize("make", [make_tiny_llama, make_tiny_sliding_window_model])
def test_greedy_continuations_see_the_logits_of_a_full_reencode_at_every_step(make) -> None:
    """Requests join and leave at different steps; the next-token logits stay those of the full prefix."""
    model = make(seed=2)
    eng = HFRolloutEngine(model, eos=set(), pad_id=0)
    ref = ReencodeEngine(model, eos=set(), pad_id=0)
    reqs = [request(i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True))]
    active: list[StreamItem] = []
    for step in range(20):
        active += [r for r, j in zip(reqs, JOINS, strict=True) if j == step]
        if not active:
            break
        got, want = eng.next_logits(active), ref.next_logits(active)  # (n, V)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert sorted(eng.cached_requests) == sorted(it.request_id for it in active), "left rows are dropped"
        for it, tok in zip(active, want.argmax(-1).tolist(), strict=True):
            it.append(TokenOut(tok, 0.0), 0)
        active = [it for it in active if it.response_len < it.max_tokens]
    assert not active and all(it.response_len == it.max_tokens for it in reqs)


def test_a_kept_request_is_reencoded_under_new_weights_after_a_sync_and_only_then() -> None:
    old, new = make_tiny_llama(seed=5), make_tiny_llama(seed=6)
    eng = HFRolloutEngine(make_tiny_llama(seed=5), eos=set(), pad_id=0)
    kept = request(0, [1, 5, 9, 13], 20)
    fresh = request(1, [1, 7, 8], 20)  # admitted, no token yet when the weights change
    for _ in range(5):
        it_out = eng.step([kept])[0]
        assert it_out is not None
        kept.append(it_out, 0)
    encoded = eng.prefilled_tokens
    assert encoded == 4, "the prompt was encoded once; each later token was decoded from the cache"
    eng.load_weights(new.state_dict(), 1)
    got = eng.next_logits([kept, fresh])  # (2, V)
    torch.testing.assert_close(got, ReencodeEngine(new, eos=set(), pad_id=0).next_logits([kept, fresh]),
                               atol=1e-4, rtol=1e-4)
    stale = ReencodeEngine(old, eos=set(), pad_id=0).next_logits([kept])[0]
    assert not torch.allclose(got[0], stale, atol=1e-3), "the prefix must not keep the old weights' attention"
    assert eng.prefilled_tokens == encoded + len(kept.prompt_ids) + kept.response_len + len(fresh.prompt_ids)
    for it, tok in zip([kept, fresh], got.argmax(-1).tolist(), strict=True):
        it.append(TokenOut(tok, 0.0), 1)
    before = eng.prefilled_tokens
    eng.next_logits([kept, fresh])
    assert eng.prefilled_tokens == before, "between syncs no request is re-encoded"


def test_a_request_the_worker_did_not_advance_is_reencoded_not_skipped() -> None:
    """A wrapper may drop the engine's token (no progress): the row is rebuilt from the item's context."""
    model = make_tiny_llama(seed=3)
    eng = HFRolloutEngine(model, eos=set(), pad_id=0)
    a, b = request(0, [1, 5, 6], 10), request(1, [1, 9], 10)
    outs = eng.step([a, b])
    b.append(outs[1], 0)  # a made no progress
    torch.testing.assert_close(eng.next_logits([a, b]), ReencodeEngine(model, eos=set(), pad_id=0).next_logits([a, b]),
                               atol=1e-4, rtol=1e-4)


def test_behavior_sample_with_top_p_never_draws_outside_the_nucleus() -> None:
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0, -2.0]] * 64)  # softmax: ~0.70, 0.26, ...: p=0.8 keeps two
    outs = behavior_sample(logits, TokenSampler(1.0, 0.8, generator=torch.Generator().manual_seed(0)), m=4, eos=set())
    drawn = {o.token for o in outs} | {a for o in outs for a in (o.mc_actions or [])}
    assert drawn == {0, 1}
    kept = torch.log_softmax(logits[0, :2], -1)
    for o in outs:
        assert o.logprob == pytest.approx(float(kept[o.token]), abs=1e-6)


def test_engine_refuses_a_top_p_outside_its_range() -> None:
    with pytest.raises(ValueError, match="top_p"):
        HFRolloutEngine(make_tiny_llama(), eos=set(), pad_id=0, top_p=0.0)


def test_newcomers_wait_until_they_are_admit_fraction_of_the_batch_then_join_in_one_prefill() -> None:
    model = make_tiny_llama(seed=7)
    eng = HFRolloutEngine(model, eos=set(), pad_id=0, admit_fraction=0.125)
    running = [request(i, [1, 3 + i], 30) for i in range(10)]
    assert all(o is not None for o in eng.step(running)), "nothing else decodes: admitted at once"
    for it in running:
        it.append(TokenOut(5, 0.0), 0)
    first = request(10, [1, 40, 41], 30)
    outs = eng.step([*running, first])  # 1 of 11 < 1/8: waits
    assert outs[-1] is None and all(o is not None for o in outs[:-1])
    for it, o in zip(running, outs[:-1], strict=True):
        it.append(o, 0)  # type: ignore[arg-type]
    prefills = eng.prefilled_tokens
    second = request(11, [1, 42], 30)
    outs = eng.step([*running, first, second])  # 2 of 12 >= 1/8: both join
    assert all(o is not None for o in outs)
    assert eng.prefilled_tokens == prefills + 3 + 2, "one prefill of both newcomers' contexts, nothing re-encoded"
    for it, o in zip([*running, first, second], outs, strict=True):
        it.append(o, 0)  # type: ignore[arg-type]
    batch = [*running, first, second]
    torch.testing.assert_close(eng.next_logits(batch), ReencodeEngine(model, eos=set(), pad_id=0).next_logits(batch),
                               atol=1e-4, rtol=1e-4)


def test_a_request_that_leaves_stays_masked_until_a_merge_and_the_others_are_unaffected() -> None:
    model = make_tiny_llama(seed=8)
    eng, ref = HFRolloutEngine(model, eos=set(), pad_id=0), ReencodeEngine(model, eos=set(), pad_id=0)
    batch = [request(i, [1, 4 + i, 9], 30) for i in range(4)]

    def advance(items: list[StreamItem]) -> None:
        torch.testing.assert_close(eng.next_logits(items), ref.next_logits(items), atol=1e-4, rtol=1e-4)
        for it in items:
            it.append(TokenOut(6 + it.seq, 0.0), 0)

    advance(batch)
    advance(batch[1:])  # request 0 left: no newcomer, so its row stays, masked
    assert eng.cache_rows == 4 and sorted(eng.cached_requests) == ["r1", "r2", "r3"]
    advance(batch[1:])
    advance(batch[3:])  # three of four rows left: the cache is compacted
    assert eng.cache_rows == 1 and eng.cached_requests == ["r3"]
    newcomer = request(9, [1, 20, 21, 22], 30)
    batch[1].tokens.clear()  # not a continuation any more: re-encoded from its context
    advance([batch[3], batch[1], newcomer])
    assert eng.cache_rows == 3


# --- the compiled path (rollout.compile): a static cache with slots, one shared write column -----------------


@pytest.fixture(scope="module")
def compiled_model() -> torch.nn.Module:
    """One model for the compiled tests: each (rows, columns) bucket compiles once per test run."""
    return make_tiny_llama(seed=4)


def test_the_compiled_engine_draws_the_dynamic_engine_s_tokens_logprobs_and_mc_actions(compiled_model) -> None:
    kw = {"eos": {EOS}, "pad_id": 0, "temperature": 0.7, "top_p": 0.9, "mc_samples": 3, "seed": 11}
    compiled = HFRolloutEngine(compiled_model, **kw, compile=True, max_len=20)
    got, want = drive(compiled), drive(HFRolloutEngine(make_tiny_llama(seed=4), **kw))
    assert compiled._slots is not None and compiled._slots.repacks >= 1, "rows joined past a bucket: repacked"
    for g, w in zip(got, want, strict=True):
        assert g.tokens == w.tokens and g.finish_reason == w.finish_reason and g.mc_actions == w.mc_actions
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_a_long_stream_repacks_the_static_cache_and_keeps_the_logits_of_a_full_reencode(compiled_model) -> None:
    """Requests join, leave, outrun the cache's columns and survive a weight sync: every step's logits are
    those of the whole prefix, and the shapes stay the buckets'."""
    eng = HFRolloutEngine(compiled_model, eos=set(), pad_id=0, compile=True, max_len=25)  # 7 + 18 tokens at most
    ref = ReencodeEngine(compiled_model, eos=set(), pad_id=0)
    assert eng._slots is not None
    columns = eng._slots.columns
    reqs = [request(i, [1, *range(3, 3 + i % 7)], 8 + i % 11) for i in range(24)]
    active: list[StreamItem] = []
    for step in range(120):
        active += [r for r in reqs[step // 5 : step // 5 + 1] if r.response_len == 0 and r not in active]
        if step == 60:
            eng.load_weights(compiled_model.state_dict(), 1)  # the prefix-cache reset: all re-encoded
        if not active:
            continue
        got, want = eng.next_logits(active), ref.next_logits(active)  # (n, V)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert eng._slots.batch is not None and eng._slots.batch.column < columns
        for it, tok in zip(active, want.argmax(-1).tolist(), strict=True):
            it.append(TokenOut(tok, 0.0), 0)
        active = [it for it in active if it.response_len < it.max_tokens]
    assert sum(r.response_len for r in reqs) > 2 * columns, "the stream must outrun the columns several times"
    assert eng._slots.repacks >= 3
    assert LEDGER.shapes[DECODER] <= {(rows, columns) for rows in (1, 2, 4, 8)}, "bucketed rows, fixed columns"


def test_a_compiled_engine_needs_the_longest_request_to_size_its_cache() -> None:
    with pytest.raises(ValueError, match="max_len"):
        HFRolloutEngine(make_tiny_llama(), eos=set(), pad_id=0, compile=True)


def test_a_compiled_engine_refuses_a_sliding_window_cache_when_built() -> None:
    from adwin.decode.static_cache import StaticCacheError

    sliding = make_tiny_sliding_window_model()
    with pytest.raises(StaticCacheError, match="rollout.compile"):
        HFRolloutEngine(sliding, eos=set(), pad_id=0, compile=True, max_len=16)


def test_auto_compiles_where_the_static_cache_lays_rows_and_decodes_a_sliding_window_model_eagerly(monkeypatch) -> None:
    """``rollout.compile: auto`` on a GPU (stood in for here): the static slots for a model whose static cache lays
    rows, the eager layout (which keeps every column, the mask applying the window) for a sliding-window one."""
    import adwin.trainer_adapters.asyncopd.engine as engine_module

    monkeypatch.setattr(engine_module, "compile_wanted", lambda setting, device: True)
    assert HFRolloutEngine(make_tiny_llama(), eos=set(), pad_id=0, compile="auto", max_len=16)._slots is not None
    eager = HFRolloutEngine(make_tiny_sliding_window_model(), eos=set(), pad_id=0, compile="auto", max_len=16)
    assert eager._slots is None
    assert eager.step([request(0, [1, 5, 9, 13, 17, 21], 4)])[0] is not None  # the prefill merges into the cache
