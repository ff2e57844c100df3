"""The inline probe backend's extender: ``RoundExtender``. Probes continue on the rollout engine
(``Sampler.generate``), sampling like the rollouts and recording behavior logprobs.

Every rank holds the same probe pool and runs the same plan (the bookkeeping is replicated, see
``adwin.loop.rank_zero``), so every rank is handed the same round. Each rank extends its contiguous share
of the round's contexts and the extensions are all-gathered in rank order: every pool applies the same
result, and the compute is split. With ``rollout.seeding: per_sample`` a row's noise comes from its own
generator keyed by (run seed, weights version of the round, the row's context and its occurrence among
identical contexts of the round), so a probe's tokens do not depend on how many ranks share the round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adwin.decode.loop import Generation
from adwin.loop.distributed import LocalDist
from adwin.probes.pool import Extension
from adwin.sampling.seeding import context_keys, row_seed


@dataclass
class RoundExtender:
    """An ``Extender`` (``adwin.probes.pool``) over the trainer's student; see the module docstring."""

    generate: Callable[..., Generation]  # the rollout engine's (``Sampler.generate``): probes continue on it
    temperature: float
    top_p: float
    dist: LocalDist
    seed: int | None  # the run seed under per_sample seeding; None: HF's batch RNG
    version: Callable[[], int] = lambda: 0  # the weights version the round runs under

    def __call__(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        return self.run(contexts, budgets, self.version())

    def row_seeds(self, contexts: list[list[int]], version: int) -> list[int] | None:
        """Each context's noise seed in a round at ``version`` (None: HF's batch RNG); the ``rollout`` backend
        seeds the probe rows it adds to a rollout call with these too."""
        if self.seed is None:
            return None
        return [row_seed(self.seed, "probe", version, k) for k in context_keys(contexts)]

    def run(self, contexts: list[list[int]], budgets: list[int], version: int) -> Extension:
        """One round at weights ``version``: this rank's share, then every rank's extensions in rank order (its
        decode steps: the most any rank decoded, the ranks decode side by side)."""
        mine = self.dist.shard(len(contexts))
        seeds = self.row_seeds(contexts, version)
        g = self.generate(contexts[mine], budgets[mine], temperature=self.temperature, top_p=self.top_p,
                          with_logprobs=True, row_seeds=None if seeds is None else seeds[mine])
        local = (g.response_ids, g.logprobs or [[] for _ in g.response_ids], g.finished, g.decode_steps)
        parts = self.dist.all_gather_object(local)
        return Extension(*([x for part in parts for x in part[i]] for i in range(3)),
                         decode_steps=max(part[3] for part in parts))
