"""The one generation loop of the student: contexts in, per-row continuations out, on a KV cache.

``decode`` continues a batch of left-padded contexts token by token with the shared ``TokenSampler``. A row
stops at its first EOS (kept) or at its own budget. Two cache paths, one loop:

- **eager**: the model's own KV cache (the ``DynamicCache`` its forward builds, laid out for its layer types,
  sliding windows included);
- **static** (``rollout.compile``; ``adwin.decode.static_cache``): a ``StaticBatch`` (bucketed rows and columns)
  and transformers' compiled one-token step, dummy rows after the real ones.

and two ways to treat a row that stopped:

- ``drop_stopped`` (the evaluation's ``eval.compact``): it leaves the batch (eager: ``Cache.batch_select_indices``;
  static: a masked row, moved out at bucket boundaries with ``shrink``), so a step costs what its live rows
  cost. Under batch seeding the noise is drawn for the live rows only.
- otherwise (rollouts, probe rounds): every real row keeps its place and the sampler draws for all of them at
  every step, as transformers' ``generate`` does, so a row's global-RNG noise depends only on its place in the
  batch (the static path draws for the real rows only: dummy rows never move a real row's noise).

Per-row seeds give a row the same tokens whichever way stopped rows are treated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adwin.decode.kv_cache import cache_keyword, last_logits_only, returned_cache
from adwin.decode.sampler import TokenSampler
from adwin.decode.static_cache import StaticBatch, batch_bucket, cache_bucket


class UncachedModelError(ValueError):
    """The model returned no KV cache whose rows can be dropped (``drop_stopped`` needs one)."""


@dataclass
class Generation:
    """Per-sample continuations; ragged lists because every sample stops at its own length."""

    response_ids: list[list[int]]  # generated tokens, EOS included when emitted
    finished: list[bool]  # emitted EOS within the budget
    logprobs: list[list[float]] | None = None  # log p(token) under the generating weights (temperature 1)
    decode_steps: int = 0  # token positions the call decoded for its batch (before rows are cut to their budgets)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and attention mask with every sequence flush right."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        if s:
            ids[b, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[b, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


class _Rows:
    """What the loop records per original row: tokens, logprobs, whether it stopped. Kept in Python lists: a
    step's bookkeeping is a few list operations per row rather than a dozen small tensor ops (the loop's
    per-token overhead on CPU)."""

    def __init__(self, budgets: Sequence[int], eos: set[int], with_logprobs: bool) -> None:
        n = len(budgets)
        self.responses: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] | None = [[] for _ in range(n)] if with_logprobs else None
        self.finished = [False] * n
        self.budgets, self.eos = list(budgets), eos

    def record(self, origin: list[int], live: list[bool], tokens: torch.Tensor, logits: torch.Tensor) -> list[int]:
        """Append ``tokens`` (b,) to the rows ``origin`` (b,) that are ``live``; the batch rows that stop now
        (EOS or their budget), marked not live."""
        toks = tokens.tolist()
        lps = None
        if self.logprobs is not None:
            lps = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1).tolist()  # (b,)
        stopped = []
        for i, (row, tok) in enumerate(zip(origin, toks, strict=True)):
            if not live[i]:
                continue
            resp = self.responses[row]
            resp.append(tok)
            if lps is not None:
                self.logprobs[row].append(lps[i])  # type: ignore[index]
            if tok in self.eos:
                self.finished[row] = True
            elif len(resp) < self.budgets[row]:
                continue
            live[i] = False
            stopped.append(i)
        return stopped

    def generation(self, steps: int) -> Generation:
        return Generation(self.responses, self.finished, self.logprobs, decode_steps=steps)


@torch.no_grad()
def decode(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budgets: Sequence[int], *, eos: set[int],
           pad_id: int, sampler: TokenSampler, with_logprobs: bool = False, drop_stopped: bool = False,
           static: bool = False, shrink: bool = True, decoder: str = "generate") -> Generation:
    """Continue ``contexts[b]`` by at most ``budgets[b]`` tokens (see the module docstring). ``static``: the
    compiled path (``decoder`` names its shapes in the compile ledger); ``shrink`` (with ``drop_stopped``):
    move the live rows to a smaller bucket once they fit one. The model decodes in eval mode and gets its
    previous mode back."""
    n = len(contexts)
    if n == 0 or max(budgets, default=0) <= 0:
        return Generation([[] for _ in range(n)], [False] * n, [[] for _ in range(n)] if with_logprobs else None)
    rows = _Rows(budgets, eos, with_logprobs)
    was_training = model.training
    model.eval()
    try:
        loop = _static_loop if static else _eager_loop
        steps = loop(model, contexts, max(budgets), pad_id, sampler, rows, drop_stopped, shrink, decoder)
    finally:
        model.train(was_training)
    return rows.generation(steps)


def _eager_loop(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, pad_id: int,
                sampler: TokenSampler, rows: _Rows, drop_stopped: bool, shrink: bool, decoder: str) -> int:
    """The model's own KV cache; returns the steps decoded."""
    n, device = len(contexts), next(model.parameters()).device
    ids, mask = left_pad(contexts, pad_id, device)  # (b, T)
    width = ids.shape[1]
    origin, live, n_live = list(range(n)), [True] * n, n  # the context of each batch row; still decoding
    seeds: torch.Tensor | None = None  # (b,) each batch row's seed index once rows left; None: the identity
    positions = (mask.sum(dim=1) - 1).clamp_min(0)  # (b,) position of each row's last token
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0), use_cache=True,
                **last_logits_only(model))
    logits, cache = out.logits[:, -1].float(), returned_cache(out)  # (b, V)
    if drop_stopped and (cache is None or not hasattr(cache, "batch_select_indices")):
        raise UncachedModelError(f"{type(model).__name__} returned no KV cache that can drop rows; evaluate with "
                                 "eval.compact=false (rows stay in the batch)")
    mask = torch.cat([mask, mask.new_ones(n, budget)], dim=1)  # (b, T + budget): a step attends to a prefix
    cache_kw = cache_keyword(model)  # looked up once, not per token
    for step in range(budget):
        # rows that stopped draw too when they keep their place: the batch's noise stays positional
        tokens = sampler(logits, seeds)  # (b,)
        stopped = rows.record(origin, live, tokens, logits)
        n_live -= len(stopped)
        if step + 1 == budget or n_live == 0:
            return step + 1
        if drop_stopped and stopped:
            keep = [i for i, on in enumerate(live) if on]
            idx = torch.tensor(keep, dtype=torch.long, device=device)  # (b',)
            cache.batch_select_indices(idx)
            mask, positions, tokens = mask[idx], positions[idx], tokens[idx]
            origin, live = [origin[i] for i in keep], [True] * len(keep)
            seeds = torch.tensor(origin, dtype=torch.long)
        width += 1
        positions = positions + 1
        logits = model(input_ids=tokens[:, None], attention_mask=mask[:, :width], position_ids=positions[:, None],
                       **{cache_kw: cache}, use_cache=True).logits[:, -1].float()  # (b, V)
    return budget


def _static_loop(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, pad_id: int,
                 sampler: TokenSampler, rows: _Rows, drop_stopped: bool, shrink: bool, decoder: str) -> int:
    """A bucketed ``StaticBatch`` with the compiled step, dummy rows after the real ones; returns the steps."""
    n, device = len(contexts), next(model.parameters()).device
    size = batch_bucket(n)
    ids, mask = left_pad([*contexts, *([[pad_id]] * (size - n))], pad_id, device)  # (size, T)
    batch = StaticBatch(model, size, cache_bucket(ids.shape[1] + budget), decoder)
    logits = batch.prefill(ids, mask).float()  # (size, V)
    origin = list(range(size))  # the context of each batch row; >= n: a dummy or empty row
    live = [i < n for i in range(size)]
    n_live = n
    positions = mask.sum(dim=1) - 1  # (size,) position of each row's last token
    tokens = torch.full((size,), pad_id, dtype=torch.long, device=device)  # (size,)
    draw = torch.arange(n, device=device)  # (b,) the batch rows the sampler draws for, in order
    seeds: torch.Tensor | None = None  # (b,) their seed indices; None: the identity
    decoding = torch.tensor([True] * size, device=device)  # (size,) False: a stopped row writes a masked column
    for step in range(budget):
        drawn = sampler(logits[draw], seeds)  # (b,)
        on = [live[i] for i in draw.tolist()] if drop_stopped else live[:n]
        stopped = rows.record([origin[i] for i in draw.tolist()], on, drawn, logits[draw])
        n_live -= len(stopped)
        if step + 1 == budget or n_live == 0:
            return step + 1
        tokens = tokens.index_copy(0, draw, drawn)
        positions = positions + 1
        if stopped:
            gone = draw[torch.tensor(stopped, dtype=torch.long, device=device)]
            for i in gone.tolist():
                live[i] = False
            decoding[gone] = False
            if drop_stopped:
                draw = torch.tensor([i for i, on in enumerate(live) if on], dtype=torch.long, device=device)
                seeds = torch.tensor([origin[i] for i in draw.tolist()], dtype=torch.long)
        if drop_stopped and shrink and batch_bucket(n_live) < batch.rows:
            keep = draw  # (b',) the live rows, in order
            small = batch_bucket(n_live)
            batch = batch.select(keep, small, decoder)
            fill = small - n_live  # empty rows: masked, never read
            origin = [origin[i] for i in keep.tolist()] + [size + i for i in range(fill)]
            live = [True] * n_live + [False] * fill
            tokens = torch.cat([tokens[keep], tokens.new_full((fill,), pad_id)])
            positions = torch.cat([positions[keep], positions.new_zeros(fill)])
            decoding = torch.tensor([True] * small, device=device)  # empty rows write columns only they see
            draw = torch.arange(n_live, device=device)
        logits = batch.step(tokens, positions, decoding).float()  # (rows, V)
    return budget
