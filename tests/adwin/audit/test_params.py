"""audit.params: 'all' | 'top:N' (the last N transformer blocks and the head), found generically for HF causal LMs."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from adwin.audit.alignment import ProbeBatch, audit
from adwin.audit.params import audited_parameters, parse_audit_params

CANDS = [2, 4]


def _llama() -> torch.nn.Module:
    from tiny_models import make_tiny_llama

    return make_tiny_llama(num_layers=3)


def _qwen2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=64)  # head tied to wte
    return GPT2LMHeadModel(cfg).eval()


MODELS = {"llama": _llama, "qwen2": _qwen2, "gpt2": _gpt2}


def _batch() -> ProbeBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (3, 9), generator=g)
    resp = torch.zeros_like(ids)
    resp[:, 3:] = 1
    resp[2, 7:] = 0
    teacher = -torch.rand(ids.shape, generator=g) * resp
    return ProbeBatch(ids, torch.ones_like(ids), resp, teacher)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_top_n_over_every_block_is_the_all_audit(name: str) -> None:
    model = MODELS[name]()
    full = audit(model, _batch(), CANDS, method="fast", macro=False)
    top = audit(model, _batch(), CANDS, method="fast", macro=False, params="top:3")
    assert top.params == "top:3"
    assert top.gram is not None and full.gram is not None
    assert top.gram.tobytes() == full.gram.tobytes()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_top_1_keeps_only_the_last_block_the_final_norm_and_the_head(name: str) -> None:
    model = MODELS[name]()
    names = [n for n, _ in audited_parameters(model, "top:1")]
    assert names and all(".2." in n or not any(f".{i}." in n for i in range(3)) for n in names)
    assert any(".2." in n for n in names)
    assert not any("embed" in n or "wte" in n or "wpe" in n for n in names)
    assert any("norm" in n or "ln_f" in n for n in names)
    if name != "gpt2":
        assert "lm_head.weight" in names
    res = audit(model, _batch(), CANDS, method="reference", macro=False, params="top:1")
    ref = audit(model, _batch(), CANDS, method="fast", macro=False, params="top:1")
    for c in CANDS:
        assert res.cosines[c] == pytest.approx(ref.cosines[c], abs=1e-5)
    full = audit(model, _batch(), CANDS, method="fast", macro=False)
    assert float(abs(full.gram - res.gram).max()) > 1e-6  # a genuinely smaller parameter set


def test_a_tied_head_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="adwin.audit.params"):
        audited_parameters(_gpt2(), "top:2")
    assert "tied" in caplog.text and "audit.params=all" in caplog.text


def test_more_blocks_than_the_model_has_fails_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"audit.params='top:4'.*has 3"):
        audit(_llama(), _batch(), CANDS, params="top:4")


@pytest.mark.parametrize("spec", ["top:0", "top", "top:-1", "last:2", "ALL", "top:2 "])
def test_malformed_specs_fail_naming_the_field(spec: str) -> None:
    with pytest.raises(ValueError, match="audit.params"):
        parse_audit_params(spec)
