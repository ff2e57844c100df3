"""Student rollouts: prompts to token ids, and the row layouts of prompt + response (generation: ``adwin.decode``).

Generation (``adwin.decode.generate.generate``) runs on left-padded prompts (what batched decoding needs);
scoring runs on right-padded prompt+response rows (what the loss and the audit expect: response position ``j`` counts from the first
response token). A sample is *finished* when it emitted EOS within its budget, else *unfinished*
(truncated by the window): only unfinished samples can become probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Rows:
    """Right-padded prompt+response rows, all (B, L)."""

    input_ids: torch.Tensor  # (B, L) long
    attention_mask: torch.Tensor  # (B, L) long 0/1
    response_mask: torch.Tensor  # (B, L) long 0/1, 1 on response tokens


def eos_ids(model: torch.nn.Module, tokenizer: object) -> set[int]:
    """Every id that ends a sample: the tokenizer's EOS plus the model's generation EOS ids."""
    ids: set[int] = set()
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(e) for e in gen_eos)
    if not ids:
        raise ValueError("the student has no EOS token (tokenizer.eos_token_id and generation_config are empty)")
    return ids


def pad_id_of(tokenizer: object, eos: set[int]) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else min(eos)


def encode_prompts(tokenizer: object, texts: Sequence[str], max_prompt_len: int) -> list[list[int]]:
    """Token ids of each prompt (chat template when the tokenizer has one), keeping the last tokens."""
    out: list[list[int]] = []
    for text in texts:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text, add_special_tokens=True)["input_ids"]  # type: ignore[operator]
        ids = [int(i) for i in ids][-max_prompt_len:]
        if not ids:
            raise ValueError(f"prompt {text[:40]!r} encodes to no tokens")
        out.append(ids)
    return out


def layout(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int, *,
           width: int | None = None) -> Rows:
    """Right-padded rows ``prompt + response`` with a response mask; every row holds at least one token.

    The one row layout of the project: rollouts, probe batches, adapter batches. ``width`` widens the rows
    to a fixed length (never narrows them); ``response_values`` lays per-token values on the same columns.
    """
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(max(lengths), 1, width or 0)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, L)
    attn = torch.zeros_like(ids)  # (B, L)
    resp = torch.zeros_like(ids)  # (B, L)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        row = list(p) + list(r)
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        attn[b, : len(row)] = 1
        resp[b, len(p) : len(row)] = 1
    return Rows(ids, attn, resp)


def response_values(rows: Rows, values: Sequence[Sequence[Any]], *, fill: float = 0.0,
                    dtype: torch.dtype = torch.float32, trailing: tuple[int, ...] = ()) -> torch.Tensor:
    """(B, L, *trailing) tensor of per-response-token values on the response columns of ``rows``.

    ``values[b][j]`` concerns response token ``j`` of row ``b`` (behavior logprobs, version tags, teacher
    logprobs; with ``trailing=(m,)`` one list of ``m`` per token), one entry per response token; ``fill``
    everywhere else.
    """
    n_resp = rows.response_mask.sum(dim=1).tolist()  # (B,)
    n_prompt = (rows.attention_mask.sum(dim=1) - rows.response_mask.sum(dim=1)).tolist()  # (B,)
    out = torch.full((*rows.input_ids.shape, *trailing), fill, dtype=dtype)
    for b, (n_p, n_r, vals) in enumerate(zip(n_prompt, n_resp, values, strict=True)):
        if len(vals) != n_r:
            raise ValueError(f"row {b}: {len(vals)} values for {n_r} response tokens")
        if n_r:
            out[b, n_p : n_p + n_r] = torch.tensor(vals, dtype=dtype)
    return out
