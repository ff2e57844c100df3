"""The decision budget's pooled audits on the probe client's side: ready probe batches are *held* until the
budget's ``pool_size`` says how many to audit together as one decision (docs/decisions.md, "Decision budget",
rule 3). Held batches belong to the client alone (the controller has already batched their probes), so every
way out of the hold is here: audited pooled, closed unaudited past the staleness limit, or released at a run's
end. Its own state is the held batches; the client it works for is seen through ``BatchAuditing``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from adwin.audit.budget import DecisionBudget
from adwin.controller.schemas import ProbeBatchOut
from adwin.probes.auditors import AuditRunner
from adwin.probes.pool import Probe

log = logging.getLogger(__name__)

T = TypeVar("T")
Held = tuple[ProbeBatchOut, list[Probe]]  # a ready batch and its probes, taken out of the pool


class BatchAuditing(Protocol):
    """What the hold needs of the probe client: its ready batches, and the two ways a batch leaves."""

    staleness_limit: int

    def next_batch(self, version: int) -> Held | None: ...

    def close_unaudited(self, audit_id: int, probes: int) -> None: ...

    def audit_group(self, m: dict[str, float], version: int, runner: AuditRunner, group: Sequence[Held]) -> None: ...

    def spend(self, call: Callable[[DecisionBudget], T]) -> T | None: ...


@dataclass
class HeldBatches:
    held: list[Held] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.held)

    def dispatch(self, client: BatchAuditing, m: dict[str, float], version: int, runner: AuditRunner, *,
                 flush: bool, release: bool) -> None:
        """Hold every batch the controller has ready, close the held ones past S, then either release them all
        (``release``: a run's last step, into ``audit/released``) or audit groups of the size the budget pools now
        (``flush``: every held batch as one group, before a checkpoint)."""
        while (ready := client.next_batch(version)) is not None:
            self.held.append(ready)
        self._close_overstale(client, version)
        if release and self.held:
            m["audit/released"] = float(len(self.held))
            for ready, probes in self.held:
                client.close_unaudited(ready.audit_id, len(probes))
            self.held = []
        while self.held:
            n, oldest = len(self.held), max(p.staleness(version) for _, probes in self.held for p in probes)
            k = n if flush else client.spend(lambda b, n=n, o=oldest: b.pool_size(n, o))
            if not k:
                return
            group, self.held = self.held[:k], self.held[k:]
            client.audit_group(m, version, runner, group)

    def _close_overstale(self, client: BatchAuditing, version: int) -> None:
        """Held batches past S (a loop that skipped ``audit`` calls) can no longer be audited: close them."""
        keep: list[Held] = []
        for ready, probes in self.held:
            if max(p.staleness(version) for p in probes) <= client.staleness_limit:
                keep.append((ready, probes))
                continue
            log.warning("audit %d: held past the staleness limit S=%d, closed unaudited", ready.audit_id,
                        client.staleness_limit)
            client.close_unaudited(ready.audit_id, len(probes))
        self.held = keep
