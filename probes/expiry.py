"""The staleness limit's two clean-ups of a probe client's pool: unfinished probes a controller outage left
past ``S`` (``drop_overstale``) and complete probes no batch will name any more (``evict_expired``); and the
report of probes that will never complete (``drop_probes``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
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
    drop_probes(client, [p.probe_id for p in client.pool.pop([p.probe_id for p in stale])], version)
    log.warning("dropped %d probe(s) over the staleness limit S=%d at version %d (missed rounds, e.g. a "
                "controller outage)", len(stale), client.staleness_limit, version)
    return len(stale)


def drop_probes(client: ProbeClient, probe_ids: Sequence[str], version: int) -> int:
    """Report probes that will never complete dropped (their generation was lost: an outage, or the in-flight
    probes of a resumed AsyncOPD run); returns how many."""
    client._release(len(probe_ids))
    for pid in probe_ids:
        try:
            report = ProbeReportIn(probe_id=pid, step=version, tokens_added=0, version=version, dropped=True)
            client.controller.report_probe(client.run_id, report, idempotency_key=f"{client.run_id}-drop-{pid}")
        except ControllerError as e:  # e.g. the controller no longer holds it as active: nothing to undo
            log.warning("probe %s: drop report refused (%s)", pid, e)
    return len(probe_ids)


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
