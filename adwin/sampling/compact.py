"""Sampling that drops stopped rows from the batch (``eval.compact``): the evaluation's sampler.

transformers' ``generate`` runs a batch until its longest row stops; rows that emitted EOS stay in the
batch as padding, attended to and cached at every step. When lengths vary (the built-in tasks: 30 to 320
tokens in one batch) most of the work is padding. This loop is ``generate``'s sampling loop on the
model's own KV cache (the ``DynamicCache`` it builds), with one change: after each token the rows that stopped leave
the batch (``Cache.batch_select_indices``), so a step costs what its live rows cost.

The samples are ``generate``'s: the same tempered, top-p filtered distribution (transformers' own
warpers), greedy at temperature 0, and under per-row seeds (``rollout.seeding: per_sample``) the same
tokens as :func:`adwin.sampling.rollout.generate` with ``row_seeds`` (each row's ``k``-th token uses its
generator's ``k``-th draw, :class:`adwin.sampling.seeding.SeededSampling`), up to float rounding that
batch composition can change. Under batch seeding the noise comes from torch's global RNG, drawn for the
live rows only, so which draw a row gets differs from ``generate``'s (the distribution does not).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adwin.sampling.kv_cache import cache_keyword, returned_cache
from adwin.sampling.rollout import Generation, left_pad
from adwin.sampling.seeding import SeededSampling


@torch.no_grad()
def generate_compacting(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, *, eos: set[int],
                        pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                        row_seeds: Sequence[int] | None = None) -> Generation:
    """Continue every context by at most ``budget`` tokens; a row leaves the batch at its first EOS (kept)."""
    n = len(contexts)
    if row_seeds is not None and len(row_seeds) != n:
        raise ValueError(f"row_seeds: {len(row_seeds)} seeds for {n} contexts")
    responses: list[list[int]] = [[] for _ in range(n)]
    finished = [False] * n
    if n == 0 or budget <= 0:
        return Generation(responses, finished, None)
    device = next(model.parameters()).device
    ids, mask = left_pad(contexts, pad_id, device)  # (B, T)
    pick = _sampler(temperature, top_p, row_seeds, device)
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
        eos_t = torch.tensor(sorted(eos), device=device)
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


def _sampler(temperature: float, top_p: float, row_seeds: Sequence[int] | None, device: torch.device):
    """``(logits (b, V), live rows (b,)) -> tokens (b,)``: greedy, per-row seeded, or global-RNG sampling."""
    if temperature <= 0:
        return lambda logits, live: logits.argmax(dim=-1)
    if row_seeds is not None:
        seeded = SeededSampling(row_seeds, temperature, top_p, device)
        generators = seeded.generators

        def per_row(logits: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
            seeded.generators = [generators[i] for i in live.tolist()]  # each live row draws from its own stream
            return seeded(live[:, None], logits).argmax(dim=-1)

        return per_row
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)]
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else []))

    def global_rng(logits: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(warpers(live[:, None], logits.float()), dim=-1)  # (b, V)
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    return global_rng
