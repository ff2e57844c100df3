"""A benchmark's worker processes exit once their parent is gone (SIGKILL, an unhandled SIGTERM), so a killed
``adwin bench compare`` leaves no training behind on the cores the next run measures on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")

PARENT = """
import os, sys, time
from adwin.bench.workers import spawn_pool

if __name__ == "__main__":
    pool = spawn_pool(1)
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 120)  # the worker is busy when its parent dies
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; an init that does not reap would keep it listed


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_exits_when_its_parent_is_killed(tmp_path: Path, sig: signal.Signals) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    worker = 0
    try:
        worker = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert _alive(worker)
        parent.send_signal(sig)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), "the worker outlived its parent"
    finally:
        parent.kill()
        if worker and _alive(worker):  # a failed run leaves no sleeper behind
            os.kill(worker, signal.SIGKILL)
