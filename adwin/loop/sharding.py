"""How a data-parallel run splits a step's batch over ranks and puts the step's rollouts back together.

Every rank draws the same global prompt batch (same seed, same stream) and keeps a contiguous slice of
``rollout.prompts_per_step`` prompts, so its rows are the contiguous slice of the global
``prompts_per_step x samples_per_prompt`` rows and global row ``i`` is row ``i`` of the 1-process
batch. After the optimizer step the rollouts (tokens, finish flags, behavior and teacher logprobs of the
response tokens) are all-gathered in rank order, so the probe side, the token ledger and the step metrics
see the 1-process batch on every rank (docs/decisions.md, "Data-parallel training").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adwin.config import TrainConfig
from adwin.loop.distributed import LocalDist
from adwin.sampling.batch import Batch
from adwin.sampling.rollout import layout, response_values
from adwin.sampling.seeding import row_seed


def check_data_parallel(cfg: TrainConfig, world: int) -> None:
    """Refuse, before any compute, what a ``world``-rank run cannot do (naming the field and the fix)."""
    if world <= 1:
        return
    r, p = cfg.rollout, cfg.probes
    if cfg.scheduler != "sync":
        raise ValueError(f"scheduler: data-parallel training (--nproc {world}) runs the sync scheduler; "
                         f"got {cfg.scheduler!r}")
    if r.backend != "hf":
        raise ValueError(f"rollout.backend: data-parallel training (--nproc {world}) samples with hf; "
                         f"got {r.backend!r}")
    if r.prompts_per_step % world:
        raise ValueError(f"rollout.prompts_per_step={r.prompts_per_step} must be divisible by the world size "
                         f"{world} (each rank samples an equal share of the prompts)")
    if cfg.probing:
        if p.backend != "inline":
            raise ValueError(f"probes.backend: data-parallel training (--nproc {world}) extends probes on the "
                             f"ranks themselves; set probes.backend: inline (--probe-backend inline), got "
                             f"{p.backend!r}")
        if p.batch_size < world:
            raise ValueError(f"probes.batch_size={p.batch_size} must be at least the world size {world} (each "
                             f"rank differentiates a share of every audited probe batch)")


def rollout_seeds(cfg: TrainConfig, step: int, prompts: slice, n: int) -> list[int] | None:
    """Per-row seeds of this rank's rollout rows (``rollout.seeding: per_sample``), keyed by global row."""
    return seeds_for(cfg, "rollout", step, range(prompts.start * n, prompts.stop * n))


def gather_rollouts(dist: LocalDist, batch: Batch, behavior: torch.Tensor, teacher: torch.Tensor,
                    pad_id: int) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """The global batch from every rank's shard: ``(batch, behavior (B, L), teacher logprobs (B, L))``.

    One process returns its arguments unchanged. Across ranks, the behavior and teacher logprobs travel
    for the response tokens only (what the probe side and the step metrics read), and the rows are laid
    out again exactly as the 1-process batch's.
    """
    if dist.world == 1:
        return batch, behavior, teacher
    mine = (batch.prompts, batch.prompt_ids, batch.response_ids, batch.finished, batch.behavior_logprobs,
            _response_lists(batch, behavior), _response_lists(batch, teacher))
    parts = dist.all_gather_object(mine)

    def cat(i: int) -> list:  # type: ignore[type-arg]
        return [x for part in parts for x in part[i]]

    prompt_ids, response_ids = cat(1), cat(2)
    rows = layout(prompt_ids, response_ids, pad_id)
    recorded = None if parts[0][4] is None else cat(4)
    full = Batch(cat(0), prompt_ids, response_ids, cat(3), rows, recorded)
    return full, response_values(rows, cat(5)), response_values(rows, cat(6))


def _response_lists(batch: Batch, values: torch.Tensor) -> list[list[float]]:
    """Per row, ``values`` (B, L) on its response tokens."""
    out = []
    for b, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids, strict=True)):
        out.append(values[b, len(p) : len(p) + len(r)].tolist())
    return out


def seeds_for(cfg: TrainConfig, purpose: str, step: int, keys: Sequence[int | str | bytes]) -> list[int] | None:
    """One seed per key (``rollout.seeding: per_sample``), or None (batch seeding: HF's global RNG)."""
    if cfg.rollout.seeding != "per_sample":
        return None
    return [row_seed(cfg.seed, purpose, step, k) for k in keys]
