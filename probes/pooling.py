"""The decision budget's pooled audits on the probe client's side: ready probe batches are *held* until the
budget's ``pool_size`` says how many to audit together as one decision (docs/decisions.md, "Decision budget",
rule 3). Held batches belong to the client alone (the controller has already batched their probes), so every
way out of the hold is here: audited pooled (``dispatch_held``), closed unaudited past the staleness limit, or
released at a run's end."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from adwin.controller.schemas import ProbeBatchOut
from adwin.probes.pool import Probe

if TYPE_CHECKING:
    from adwin.probes.auditors import AuditRunner
    from adwin.probes.client import ProbeClient

log = logging.getLogger("adwin.probes.client")

Held = tuple[ProbeBatchOut, list[Probe]]  # a ready batch and its probes, taken out of the pool


def dispatch_held(client: ProbeClient, m: dict[str, float], version: int, runner: AuditRunner, *, flush: bool,
                  release: bool) -> None:
    """Hold every batch the controller has ready, close the held ones past S, then either release them all
    (``release``: a run's last step, into ``audit/released``) or audit groups of the size the budget pools now
    (``flush``: every held batch as one group, before a checkpoint)."""
    while (ready := client._next_batch(version)) is not None:
        client._held.append(ready)
    _close_overstale(client, version)
    if release and client._held:
        m["audit/released"] = float(len(client._held))
        for ready, probes in client._held:
            client._skip(ready.audit_id, len(probes))
        client._held = []
    while client._held:
        n, oldest = len(client._held), max(p.staleness(version) for _, probes in client._held for p in probes)
        k = n if flush else client._spend(lambda b, n=n, o=oldest: b.pool_size(n, o))
        if not k:
            return
        group, client._held = client._held[:k], client._held[k:]
        client._dispatch(m, version, runner, group)


def _close_overstale(client: ProbeClient, version: int) -> None:
    """Held batches past S (a loop that skipped ``audit`` calls) can no longer be audited: close them."""
    keep: list[Held] = []
    for ready, probes in client._held:
        if max(p.staleness(version) for p in probes) <= client.staleness_limit:
            keep.append((ready, probes))
            continue
        log.warning("audit %d: held past the staleness limit S=%d, closed unaudited", ready.audit_id,
                    client.staleness_limit)
        client._skip(ready.audit_id, len(probes))
    client._held = keep
