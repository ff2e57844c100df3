"""Tiny transformers models built in code (nothing comes from a hub)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def make_tiny_llama(
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 64,
    max_positions: int = 256,
    seed: int = 0,
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg)
    model.eval()  # no dropout; gradients still flow
    return model


def make_tiny_sliding_window_model(seed: int = 0) -> torch.nn.Module:
    """A tiny Qwen2 whose first layer attends through a sliding window (its cache rolls its columns)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, use_sliding_window=True, sliding_window=4, max_window_layers=0,
        layer_types=["sliding_attention", "full_attention"], pad_token_id=0, eos_token_id=2)).eval()


def without_cache(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` wrapped so that its outputs carry no KV cache (``past_key_values`` None), as some models' do."""

    class NoCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, **kw):
            out = self.inner(**kw)
            out.past_key_values = None
            return out

    return NoCache()


def padded_copy(model: LlamaForCausalLM, rows: int, seed: int = 99) -> LlamaForCausalLM:
    """``model`` with its embedding and output layer padded to ``rows`` rows (Qwen2.5-7B pads past its tokenizer).

    The first ``model``'s-vocabulary rows are the original's, so every real token scores as it did; the padding
    rows of the output layer are large, so a softmax over them takes most of the mass from the real columns."""
    n = int(model.config.vocab_size)
    cfg = model.config.to_dict() | {"vocab_size": rows}
    with torch.random.fork_rng():  # the caller's random stream (sampling) is left as it was
        torch.manual_seed(seed)
        wide = LlamaForCausalLM(type(model.config)(**cfg)).eval()
    state = model.state_dict()
    with torch.no_grad():
        for name, param in wide.state_dict().items():
            if param.shape == state[name].shape:
                param.copy_(state[name])
                continue
            param[:n].copy_(state[name])
            if "lm_head" in name:
                param[n:].copy_(state[name][: rows - n] * 20.0)
    return wide
