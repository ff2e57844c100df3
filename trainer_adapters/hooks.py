"""Window hooks: how an AsyncOPD-style streaming scheduler asks the ADWIN controller for windows and probes.

A streaming scheduler (prompt feeder -> rollout workers -> teacher scoring -> learner, see
``adwin.trainer_adapters.asyncopd``) has no synchronous "step" at which a whole batch is rolled out,
so the synchronous trainer's loop (docs/design.md) is split into five calls, each made at a well-defined
point of the pipeline. Any scheduler that makes these calls gets adaptive windows; any object that
implements ``WindowHooks`` can serve them (``ControllerWindowHooks`` talks to a ``ControllerAPI``,
``StaticWindowHooks`` is a fixed window without a controller).

Contract, in pipeline order:

1. ``on_sync(version)`` at every weight-sync boundary, *while the sync gate is closed* (before the
   feeder may use the permits the learner just released), and once with ``version = 0`` before the
   feeder starts. It reads the window for the coming phase from the controller and returns which
   in-flight probes reached the staleness limit (force-complete them). The window is constant between
   two syncs: requests submitted in the same phase get the same cap. An answer outside ``[1, max_len]`` is
   refused with ``BadWindowAnswer`` before anything changes (the last window stays).
2. ``plan_request(request_id, prompt_id, version)`` by the feeder for every request, at submission.
   It decides whether the request is a *probe* and how many tokens it may generate:

   - a training request gets ``max_tokens = window``: the window caps the number of generated tokens
     per request, never the tensor width. Learner batches stay padded to the global maximum
     (``max prompt + max_response_len``) so that a changing window never changes tensor shapes.
   - a probe gets ``max_tokens = max_response_len`` (full length). It is detached from the logical
     batch: the learner never waits for it, it is never trained on, and it does **not** hold a
     learner permit (the feeder returns the permit it took). Probes are bounded instead by the
     controller, which declines offers beyond ``offers_per_step`` per version and
     ``max_active_probes`` in flight; a declined offer is an ordinary training request.
3. The scheduler stamps every completed item (``StampedItem``): ``window`` (the cap in force at
   submission), ``is_probe``, ``finish_reason`` (``eos``, ``window`` = stopped by the cap,
   ``horizon`` = reached ``max_response_len``), ``forced`` and the *version breakpoints*: the token
   indices at which the generating weights changed under keep-mode sync, as
   ``[(token_index, new_version), ...]`` after the first token's ``behavior_version``.
4. ``on_probe_complete(item, version)`` by the train dispatcher when a probe leaves the pipeline; the
   hooks report it to the controller (tokens, newest version, finished/forced) and keep it for its audit.
   ``offer_complete(items, version)`` by the learner for the training items of each batch: items that
   finished inside their window (EOS) or reached the horizon are offered as already complete probes by
   the one offer rule (``probes.offers.offer_indices``, ``offer_finished``; window-cut items are not:
   this pipeline never continues a training request).
5. ``poll_audit(version)`` by the learner between updates: when the controller has a batch of P
   completed probes ready (windowed FIFO), ``ControllerWindowHooks`` audits them through the one probe client
   (``adwin.probes.client.ProbeClient``: the sync trainer's settings, schedule and drift, the audit under the
   current learner weights) and submits it; the next ``on_sync`` then reads the window that audit decided.
   After the run's last update (``last=True``) a decision budget's held batches are released unaudited.

``on_step(step, metrics)`` forwards learner metrics to the controller's telemetry (optional).

Versions are learner versions: the number of optimizer updates applied. The controller's ``step``
argument is always the current learner version.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import AuditIn, StepMetricsIn
from adwin.probes.client import ProbeClient
from adwin.probes.offers import OFFER_FINISHED
from adwin.probes.pool import Probe, ProbePool
from adwin.runtime.metrics_log import numeric
from adwin.runtime.resilient_controller import controller_metrics
from adwin.trainer_adapters.registration import check_feasible, resilient

log = logging.getLogger(__name__)

FINISH_REASONS: tuple[str, ...] = ("eos", "window", "horizon")


class BadWindowAnswer(ValueError):
    """The controller answered a window no request can be capped at (outside ``[1, max_len]``)."""


class StampedItem(Protocol):
    """What the hooks read from a completed item (the scheduler's ``StreamItem``; it carries more)."""

    request_id: str
    prompt_id: str
    prompt_ids: list[int]
    route: str
    submitted_version: int
    tokens: list[int]
    logprobs: list[float]  # behavior logprob of each token
    token_versions: list[int]  # the weights version of each token
    teacher_logprobs: list[float] | None  # filled by the teacher stage
    window: int  # the window in force when the request was submitted
    max_tokens: int  # the cap it was given: window, or max_response_len for probes
    is_probe: bool
    finish_reason: str | None  # one of FINISH_REASONS once complete
    forced: bool  # a probe force-completed at the staleness limit
    version_breakpoints: list[tuple[int, int]]  # (token index, new version) where the weights changed

    @property
    def behavior_version(self) -> int: ...  # version of the first (oldest) token

    @property
    def newest_version(self) -> int: ...

    @property
    def response_len(self) -> int: ...


@dataclass(frozen=True)
class RequestPlan:
    """The hooks' answer for one request at submission."""

    max_tokens: int
    is_probe: bool
    window: int


@dataclass
class SyncDecision:
    """What ``on_sync`` read: the window of the next phase and probes to force-complete now."""

    version: int
    window: int
    force_complete: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


# An auditor turns a batch of completed probes (controller order) into the audit to submit.
Auditor = Callable[[Sequence[StampedItem]], AuditIn]


@runtime_checkable
class WindowHooks(Protocol):
    """The five calls an AsyncOPD-style scheduler makes (module docstring has the full contract)."""

    def on_sync(self, version: int) -> SyncDecision: ...

    def plan_request(self, request_id: str, prompt_id: str, version: int) -> RequestPlan: ...

    def on_probe_complete(self, item: StampedItem, version: int) -> None: ...

    def offer_complete(self, items: Sequence[StampedItem], version: int) -> int: ...

    def poll_audit(self, version: int, *, last: bool = False) -> dict[str, float]: ...

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None: ...


class StaticWindowHooks:
    """A fixed window without a controller; every ``probe_every``-th request is a probe (0: none).

    For schedulers run without ADWIN and for tests. Completed probes are collected in ``completed``
    and, when an ``auditor`` is given, audited in batches of ``probe_batch_size``.
    """

    def __init__(self, window: int, max_len: int, *, probe_every: int = 0, probe_batch_size: int = 1,
                 auditor: Auditor | None = None) -> None:
        if not 1 <= window <= max_len:
            raise ValueError(f"window must be in [1, {max_len}], got {window}")
        self.window, self.max_len, self.probe_every = window, max_len, probe_every
        self.probe_batch_size, self.auditor = probe_batch_size, auditor
        self.completed: list[StampedItem] = []
        self.audits: list[AuditIn] = []
        self.syncs: list[int] = []
        self._pending: list[StampedItem] = []
        self._n = 0
        self._lock = threading.Lock()

    def on_sync(self, version: int) -> SyncDecision:
        self.syncs.append(version)
        return SyncDecision(version, self.window)

    def plan_request(self, request_id: str, prompt_id: str, version: int) -> RequestPlan:
        with self._lock:
            self._n += 1
            probe = self.probe_every > 0 and self._n % self.probe_every == 0
        return RequestPlan(self.max_len if probe else self.window, probe, self.window)

    def on_probe_complete(self, item: StampedItem, version: int) -> None:
        with self._lock:
            self.completed.append(item)
            self._pending.append(item)

    def offer_complete(self, items: Sequence[StampedItem], version: int) -> int:
        return 0  # probes here are every probe_every-th request only

    def poll_audit(self, version: int, *, last: bool = False) -> dict[str, float]:
        with self._lock:
            if self.auditor is None or len(self._pending) < self.probe_batch_size:
                return {}
            batch, self._pending = self._pending[: self.probe_batch_size], self._pending[self.probe_batch_size :]
        self.audits.append(self.auditor(batch))
        return {"audit/submitted": 1.0}

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        return None


class ControllerWindowHooks:
    """``WindowHooks`` backed by a ``ControllerAPI`` (in-process ``Controller`` or ``RemoteController``): a thin
    driver of the one probe client (``adwin.probes.client.ProbeClient``, ``self.client``) in its fresh-probe mode.

    ``max_len`` is the full horizon (probes generate up to it). ``probing=False`` never offers probes
    (non-adwin policies). ``offers_per_version`` limits how many offers are made per learner version
    (defaults to the run's ``offers_per_step``); the controller still has the last word. Every write
    carries an idempotency key derived from the request id or the version, so a retried call counts once.
    ``report_steps`` forwards ``on_step`` metrics to ``report_step`` (off when another logger does it).
    ``offer_finished`` (default ``"always"``, as every adapter) is the rule ``offer_complete`` applies.
    ``resilient_controller`` (default True) keeps the pipeline on the last window while the controller is
    away (``ResilientController``); ``metrics()`` gives its ``controller/*`` gauges.

    Audits: ``self.client`` audits nothing until it has settings and an auditor; ``build_asyncopd`` gives it the
    run's (``adwin.probes.settings.configure_audits`` and an ``InlineAuditor`` on the learner's student), the
    same settings, schedule and drift diagnostics as the synchronous trainer.
    Thread-safe: the feeder calls ``plan_request`` while the learner thread calls the rest (offers, which both
    make, go one at a time; an audit never holds up the feeder).
    """

    def __init__(self, controller: ControllerAPI, run_id: str, *, max_len: int, probing: bool = True,
                 offers_per_version: int | None = None, report_steps: bool = True, max_audits_per_poll: int = 1,
                 offer_finished: str = "always", resilient_controller: bool = True) -> None:
        if offer_finished not in OFFER_FINISHED:
            raise ValueError(f"offer_finished must be one of {OFFER_FINISHED}, got {offer_finished!r}")
        self.offer_finished = offer_finished
        self.controller, self.run_id, self.max_len = resilient(controller, resilient_controller), run_id, max_len
        self.probing, self.report_steps = probing, report_steps
        run = self.controller.get_run(run_id)
        if probing:
            check_feasible(run)  # a run whose probes can never form a batch fails before the pipeline starts
        spec = run.spec
        self.offers_per_version = int(spec.get("offers_per_step", 0) if offers_per_version is None
                                      else offers_per_version)
        self.max_audits_per_poll = max_audits_per_poll
        self.client = ProbeClient(self.controller, run_id, ProbePool(max_len),
                                  int(spec.get("staleness_limit", 1 << 30)), offer_finished=offer_finished,
                                  probe_batch_size=int(spec.get("probe_batch_size", 1)))
        self._lock = threading.Lock()  # offers: the feeder's (plan_request) and the learner's (offer_complete)
        self._window = 0
        self._version = -1
        self._offered = 0  # offers made in the current version
        self._exhausted = False  # the controller declined an offer in this version: stop asking
        self._update: tuple[float, float] | None = None  # the update under way: (its batch's tokens, its start)

    @property
    def window(self) -> int:
        return self._window

    @property
    def counts(self) -> dict[str, int]:
        c = self.client.counts
        return {k: c[k] for k in ("offered", "accepted", "reported", "audits", "audited", "conflicts", "expired")}

    def on_sync(self, version: int) -> SyncDecision:
        """The window of the phase from ``version`` on; ``BadWindowAnswer`` (nothing changed) for an answer outside
        ``[1, max_len]``."""
        win = self.controller.get_window(self.run_id, version)
        if not 1 <= win.window <= self.max_len:
            raise BadWindowAnswer(f"run {self.run_id}: the controller answered window {win.window} at version "
                                  f"{version}, outside [1, {self.max_len}]; the window stays {self._window or None}")
        forced: list[str] = []
        metrics = {"window/current": float(win.window)}
        if self.probing:
            plan = self.client.plan(version)
            forced = list(plan.force_complete)
            metrics |= {"probe/active": float(len(plan.active)), "probe/force_complete": float(len(forced))}
        with self._lock:
            self._window, self._version = int(win.window), version
            self._offered, self._exhausted = 0, False
        self.client.record.window = int(win.window)  # the window in use, for window/changes_per_audit
        return SyncDecision(version, int(win.window), forced, metrics)

    def plan_request(self, request_id: str, prompt_id: str, version: int) -> RequestPlan:
        with self._lock:
            window = self._window
            if window < 1:
                raise RuntimeError("plan_request before the first on_sync: no window has been read yet")
            ask = self.probing and not self._exhausted and self._offered < self.offers_per_version
            if ask:
                self._offered += 1
        if not ask:
            return RequestPlan(window, False, window)
        with self._lock:
            probe = self.client.offer_fresh(request_id, prompt_id, version)
            self._exhausted = self._exhausted or not probe
        return RequestPlan(self.max_len if probe else window, probe, window)

    def on_probe_complete(self, item: StampedItem, version: int, *, tokens_added: int | None = None) -> None:
        self.client.complete(probe_of(item), version, tokens_added=tokens_added)

    def offer_complete(self, items: Sequence[StampedItem], version: int) -> int:
        """Offer training items that need no continuation as complete probes; returns how many were accepted."""
        if not self.probing:
            return 0
        # the scheduler calls this just before the learner update on ``items``: its tokens and start, for the
        # decision budget's training compute (recorded at ``poll_audit``, just after the update)
        self._update = (float(sum(len(it.prompt_ids) + len(it.tokens) for it in items)), time.perf_counter())
        chosen = [it for it in items if not it.is_probe]  # complete_now: this pipeline never continues one
        with self._lock:
            accepted = self.client.offer(version, [probe_of(it) for it in chosen],
                                         [it.finish_reason == "eos" for it in chosen], [it.window for it in chosen],
                                         complete_now=True)
        return len(accepted)

    def metrics(self) -> dict[str, float]:
        """``controller/*`` gauges of degraded mode (empty without the wrapper)."""
        return controller_metrics(self.controller)

    def poll_audit(self, version: int, *, last: bool = False) -> dict[str, float]:
        """After a learner update: record its training compute with the decision budget, then audit up to
        ``max_audits_per_poll`` ready batches (or what the budget pools) under the learner's current weights;
        with ``decision/*``. After the ``last`` update, with a budget, the held and ready batches are closed
        unaudited instead (``audit/released``): no later update would use their decision."""
        if self._update is not None:
            tokens, started = self._update
            self.client.record_train(tokens, time.perf_counter() - started)
            self._update = None
        m = self.client.audit(version, wait=True, max_batches=self.max_audits_per_poll, release=last)
        return m | self.client.decision_metrics()

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.report_steps:
            self.controller.report_step(self.run_id, StepMetricsIn(step=step, metrics=numeric(metrics)),
                                        idempotency_key=f"{self.run_id}-astep-{step}")


def probe_of(item: StampedItem) -> Probe:
    """A completed item as the one probe record, with the teacher logprobs its pipeline already scored."""
    return Probe(item.request_id, list(item.prompt_ids), list(item.tokens), list(item.token_versions),
                 list(item.logprobs) if item.logprobs is not None else None, item.route,
                 submitted_step=item.submitted_version, forced=item.forced, prompt_id=item.prompt_id,
                 teacher_logprobs=None if item.teacher_logprobs is None else list(item.teacher_logprobs))
