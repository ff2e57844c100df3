"""The probe client's conversation with the controller: every call names the run and carries an idempotency key
that repeats nowhere, so a retried call (``adwin.controller.remote``) is answered once. Its own state is the key
counters; what to say and when is the probe client's (``adwin.probes.client``)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from adwin.controller.api import ControllerAPI, ControllerError
from adwin.controller.schemas import (
    AuditIn,
    AuditOut,
    OfferIn,
    OfferOut,
    ProbeBatchOut,
    ProbePlanOut,
    ProbeReportIn,
)

log = logging.getLogger(__name__)


@dataclass
class ControllerLink:
    controller: ControllerAPI
    run_id: str
    _keys: Iterator[int] = field(default_factory=itertools.count)
    _batch_calls: dict[int, int] = field(default_factory=dict)

    def offer(self, offer: OfferIn) -> OfferOut:
        """Offer rollouts as probes; keyed by the step and the first offer's sample."""
        key = f"{self.run_id}-offer-{offer.step}-{offer.offers[0].sample_id}"
        return self.controller.offer_probes(self.run_id, offer, idempotency_key=key)

    def report(self, reports: Sequence[ProbeReportIn]) -> None:
        """Extension rounds' reports, in order."""
        for rep in reports:
            key = f"{self.run_id}-probe-{rep.probe_id}-{rep.version}-{next(self._keys)}"
            self.controller.report_probe(self.run_id, rep, idempotency_key=key)

    def complete(self, report: ProbeReportIn) -> None:
        """A probe generated outside the rounds, complete (raises ``ProbeConflict`` where it is no longer active)."""
        self.controller.report_probe(self.run_id, report, idempotency_key=f"{self.run_id}-complete-{report.probe_id}")

    def drop(self, probe_ids: Sequence[str], version: int) -> None:
        """Probes that will never complete, reported dropped; one the controller no longer holds is left as is."""
        for pid in probe_ids:
            try:
                report = ProbeReportIn(probe_id=pid, step=version, tokens_added=0, version=version, dropped=True)
                self.controller.report_probe(self.run_id, report, idempotency_key=f"{self.run_id}-drop-{pid}")
            except ControllerError as e:  # e.g. the controller no longer holds it as active: nothing to undo
                log.warning("probe %s: drop report refused (%s)", pid, e)

    def plan(self, version: int) -> ProbePlanOut:
        return self.controller.probe_plan(self.run_id, version)

    def next_batch(self, version: int) -> ProbeBatchOut | None:
        """The controller's next batch of P complete probes; None when none is ready."""
        n = self._batch_calls.get(version, -1) + 1
        self._batch_calls = {version: n}  # keys repeat nowhere: one counter per version, the current one
        return self.controller.next_probe_batch(self.run_id, step=version,
                                                idempotency_key=f"{self.run_id}-batch-{version}-{n}")

    def skip(self, audit_id: int, probes: int, pooled_into: int | None = None) -> None:
        """Close a batch unaudited, or as pooled into another batch's audit (``stats.pooled_into``)."""
        stats = {"probes": float(probes)} | ({"pooled_into": float(pooled_into)} if pooled_into is not None else {})
        self.submit(audit_id, AuditIn(skipped=True, stats=stats))

    def submit(self, audit_id: int, audit: AuditIn) -> AuditOut:
        return self.controller.submit_audit(self.run_id, audit_id, audit,
                                            idempotency_key=f"{self.run_id}-audit-{audit_id}")
