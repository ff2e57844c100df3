"""Probe workers: a thread worker stops without leaving its thread inside torch when the process exits."""

from __future__ import annotations

import threading

from adwin.probes.workers import RoundJob, ThreadWorker


def test_close_drops_jobs_not_started_and_waits_for_the_one_in_progress() -> None:
    """A daemon thread still decoding when the interpreter exits aborts the process after a run that finished:
    ``close`` returns only once the round in progress is over, and rounds not started never run."""
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def extend(contexts: list[list[int]], budgets: list[int]) -> str:
        started.set()
        assert release.wait(10)
        ran.append(str(contexts))
        return "extension"

    worker = ThreadWorker(extend)  # type: ignore[arg-type]
    first = worker.submit(RoundJob(["a"], [[1]], [1], 0))
    assert started.wait(10)
    second = worker.submit(RoundJob(["b"], [[2]], [1], 0))
    threading.Timer(0.2, release.set).start()  # the round in progress ends only after close has begun
    worker.close()
    assert not worker.alive()
    assert first.result(timeout=0) == "extension" and second.cancelled() and ran == ["[[1]]"]
