"""Worker processes of the benchmarks that outlive nothing: a worker exits once its parent is gone.

A ``ProcessPoolExecutor`` worker is not told when its parent dies of a signal it cannot catch (SIGKILL) or
does not handle (SIGTERM, a scheduler's timeout): it keeps training, holding the cores that the next run
measures on. Each worker therefore watches its parent's pid and exits when it changes.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

POLL_SECONDS = 1.0


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    os._exit(1)  # no cleanup to run: the parent that would read the results is gone


def _exit_with_parent(parent: int) -> None:
    threading.Thread(target=_watch, args=(parent,), name="exit-with-parent", daemon=True).start()


def spawn_pool(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` spawned worker processes that exit within ~1 s of their parent's death."""
    return ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_exit_with_parent,
                               initargs=(os.getpid(),))
