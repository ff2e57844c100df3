"""The ``rollout`` probe backend: probe rounds ride the next training rollout call (``RidingWorker``).

A round the executor hands over after the update to version ``v`` is parked, not run: the next training
``Sampler.roll_out`` (the rollout of the step after, sampled from the same version ``v``) boards its contexts,
each with its own token budget, onto that one engine ``generate`` call, then lands the probe rows' share of the
result here, which resolves the round's future; the executor applies it at its next ``collect``. Extension
adds rows to a call the step makes anyway, not a call of its own; it needs no thread and no replica (the
learner's weights), and with ``rollout.seeding: per_sample`` a probe row is seeded exactly as the inline
backend seeds it (``RoundExtender.row_seeds``), so the run is a pure function of its seed like ``inline``.

Riding rows decode only within the call's own window: a boarded budget is capped at the rollout call's window
(``board(window)``), so the call never decodes past the steps its rollout rows may take (a round planned at a
longer window than the call's, e.g. before an audit shortened it, keeps the rest for a later round; the
staleness limit still force-completes it at ``S``). On a GPU a decode step costs about the same for 1 row or
64, so the rows ride nearly free and only extra decode *steps* would cost; ``land`` reports the steps the riders
still added (the call's against what its rollout rows alone needed: they may run on after every rollout row
emitted EOS) as the round's ``Extension.decode_steps``.

Nothing waits on a rollout that may never come: a forced completion and an audit run at once on the
trainer's model (as ``InlineWorker``), and a parked round whose result is asked for first (the executor
waiting on it: forced completion of a parked probe, every worker busy) runs on its own right then. A parked
round whose version the sampler no longer holds fails with ``StaleRound``, and the executor re-issues its
probes from their recorded prefixes (the pool changes only when a round is applied).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from adwin.audit.job import AuditJob, AuditOutcome
from adwin.decode.loop import Generation
from adwin.probes.pool import Extension
from adwin.probes.workers import RoundJob, run_now


class RoundRunner(Protocol):
    """What the worker needs of the inline extender (``adwin.loop.probe_rounds.RoundExtender``, a layer above)."""

    def run(self, contexts: list[list[int]], budgets: list[int], version: int) -> Extension: ...

    def row_seeds(self, contexts: list[list[int]], version: int) -> list[int] | None: ...


class StaleRound(RuntimeError):
    """A parked round was to run after the sampler moved past the version its tokens would be tagged with."""


class ParkedRound(Future[Extension]):
    """A round waiting for the next rollout call; ``result()`` before one took it runs the round alone."""

    def __init__(self, worker: RidingWorker) -> None:
        super().__init__()
        self._worker = worker

    def result(self, timeout: float | None = None) -> Extension:
        if not self.done():
            self._worker.flush()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.done():
            self._worker.flush()
        return super().exception(timeout)


class RidingWorker:
    """A ``ProbeWorker`` whose rounds ride the sampler's next training rollout call (see the module docstring).

    ``extend``: the inline backend's extender over the rollout engine (runs forced and flushed rounds, and seeds
    boarded rows); ``audit``: the trainer-model audit; ``weights_version``: the version the sampler holds now.
    """

    synchronous = False

    def __init__(self, extend: RoundRunner, audit: Callable[[AuditJob], AuditOutcome],
                 weights_version: Callable[[], int]) -> None:
        self.extend, self.audit, self.weights_version = extend, audit, weights_version
        self._parked: tuple[RoundJob, ParkedRound] | None = None
        self._boarded: tuple[RoundJob, ParkedRound] | None = None
        self._rode = dict.fromkeys(("probe/rider_rows", "probe/rider_share", "probe/rider_s", "probe/rider_capped"), 0.0)
        self._capped = 0

    # --- ProbeWorker ------------------------------------------------------------------------------

    def submit(self, job: RoundJob) -> Future[Extension]:
        if job.force:  # the one wait the executor allows: no rollout call is coming inside it
            return run_now(lambda: self.extend.run(job.contexts, job.budgets, job.version))
        if self._parked is not None:
            raise RuntimeError("a riding worker holds one round at a time (the executor submits to idle slots)")
        fut = ParkedRound(self)
        self._parked = (job, fut)
        return fut

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        return run_now(lambda: self.audit(job))

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        if self._parked is not None:  # the run ended before another rollout: the prefixes stay as recorded
            self._parked[1].cancel()
            self._parked = None

    # --- the sampler's side (``adwin.sampling.batch.Rider``) ---------------------------------------

    def board(self, window: int) -> tuple[list[list[int]], list[int], list[int] | None] | None:
        """The parked round's contexts, budgets (capped at the call's ``window``) and row seeds for this rollout
        call (None: nothing parked)."""
        if self._parked is None:
            return None
        job, fut = self._parked
        self._parked = None
        if self._stale(job, fut):
            return None
        self._boarded = (job, fut)
        budgets = [min(b, window) for b in job.budgets]
        self._capped = sum(b < a for a, b in zip(job.budgets, budgets, strict=True))
        return job.contexts, budgets, self.extend.row_seeds(job.contexts, job.version)

    def land(self, g: Generation, rows: int, seconds: float, added_steps: int = 0) -> None:
        """The boarded rows' part of the call (``rows`` rows in all, ``seconds`` its wall; ``added_steps``: the
        decode steps the riders added to it) resolves the round."""
        assert self._boarded is not None, "land without board"
        _, fut = self._boarded
        self._boarded = None
        n = len(g.response_ids)
        self._rode = {"probe/rider_rows": float(n), "probe/rider_share": n / rows if rows else 0.0,
                      "probe/rider_s": seconds, "probe/rider_capped": float(self._capped)}
        fut.set_result(Extension(g.response_ids, g.logprobs or [[] for _ in g.response_ids], g.finished, added_steps))

    def metrics(self) -> dict[str, float]:
        """The last rollout call's probe rows, their share of its rows, its wall and the rows whose budget the
        call's window capped (then reset)."""
        out, self._rode = self._rode, dict.fromkeys(self._rode, 0.0)
        return out

    # --- no deadlock ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Run the parked round on its own now (its result was asked for before a rollout call took it)."""
        if self._parked is None:
            return
        job, fut = self._parked
        self._parked = None
        if self._stale(job, fut):
            return
        try:
            ext = self.extend.run(job.contexts, job.budgets, job.version)
        except Exception as e:  # noqa: BLE001 - the executor's fault path handles every failure alike
            fut.set_exception(e)
            return
        fut.set_result(ext)

    def _stale(self, job: RoundJob, fut: Future[Any]) -> bool:
        held = self.weights_version()
        if held == job.version:
            return False
        fut.set_exception(StaleRound(f"round of {len(job.probe_ids)} probes parked at version {job.version}, but "
                                     f"the sampler holds version {held}: re-issued from the recorded prefixes"))
        return True
