"""The staleness limit's clean-ups of a probe client's pool: unfinished probes a controller outage left past ``S``
(``drop_overstale``), complete probes no batch will name any more (``evict``), and the report of probes that will
never complete (``drop``). Its own state: whether the run was warned that most probes expire."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adwin.controller.feasibility import expiry_warning
from adwin.probes.conversation import ControllerLink
from adwin.probes.pool import ProbePool

log = logging.getLogger(__name__)


@dataclass
class Expiry:
    link: ControllerLink
    pool: ProbePool
    counts: dict[str, int]  # the client's counters: ``expired`` grows here, ``accepted`` is read
    release: Callable[[int], None]  # probes that left without an audit, for the decision budget
    warned: bool = False

    def drop(self, probe_ids: Sequence[str], version: int) -> int:
        """Report probes that will never complete dropped (their generation was lost: an outage, or the in-flight
        probes of a resumed AsyncOPD run); returns how many."""
        self.release(len(probe_ids))
        self.link.drop(probe_ids, version)
        return len(probe_ids)

    def drop_overstale(self, version: int, staleness_limit: int) -> int:
        """Unfinished probes already past S missed rounds (e.g. a controller outage): drop and report them."""
        stale = [p for p in self.pool.snapshot() if not p.finished and p.staleness(version) > staleness_limit]
        if not stale:
            return 0
        self.drop([p.probe_id for p in self.pool.pop([p.probe_id for p in stale])], version)
        log.warning("dropped %d probe(s) over the staleness limit S=%d at version %d (missed rounds, e.g. a "
                    "controller outage)", len(stale), staleness_limit, version)
        return len(stale)

    def evict(self, version: int, staleness_limit: int, probe_batch_size: int) -> int:
        """Forget complete probes past S: the controller expires them, no batch will name them."""
        gone = self.pool.evict_complete_past(version, staleness_limit)
        self.counts["expired"] += gone
        self.release(gone)
        warning = None if self.warned else expiry_warning(
            self.counts["expired"], self.counts["accepted"], probe_batch_size=probe_batch_size,
            staleness_limit=staleness_limit)
        if warning:
            self.warned = True
            log.warning("run %s: %s", self.link.run_id, warning)
        return gone
