"""``RankZeroController``: rank 0 alone reaches the controller; every rank gets its answer or its error."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from adwin.controller import Controller
from adwin.controller.api import ControllerError
from adwin.loop.distributed import LocalDist
from adwin.loop.rank_zero import RankZeroController


class Counting:
    def __init__(self) -> None:
        self.inner, self.calls = Controller(), 0

    def __getattr__(self, name: str) -> Any:
        self.calls += 1
        return getattr(self.inner, name)


class BroadcastRank(LocalDist):
    """Two threads as ranks: ``broadcast_object`` hands rank 0's value to both."""

    def __init__(self, rank: int, box: list[Any], barrier: threading.Barrier) -> None:
        object.__setattr__(self, "box", box)
        object.__setattr__(self, "sync", barrier)
        super().__init__(rank=rank, world=2)

    def broadcast_object(self, obj: Any) -> Any:
        if self.rank == 0:
            self.box[0] = obj
        self.sync.wait()
        out = self.box[0]
        self.sync.wait()
        return out


def test_every_rank_gets_rank_zeros_answers_and_errors() -> None:
    from adwin.config import load_config
    from adwin.loop.parts import run_spec

    real, box, barrier = Counting(), [None], threading.Barrier(2)
    spec = run_spec(load_config(None, {}))
    seen: dict[int, list[Any]] = {0: [], 1: []}

    def rank(r: int) -> None:
        ctl = RankZeroController(real if r == 0 else None, BroadcastRank(r, box, barrier))
        run_id = ctl.register_run(spec).run_id
        seen[r].append((run_id, ctl.get_window(run_id, 0).window))
        with pytest.raises(ControllerError):
            ctl.get_window("no-such-run", 0)
        seen[r].append("raised")

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[0] == seen[1] and len(seen[0]) == 2
    assert real.calls == 3  # one register, one window, one failed read: rank 1 never reached the controller


def test_rank_zero_needs_the_controller() -> None:
    with pytest.raises(ValueError, match="rank 0 needs the controller"):
        RankZeroController(None, LocalDist())
