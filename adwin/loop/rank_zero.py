"""The controller as every rank of a data-parallel run sees it: rank 0 talks, the others hear the answer.

The trainer's bookkeeping (windows, probe offers, plans, reports, audit batches) is replicated: every rank
makes the same controller calls in the same order with the same arguments (the inputs are all-gathered
first). ``RankZeroController`` makes rank 0 the only one that reaches the controller; each answer, or the
error it raised, is broadcast, so every rank takes the same branch. One run is registered, one window is
read per step, and the controller's state is exactly that of a 1-process run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adwin.loop.distributed import LocalDist


class RankZeroController:
    """Forwards every method call of a ``ControllerAPI`` from rank 0; ranks > 0 receive rank 0's answer.

    ``inner`` is the real controller on rank 0 and None elsewhere. Only calls that every rank makes may go
    through it: rank-0-only traffic (metrics logging, snapshots, the HTTP server) uses ``inner`` directly.
    """

    def __init__(self, inner: Any, dist: LocalDist) -> None:
        if dist.is_main and inner is None:
            raise ValueError("rank 0 needs the controller")
        self.inner, self.dist = inner, dist

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            answer: tuple[Any, BaseException | None] = (None, None)
            if self.dist.is_main:
                try:
                    answer = (getattr(self.inner, name)(*args, **kwargs), None)
                except Exception as e:  # noqa: BLE001 - every rank re-raises it, so all take the same branch
                    answer = (None, _picklable(e))
            result, error = self.dist.broadcast_object(answer)
            if error is not None:
                raise error
            return result

        return call


def _picklable(e: Exception) -> Exception:
    """``e`` itself when it survives pickling (the broadcast), else a RuntimeError with its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any pickling failure gets the same stand-in
        return RuntimeError(f"{type(e).__name__}: {e}")


class SilentSinks:
    """The loggers of a rank other than 0: it logs nothing (rank 0 logs the global metrics)."""

    history: list[dict[str, Any]] = []

    def __init__(self) -> None:
        self.history = []

    def log(self, step: int, metrics: Any) -> None:
        return None

    def close(self) -> None:
        return None
