"""Sampling that drops stopped rows from the batch (``eval.compact``): the evaluation's sampler.

transformers' ``generate`` runs a batch until its longest row stops; rows that emitted EOS stay in the
batch as padding, attended to and cached at every step. When lengths vary (the built-in tasks: 30 to 320
tokens in one batch) most of the work is padding. Here the rows that stopped leave the batch after each
token (the one generation loop, ``adwin.decode.loop.decode`` with ``drop_stopped``), so a step costs what its
live rows cost.

The samples are ``rollout.generate``'s distribution (the shared ``adwin.decode.sampler.TokenSampler``),
greedy at temperature 0, and under per-row seeds (``rollout.seeding: per_sample``) the same tokens as
:func:`adwin.decode.generate.generate` with ``row_seeds`` (each row's ``k``-th token uses its generator's
``k``-th draw), up to float rounding that batch composition can change. Under batch seeding the noise comes
from torch's global RNG, drawn for the live rows only, so which draw a row gets differs from ``generate``'s
(the distribution does not).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adwin.decode.loop import Generation, decode
from adwin.decode.sampler import SamplingError, TokenSampler
from adwin.decode.static_cache import CompileSetting, compile_wanted, lays_rows


def generate_compacting(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, *, eos: set[int],
                        pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                        row_seeds: Sequence[int] | None = None, compile: CompileSetting = False,
                        shrink: bool = True) -> Generation:
    """Continue every context by at most ``budget`` tokens; a row leaves the batch at its first EOS (kept).

    ``compile`` (``rollout.compile``): decode on a static cache with the compiled step; ``shrink`` then moves
    the live rows to a smaller batch bucket once they fit one (measured 2x cheaper on CPU than keeping stopped
    rows as masked rows until the last one stops; docs/decisions.md, "Compiled decoding").
    """
    n = len(contexts)
    if row_seeds is not None and len(row_seeds) != n:
        raise SamplingError(f"row_seeds: {len(row_seeds)} seeds for {n} contexts")
    if n == 0:
        return Generation([], [], None)
    device = next(model.parameters()).device
    sampler = TokenSampler(temperature, top_p, row_seeds=row_seeds, device=device)
    # auto: eager where the static cache cannot lay rows (sliding windows); true refuses such a model by type
    static = compile_wanted(compile, device) and (compile is True or lays_rows(model))
    return decode(model, contexts, [budget] * n, eos=eos, pad_id=pad_id, sampler=sampler, drop_stopped=True,
                  static=static, shrink=shrink, decoder="compact")
