"""Sampling that drops stopped rows from the batch (``eval.compact``): the evaluation's sampler.

transformers' ``generate`` runs a batch until its longest row stops; rows that emitted EOS stay in the
batch as padding, attended to and cached at every step. When lengths vary (the built-in tasks: 30 to 320
tokens in one batch) most of the work is padding. This loop is ``generate``'s sampling loop on the
model's own KV cache (the ``DynamicCache`` it builds), with one change: after each token the rows that stopped leave
the batch (``Cache.batch_select_indices``), so a step costs what its live rows cost.

The samples are ``generate``'s: the same tempered, top-p filtered distribution (transformers' own
warpers), greedy at temperature 0, and under per-row seeds (``rollout.seeding: per_sample``) the same
tokens as :func:`adwin.sampling.rollout.generate` with ``row_seeds`` (each row's ``k``-th token uses its
generator's ``k``-th draw, :class:`adwin.decode.sampler.TokenSampler`), up to float rounding that
batch composition can change. Under batch seeding the noise comes from torch's global RNG, drawn for the
live rows only, so which draw a row gets differs from ``generate``'s (the distribution does not).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adwin.decode.kv_cache import cache_keyword, returned_cache
from adwin.decode.sampler import TokenSampler
from adwin.decode.static_cache import (
    CompileSetting,
    StaticBatch,
    batch_bucket,
    cache_bucket,
    compile_wanted,
    lays_rows,
)
from adwin.sampling.rollout import Generation, left_pad


@torch.no_grad()
def generate_compacting(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, *, eos: set[int],
                        pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                        row_seeds: Sequence[int] | None = None, compile: CompileSetting = False,
                        shrink: bool = True) -> Generation:
    """Continue every context by at most ``budget`` tokens; a row leaves the batch at its first EOS (kept).

    ``compile`` (``rollout.compile``): decode on a static cache with the compiled step (``_static_loop``);
    ``shrink`` then moves the live rows to a smaller batch bucket once they fit one (measured 2x cheaper on CPU
    than keeping stopped rows as masked rows until the last one stops; docs/decisions.md, "Compiled decoding").
    """
    n = len(contexts)
    if row_seeds is not None and len(row_seeds) != n:
        raise ValueError(f"row_seeds: {len(row_seeds)} seeds for {n} contexts")
    responses: list[list[int]] = [[] for _ in range(n)]
    finished = [False] * n
    if n == 0 or budget <= 0:
        return Generation(responses, finished, None)
    device = next(model.parameters()).device
    ids, mask = left_pad(contexts, pad_id, device)  # (B, T)
    pick = TokenSampler(temperature, top_p, row_seeds=row_seeds, device=device)  # (b, V), rows (b,) -> (b,)
    eos_t = torch.tensor(sorted(eos), device=device)
    if compile_wanted(compile, device) and (compile is True or lays_rows(model)):  # auto: eager where it cannot
        steps = _static_loop(model, contexts, budget, pad_id, pick, eos_t, responses, finished, shrink)
        return Generation(responses, finished, None, decode_steps=steps)
    steps = 0  # token positions decoded (the loop's count)
    live = torch.arange(n, device=device)  # (b,) original row of each batch row
    positions = (mask.sum(dim=1) - 1).clamp_min(0)  # (b,) position of each row's last token
    was_training = model.training
    model.eval()
    try:
        # the model builds its own cache (a DynamicCache laid out for its layer types, sliding windows included)
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0), use_cache=True)
        logits, cache = out.logits[:, -1], returned_cache(out)  # (b, V)
        if cache is None or not hasattr(cache, "batch_select_indices"):
            raise ValueError(f"{type(model).__name__} returned no KV cache that can drop rows; evaluate with "
                             "eval.compact=false (transformers' generate)")
        cache_kw = cache_keyword(model)  # looked up once, not per token
        for step in range(budget):
            steps = step + 1
            tokens = pick(logits, live)  # (b,)
            for row, tok in zip(live.tolist(), tokens.tolist(), strict=True):
                responses[row].append(tok)
            stopped = torch.isin(tokens, eos_t)  # (b,)
            for row in live[stopped].tolist():
                finished[row] = True
            if step + 1 == budget or bool(stopped.all()):
                break
            if bool(stopped.any()):
                keep = (~stopped).nonzero().squeeze(1)  # (b',)
                cache.batch_select_indices(keep)
                live, mask, positions, tokens = live[keep], mask[keep], positions[keep], tokens[keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)  # (b, T + step + 1)
            positions = positions + 1
            logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                           **{cache_kw: cache}, use_cache=True).logits[:, -1]  # (b, V)
    finally:
        model.train(was_training)
    return Generation(responses, finished, None, decode_steps=steps)


@torch.no_grad()
def _static_loop(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, pad_id: int, pick,
                 eos_t: torch.Tensor, responses: list[list[int]], finished: list[bool], shrink: bool) -> int:
    """The compiled path: rows in a bucketed static batch (dummy rows after the real ones), stopped rows masked
    (or, with ``shrink``, dropped at bucket boundaries); fills ``responses``/``finished``, returns the steps."""
    n, device = len(contexts), next(model.parameters()).device
    rows = batch_bucket(n)
    ids, mask = left_pad([*contexts, *([[pad_id]] * (rows - n))], pad_id, device)  # (rows, T)
    was_training = model.training
    model.eval()
    try:
        batch = StaticBatch(model, rows, cache_bucket(ids.shape[1] + budget), "compact")
        logits = batch.prefill(ids, mask)  # (rows, V)
        origin = torch.arange(rows, device=device)  # (rows,) the context of each batch row; >= n: a dummy
        live = origin < n  # (rows,)
        positions = mask.sum(dim=1) - 1  # (rows,) position of each row's last token
        tokens = torch.full((rows,), pad_id, dtype=torch.long, device=device)  # (rows,)
        for step in range(budget):
            idx = live.nonzero().squeeze(1)  # (b,)
            drawn = pick(logits[idx], origin[idx])  # (b,)
            for row, tok in zip(origin[idx].tolist(), drawn.tolist(), strict=True):
                responses[row].append(tok)
            stopped = torch.isin(drawn, eos_t)  # (b,)
            for row in origin[idx][stopped].tolist():
                finished[row] = True
            if step + 1 == budget or bool(stopped.all()):
                return step + 1
            live[idx[stopped]] = False
            tokens = tokens.fill_(pad_id).index_copy(0, idx, drawn)
            positions = positions + 1
            if shrink and batch_bucket(int(live.sum())) < batch.rows:
                keep = live.nonzero().squeeze(1)  # (b',)
                small = batch_bucket(len(keep))
                batch = batch.select(keep, small, "compact")
                fill = torch.arange(len(keep), small, device=device)  # empty rows: masked, never read
                origin = torch.cat([origin[keep], fill + rows])
                live = torch.cat([live[keep], torch.zeros_like(fill, dtype=torch.bool)])
                tokens = torch.cat([tokens[keep], tokens.new_full((len(fill),), pad_id)])
                positions = torch.cat([positions[keep], positions.new_zeros(len(fill))])
            logits = batch.step(tokens, positions, live | (origin >= n))  # (rows, V)
    finally:
        model.train(was_training)
    return budget
