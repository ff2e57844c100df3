"""The staleness limit's two clean-ups of a probe client's pool: unfinished probes a controller outage left
past ``S`` (``drop_overstale``) and complete probes no batch will name any more (``evict_expired``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from adwin.controller.api import ControllerError
from adwin.controller.feasibility import expiry_warning
from adwin.controller.schemas import ProbeReportIn

if TYPE_CHECKING:
    from adwin.probes.client import ProbeClient

log = logging.getLogger("adwin.probes.client")


def drop_overstale(client: ProbeClient, version: int) -> int:
    """Unfinished probes already past S missed rounds (e.g. a controller outage): drop and report them."""
    stale = [p for p in client.pool.snapshot() if not p.finished and p.staleness(version) > client.staleness_limit]
    if not stale:
        return 0
    client._release(len(stale))
    for p in client.pool.pop([p.probe_id for p in stale]):
        try:
            report = ProbeReportIn(probe_id=p.probe_id, step=version, tokens_added=0, version=version, dropped=True)
            client.controller.report_probe(client.run_id, report, idempotency_key=f"{client.run_id}-drop-{p.probe_id}")
        except ControllerError as e:  # e.g. the controller no longer holds it as active: nothing to undo
            log.warning("probe %s: drop report refused (%s)", p.probe_id, e)
    log.warning("dropped %d probe(s) over the staleness limit S=%d at version %d (missed rounds, e.g. a "
                "controller outage)", len(stale), client.staleness_limit, version)
    return len(stale)


def evict_expired(client: ProbeClient, version: int) -> int:
    """Forget complete probes past S: the controller expires them, no batch will name them."""
    gone = client.pool.evict_complete_past(version, client.staleness_limit)
    client.counts["expired"] += gone
    client._release(gone)
    warning = None if client._expiry_warned else expiry_warning(
        client.counts["expired"], client.counts["accepted"], probe_batch_size=client.probe_batch_size,
        staleness_limit=client.staleness_limit)
    if warning:
        client._expiry_warned = True
        log.warning("run %s: %s", client.run_id, warning)
    return gone
