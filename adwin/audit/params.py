"""Which parameters the audit differentiates: ``all`` or ``top:N`` (the last N transformer blocks + the head).

Math layer. With ``top:N`` the segment backward asks autograd only for the gradients of the upper blocks,
the final norm and the LM head, so it stops at block ``L - N`` instead of walking down to the embeddings:
the audit's backward cost falls roughly by the fraction of blocks left out. The cosines then compare the
prefix and full gradients restricted to those parameters; whether that changes the window decision is a
measured question (``adwin bench audit-agreement``), not an assumption.

Blocks are found generically for HF causal LMs (``adwin.student.structure.transformer_blocks``). Outside the blocks, everything except the input embeddings (token
and learned position embeddings) counts as the head. An LM head tied to the input embeddings is the same
tensor as the embedding, whose gradient needs the full backward; ``top:N`` leaves it out and says so.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from adwin.student.structure import transformer_blocks

if TYPE_CHECKING:  # torch stays out of the config's import (parse_audit_params validates audit.params)
    import torch

log = logging.getLogger(__name__)

_TOP = re.compile(r"^top:(\d+)$")


def parse_audit_params(spec: str) -> int | None:
    """``"all"`` -> None, ``"top:N"`` -> N (N >= 1); anything else raises naming ``audit.params``."""
    if spec == "all":
        return None
    m = _TOP.match(spec)
    if m is None or int(m.group(1)) < 1:
        raise ValueError(f"audit.params must be 'all' or 'top:N' with N >= 1, got {spec!r}")
    return int(m.group(1))


def audited_parameters(
    model: torch.nn.Module, spec: str = "all"
) -> list[tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` pairs the audit differentiates for ``spec`` (``all`` | ``top:N``), model order."""
    from adwin.student.lora import trainable_named_parameters  # torch stays out of the config's import

    n_top = parse_audit_params(spec)
    named = trainable_named_parameters(model)  # a LoRA student: its adapters (docs/decisions.md, "LoRA students")
    if n_top is None:
        return named
    blocks = transformer_blocks(model)
    if n_top > len(blocks):
        raise ValueError(
            f"audit.params={spec!r} asks for {n_top} blocks but the model has {len(blocks)}; "
            f"use N <= {len(blocks)} or audit.params=all"
        )
    if n_top == len(blocks):
        return named  # the backward reaches the embeddings anyway: top:N over every block is ``all``
    block_of = {id(p): i for i, blk in enumerate(blocks) for p in blk.parameters()}
    embeddings = _input_embedding_params(model)
    first = len(blocks) - n_top
    keep: list[tuple[str, torch.nn.Parameter]] = []
    tied = False
    for name, p in named:
        i = block_of.get(id(p))
        if i is not None:
            if i >= first:
                keep.append((name, p))
        elif id(p) in embeddings:
            tied = tied or _is_output_param(model, p)
        else:
            keep.append((name, p))
    if tied:
        log.warning(
            "audit.params=%s: the LM head is tied to the input embeddings; its gradient needs the full "
            "backward, so the top:N audit leaves it out (use audit.params=all to include it)",
            spec,
        )
    return keep


def _input_embedding_params(model: torch.nn.Module) -> set[int]:
    """Ids of the token and learned position embedding parameters (the bottom of the backward)."""
    import torch
    out: set[int] = set()
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if emb is not None:
        out.update(id(p) for p in emb.parameters())
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding) and m is not emb and re.search(r"(^|\.)(wpe|position_embeddings|embed_positions)$", name):
            out.update(id(p) for p in m.parameters())
    return out


def _is_output_param(model: torch.nn.Module, p: torch.nn.Parameter) -> bool:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head is not None and any(q is p for q in head.parameters())
