"""Probe workers: where extension rounds run. One narrow interface, three kinds.

A worker takes one ``RoundJob`` at a time (contexts, budgets, the weights version to use and, when the
worker's replica is older, that version's weights) and answers with a ``concurrent.futures.Future`` of
an ``Extension``. It also computes audits (``submit_audit``: an ``adwin.audit.job.AuditJob`` on the same
replica, after the rounds queued before it), so the learner never runs the audit's backward passes.
The executor (``adwin.probes.async_executor``) decides what to submit and applies results; workers
never touch the pool or the controller.

* ``InlineWorker``: runs the job in the caller's thread on the trainer's own model (no replica, no sync).
* ``ThreadWorker``: one background thread holding its own student replica. An exception in a job
  kills the thread (the future carries the error); the executor then spawns a fresh worker.
* ``RayWorker`` (``adwin.probes.ray_actor``): a Ray actor holding its own replica.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from adwin.audit.job import AuditJob, AuditOutcome
from adwin.probes.pool import Extender, Extension

log = logging.getLogger(__name__)


@dataclass
class RoundJob:
    """One extension round for one worker: ragged contexts with their token budgets."""

    probe_ids: list[str]
    contexts: list[list[int]]
    budgets: list[int]
    version: int  # the weights version every token of this round is tagged with
    force: bool = False  # forced completion at the staleness limit (budgets run to the horizon)
    weights: Any = None  # that version's weights when the worker's replica is older, else None


@runtime_checkable
class ProbeWorker(Protocol):
    synchronous: bool  # True: ``submit`` runs the job before returning (time spent is blocking time)

    def submit(self, job: RoundJob) -> Future[Extension]: ...

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]: ...

    def alive(self) -> bool: ...

    def close(self) -> None: ...


class InlineWorker:
    """Extends in the caller's thread with the trainer's model: every round is on the critical path."""

    synchronous = True

    def __init__(self, extend: Extender, audit: Callable[[AuditJob], AuditOutcome] | None = None) -> None:
        self.extend, self.audit = extend, audit

    def submit(self, job: RoundJob) -> Future[Extension]:
        return run_now(lambda: self.extend(job.contexts, job.budgets))

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        if self.audit is None:
            raise RuntimeError("this inline worker was built without an audit function")
        audit = self.audit
        return run_now(lambda: audit(job))

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        return None


def run_now(fn: Callable[[], Any]) -> Future[Any]:
    fut: Future[Any] = Future()
    try:
        fut.set_result(fn())
    except Exception as e:  # noqa: BLE001 - the executor's fault path handles every failure alike
        fut.set_exception(e)
    return fut


_STOP = object()
CLOSE_TIMEOUT_S = 60.0  # ThreadWorker.close waits this long at most for a job in progress (one probe round or audit)


@contextlib.contextmanager
def own_cuda_stream(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Run a worker's job on its own CUDA stream (no-op on CPU).

    Every thread of a process shares one default stream per device, so a worker's kernels would otherwise
    queue the learner's behind its extension rounds and audits. The job first waits for what the learner
    has queued so far (its inputs: the weights snapshot, the scored probe batch), and is complete before
    the job returns, so the learner never reads a half-written result and never reuses memory the worker
    still reads (the wait blocks the worker thread only).
    """
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.default_stream(stream.device))
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()


def _cuda_stream() -> torch.cuda.Stream | None:
    """A stream on the current CUDA device when the process uses CUDA, else None."""
    return torch.cuda.Stream() if torch.cuda.is_available() and torch.cuda.is_initialized() else None


class ThreadWorker:
    """A daemon thread with its own replica: ``load(weights)`` then ``extend`` for each job, in order.

    ``load`` moves the replica to the job's version (a snapshot taken at a step boundary), so the trainer
    thread never waits for the replica to catch up. A job that raises kills the thread: its future holds
    the exception and ``alive()`` turns False.
    """

    synchronous = False

    def __init__(self, extend: Extender, load: Callable[[Mapping[str, Any]], None] | None = None,
                 name: str = "probe-worker", audit: Callable[[AuditJob], AuditOutcome] | None = None) -> None:
        self.extend, self.load, self.audit = extend, load, audit
        self._jobs: queue.Queue[Any] = queue.Queue()
        self.stream: torch.cuda.Stream | None = None  # created by the thread's first job on CUDA
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: RoundJob) -> Future[Extension]:
        fut: Future[Extension] = Future()
        if not self._thread.is_alive():
            fut.set_exception(RuntimeError(f"{self._thread.name} is dead"))
            return fut
        self._jobs.put((job, fut))
        return fut

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        if self.audit is None:
            raise RuntimeError(f"{self._thread.name} was built without an audit function")
        return self.submit(job)  # type: ignore[arg-type]  # same queue: runs after the rounds before it

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread: jobs not started are dropped (their futures cancelled); a job in progress finishes,
        its result no longer read, and is waited for (at most ``CLOSE_TIMEOUT_S``), so the process does not exit
        while the thread is inside torch: a daemon thread stopped there aborts the process (``terminate called
        without an active exception``, exit status -6) after a run that finished."""
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item[1].cancel()
        self._jobs.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("%s still runs a job %.0f s after close", self._thread.name, CLOSE_TIMEOUT_S)

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            job, fut = item
            if self.stream is None:
                self.stream = _cuda_stream()
            if isinstance(job, AuditJob):
                self._audit(job, fut)
                continue
            try:
                with own_cuda_stream(self.stream):
                    if job.weights is not None and self.load is not None:
                        self.load(job.weights)
                    ext = self.extend(job.contexts, job.budgets)
            except BaseException as e:  # noqa: BLE001 - the thread dies; the executor re-issues its probes
                log.warning("%s died in a round of %d probes (version %d): %r", self._thread.name,
                            len(job.probe_ids), job.version, e)
                fut.set_exception(e)
                return
            fut.set_result(ext)

    def _audit(self, job: AuditJob, fut: Future[Any]) -> None:
        """An audit that raises (e.g. non-finite cosines) fails its future but leaves the replica usable."""
        assert self.audit is not None
        try:
            with own_cuda_stream(self.stream):
                if job.weights is not None and self.load is not None:
                    self.load(job.weights)
                out = self.audit(job)
            fut.set_result(out)
        except Exception as e:  # noqa: BLE001 - the caller decides (a non-finite audit keeps the window)
            fut.set_exception(e)
