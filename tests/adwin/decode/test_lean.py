"""The lean CPU decode step (``adwin.decode.lean``): the model's logits and the eager loop's tokens, cheaper."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_llama, make_tiny_sliding_window_model
from transformers import LlamaConfig, LlamaForCausalLM

from adwin.decode.lean import LeanCache, LeanModelError, lean_applies
from adwin.decode.loop import _EagerCache, decode
from adwin.decode.sampler import TokenSampler
from adwin.sampling.compact import generate_compacting

CONTEXTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8], [1, 10, 11], [], [1, 12, 13, 14, 15, 16]]


def gqa_llama(seed: int = 0) -> LlamaForCausalLM:
    """Grouped-query attention (4 query heads on 2 key/value heads), tied embeddings, hidden 64 as the long model."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=53, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        tie_word_embeddings=True, pad_token_id=0, eos_token_id=2)).eval()


MODELS = {"mha": lambda: make_tiny_llama(seed=3), "gqa-tied": gqa_llama}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lean_steps_give_the_models_own_logits(name: str) -> None:
    model = MODELS[name]()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        own, lean = _EagerCache(model, CONTEXTS, 24, 0, False), LeanCache(model, CONTEXTS, 24, 0)
        assert torch.equal(own.logits, lean.logits)  # the prefill is the model's own forward
        for _ in range(24):
            tokens = torch.randint(3, model.config.vocab_size, (len(CONTEXTS),), generator=g)
            torch.testing.assert_close(lean.step(tokens), own.step(tokens), rtol=0, atol=1e-5)


def _decode(model: torch.nn.Module, lean: bool, seed: int, **kw: object) -> object:
    torch.manual_seed(seed)
    sampler = TokenSampler(kw.pop("temperature", 1.0), kw.pop("top_p", 1.0), row_seeds=kw.pop("row_seeds", None))
    return decode(model, CONTEXTS, kw.pop("budgets", [20] * len(CONTEXTS)), eos={2}, pad_id=0, sampler=sampler,
                  with_logprobs=True, lean=lean, **kw)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9}, {"row_seeds": [7, 8, 9, 10, 11, 12]},
                                      {"temperature": 0.0}, {"drop_stopped": True}])
def test_decoding_on_the_lean_step_samples_the_eager_loops_tokens(sampling: dict) -> None:
    model = make_tiny_llama(seed=5)
    budgets = [20, 3, 20, 11, 20, 7]  # rows stop at their budgets and at EOS at other steps
    own = _decode(model, False, 4, budgets=budgets, **dict(sampling))
    lean = _decode(model, True, 4, budgets=budgets, **dict(sampling))
    assert lean.response_ids == own.response_ids and lean.finished == own.finished
    assert len({len(r) for r in own.response_ids}) > 2  # rows really stopped at different steps
    for a, b in zip(lean.logprobs, own.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-5)


def test_finished_rows_stop_costing_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_tiny_llama(seed=5)
    computed: list[int] = []
    forward = LeanCache._forward

    def counting(self: LeanCache, toks: torch.Tensor) -> torch.Tensor:
        computed.append(toks.shape[0])
        return forward(self, toks)

    monkeypatch.setattr(LeanCache, "_forward", counting)
    budgets = [2, 4, 6, 8, 10, 12]
    out = _decode(model, True, 1, budgets=budgets)
    lengths = [len(r) for r in out.response_ids]
    # a step computes only the rows still decoding: the rows whose response is longer than the step
    assert computed == [sum(n > s for n in lengths) for s in range(1, max(lengths))]
    assert computed[-1] == 1 < len(CONTEXTS)
    assert out.response_ids == _decode(model, False, 1, budgets=budgets).response_ids


def test_the_compacting_evaluator_decodes_on_the_lean_step(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_tiny_llama(seed=5)
    built: list[int] = []
    init = LeanCache.__init__

    def record(self: LeanCache, *a: object, **kw: object) -> None:
        built.append(1)
        init(self, *a, **kw)

    monkeypatch.setattr(LeanCache, "__init__", record)
    out = generate_compacting(model, CONTEXTS, 12, eos={2}, pad_id=0, row_seeds=[1, 2, 3, 4, 5, 6])
    assert built == [1]
    assert out.response_ids == decode(model, CONTEXTS, [12] * len(CONTEXTS), eos={2}, pad_id=0, lean=False,
                                      sampler=TokenSampler(row_seeds=[1, 2, 3, 4, 5, 6]),
                                      drop_stopped=True).response_ids


def test_a_call_decodes_the_students_current_weights() -> None:
    model = make_tiny_llama(seed=5)
    before = _decode(model, True, 2)
    with torch.no_grad():  # an optimizer step, in place: the trainer's weight sync has nothing to copy
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    after = _decode(model, True, 2)
    assert after.response_ids != before.response_ids
    assert after.response_ids == _decode(model, False, 2).response_ids


class _LlamaSubclass(LlamaForCausalLM):
    """A subclass may change the forward: the lean step does not claim to compute it."""


def test_only_a_plain_float32_llama_on_cpu_takes_the_lean_step() -> None:
    llama = make_tiny_llama(seed=0)
    assert lean_applies(llama)
    assert not lean_applies(make_tiny_sliding_window_model())
    assert not lean_applies(_LlamaSubclass(llama.config))
    assert not lean_applies(make_tiny_llama(seed=0).to(torch.bfloat16))
    biased = LlamaForCausalLM(LlamaConfig(**{**llama.config.to_dict(), "attention_bias": True}))
    assert not lean_applies(biased)
    with pytest.raises(LeanModelError):
        LeanCache(make_tiny_sliding_window_model(), CONTEXTS[:2], 4, 0)


def test_other_models_decode_on_their_own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: object, **kw: object) -> None:
        raise AssertionError("a model the lean step does not compute must not reach it")

    monkeypatch.setattr(LeanCache, "__init__", refuse)
    out = decode(make_tiny_sliding_window_model(), CONTEXTS[:3], [5, 5, 5], eos=set(), pad_id=0,
                 sampler=TokenSampler(0.0))
    assert [len(r) for r in out.response_ids] == [5, 5, 5]
