"""What a student model is made of, read from the model alone (neither torch nor peft is imported for it): its
stack of transformer blocks (``transformer_blocks``: what ``audit.params: top:N`` counts from the top and what
FSDP shards one unit each, ``adwin.student.fsdp``) and whether peft wraps it (``is_lora``).

Blocks are found generically for HF causal LMs (Llama, Qwen2, Mistral: ``model.layers``; GPT-2:
``transformer.h``; ...): the ``torch.nn.ModuleList`` with ``config.num_hidden_layers`` entries (or, without
that config key, the longest ModuleList).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch stays out of the config's import (adwin.audit.params validates audit.params)
    import torch


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's stack of transformer blocks (the ModuleList of ``config.num_hidden_layers`` entries)."""
    import torch
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if n_layers is not None:
        lists = [(name, m) for name, m in lists if len(m) == int(n_layers)]
    if not lists:
        raise ValueError(
            "audit.params=top:N needs a model with a ModuleList of transformer blocks"
            + (f" of config.num_hidden_layers={n_layers} entries" if n_layers is not None else "")
            + "; use audit.params=all for this model"
        )
    return max(lists, key=lambda nm: len(nm[1]))[1]


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft-wrapped student (never imports peft: a model from it implies it is loaded)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)
