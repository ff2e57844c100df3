"""The one generation loop of the student: contexts in, per-row continuations out, on a KV cache.

``decode`` continues a batch of left-padded contexts token by token with the shared ``TokenSampler``. A row
stops at its first EOS (kept) or at its own budget. One loop (``_loop``) over two cache paths:

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

from adwin.decode.kv_cache import (
    UncachedModelError,
    cache_keyword,
    last_logits_only,
    left_pad,
    returned_cache,
)
from adwin.decode.lean import LeanCache, lean_applies
from adwin.decode.sampler import TokenSampler
from adwin.decode.static_cache import StaticBatch, batch_bucket, cache_bucket

__all__ = ["Generation", "UncachedModelError", "decode", "left_pad"]  # the error and the padding live in kv_cache (the lean step reads them too)


@dataclass
class Generation:
    """Per-sample continuations; ragged lists because every sample stops at its own length."""

    response_ids: list[list[int]]  # generated tokens, EOS included when emitted
    finished: list[bool]  # emitted EOS within the budget
    logprobs: list[list[float]] | None = None  # log p(token) under the generating weights (temperature 1)
    decode_steps: int = 0  # token positions the call decoded for its batch (before rows are cut to their budgets)


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
           static: bool = False, shrink: bool = True, decoder: str = "generate", lean: bool = True) -> Generation:
    """Continue ``contexts[b]`` by at most ``budgets[b]`` tokens (see the module docstring). ``static``: the
    compiled path (``decoder`` names its shapes in the compile ledger); ``shrink`` (with ``drop_stopped``):
    move the live rows to a smaller bucket once they fit one. The model decodes in eval mode and gets its
    previous mode back. ``lean`` (not ``static``): decode a model ``lean_applies`` to with the lean step
    (``adwin.decode.lean``), else on the model's own cache."""
    n = len(contexts)
    if n == 0 or max(budgets, default=0) <= 0:
        return Generation([[] for _ in range(n)], [False] * n, [[] for _ in range(n)] if with_logprobs else None)
    rows = _Rows(budgets, eos, with_logprobs)
    was_training = model.training
    model.eval()
    try:
        budget = max(budgets)
        cache: _EagerCache | _StaticCache | LeanCache
        if static:
            cache = _StaticCache(model, contexts, budget, pad_id, shrink, decoder)
        elif lean and lean_applies(model):
            cache = LeanCache(model, contexts, budget, pad_id)
        else:
            cache = _EagerCache(model, contexts, budget, pad_id, drop_stopped)
        steps = _loop(cache, n, budget, pad_id, sampler, rows, drop_stopped)
    finally:
        model.train(was_training)
    return rows.generation(steps)


def _loop(cache: _EagerCache | _StaticCache | LeanCache, n: int, budget: int, pad_id: int, sampler: TokenSampler, rows: _Rows,
          drop_stopped: bool) -> int:
    """The generation loop; returns the steps decoded. Batch row ``i`` holds context ``origin[i]`` (``>= n``: a
    dummy or empty row); ``draw`` the batch rows the sampler draws for, in order (rows that stopped draw too
    when they keep their place: the batch's noise stays positional)."""
    size = cache.rows
    origin = list(range(size))
    live = [i < n and rows.budgets[i] > 0 for i in range(size)]  # a row with no budget never records a token
    n_live = sum(live)
    draw: slice | torch.Tensor = slice(0, n)
    seeds: torch.Tensor | None = None  # (b,) the drawn rows' seed indices; None: the identity
    tokens = torch.full((size,), pad_id, dtype=torch.long, device=cache.device)  # (rows,) each row's newest token
    logits = cache.logits  # (rows, V) float32
    for step in range(budget):
        picked = logits[draw]  # (b, V)
        drawn = sampler(picked, seeds)  # (b,)
        drawn_rows = range(size)[draw] if isinstance(draw, slice) else draw.tolist()
        stopped = rows.record([origin[i] for i in drawn_rows], [live[i] for i in drawn_rows], drawn, picked)
        n_live -= len(stopped)
        if step + 1 == budget or n_live == 0:
            return step + 1
        tokens[draw] = drawn
        if stopped:
            gone = [drawn_rows[i] for i in stopped]
            for i in gone:
                live[i] = False
            if not drop_stopped:
                cache.stop(gone)
            else:
                keep = [i for i, on in enumerate(live) if on]
                idx = torch.tensor(keep, dtype=torch.long, device=cache.device)  # (b',)
                if cache.drop(idx, gone):  # the batch is now the kept rows, then empty ones
                    size = cache.rows
                    origin = [origin[i] for i in keep] + [n + i for i in range(size - n_live)]
                    live = [True] * n_live + [False] * (size - n_live)
                    tokens = torch.cat([tokens[idx], tokens.new_full((size - n_live,), pad_id)])
                    draw = slice(0, n_live)
                else:
                    draw = idx
                seeds = torch.tensor([origin[i] for i in range(size)[draw]] if isinstance(draw, slice) else
                                     [origin[i] for i in keep], dtype=torch.long)
        logits = cache.step(tokens)
    return budget


class _EagerCache:
    """The model's own KV cache (the ``DynamicCache`` its forward builds). A row that stops while keeping its place
    writes masked columns from then on; a dropped row leaves the cache (``batch_select_indices``)."""

    def __init__(self, model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, pad_id: int,
                 drop_stopped: bool) -> None:
        self.model, self.device = model, next(model.parameters()).device
        ids, mask = left_pad(contexts, pad_id, self.device)  # (b, T)
        self.rows, self.width = len(contexts), ids.shape[1]
        self.positions = (mask.sum(dim=1) - 1).clamp_min(0)  # (b,) position of each row's last token
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0),
                    use_cache=True, **last_logits_only(model))
        self.logits, self.cache = out.logits[:, -1].float(), returned_cache(out)  # (b, V)
        if drop_stopped and (self.cache is None or not hasattr(self.cache, "batch_select_indices")):
            raise UncachedModelError(f"{type(model).__name__} returned no KV cache that can drop rows; evaluate "
                                     "with eval.compact=false (rows stay in the batch)")
        if self.cache is None:  # a step feeds one token: without the cache it would see no context
            raise UncachedModelError(f"{type(model).__name__} returned no KV cache (use_cache=True); the decode loop "
                                     "feeds one token a step on the model's own cache")
        self.mask = torch.cat([mask, mask.new_ones(self.rows, budget)], dim=1)  # (b, T + budget): steps slice it
        self._kw = cache_keyword(model)  # looked up once, not per token

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Decode ``tokens`` (b,); next-token logits (b, V) float32."""
        self.width += 1
        self.positions = self.positions + 1
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask[:, : self.width],
                         position_ids=self.positions[:, None], **{self._kw: self.cache}, use_cache=True)
        return out.logits[:, -1].float()

    def stop(self, rows: list[int]) -> None:
        self.mask[rows, self.width :] = 0

    def drop(self, keep: torch.Tensor, gone: list[int]) -> bool:
        self.cache.batch_select_indices(keep)
        self.mask, self.positions, self.rows = self.mask[keep], self.positions[keep], len(keep)
        return True


class _StaticCache:
    """A bucketed ``StaticBatch`` with the compiled step, dummy rows after the real ones. A stopped row writes
    masked columns; dropping rows moves the live ones to a smaller bucket once they fit one (``shrink``)."""

    def __init__(self, model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, pad_id: int,
                 shrink: bool, decoder: str) -> None:
        self.device, self.shrink, self.decoder = next(model.parameters()).device, shrink, decoder
        self.rows = batch_bucket(len(contexts))
        ids, mask = left_pad([*contexts, *([[pad_id]] * (self.rows - len(contexts)))], pad_id, self.device)
        self.batch = StaticBatch(model, self.rows, cache_bucket(ids.shape[1] + budget), decoder)
        self.logits = self.batch.prefill(ids, mask).float()  # (rows, V)
        self.positions = mask.sum(dim=1) - 1  # (rows,) position of each row's last token
        self.decoding = torch.ones(self.rows, dtype=torch.bool, device=self.device)  # (rows,) False: masked column

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.positions = self.positions + 1
        return self.batch.step(tokens, self.positions, self.decoding).float()  # (rows, V)

    def stop(self, rows: list[int]) -> None:
        self.decoding[rows] = False

    def drop(self, keep: torch.Tensor, gone: list[int]) -> bool:
        if not self.shrink or batch_bucket(len(keep)) >= self.rows:
            self.stop(gone)
            return False
        small = batch_bucket(len(keep))
        self.batch = self.batch.select(keep, small, self.decoder)
        fill = small - len(keep)  # empty rows: they write columns only they see, never read
        self.positions = torch.cat([self.positions[keep], self.positions.new_zeros(fill)])
        self.decoding = torch.ones(small, dtype=torch.bool, device=self.device)
        self.rows = small
        return True
