"""Probe rounds through the probe client, for executor tests: the executor never holds the controller."""

from __future__ import annotations

from weakref import WeakKeyDictionary

from adwin.controller.api import ControllerAPI
from adwin.probes.async_executor import AdvanceStats, AsyncProbeExecutor
from adwin.probes.client import ProbeClient

_CLIENTS: WeakKeyDictionary[AsyncProbeExecutor, ProbeClient] = WeakKeyDictionary()


def advance(ex: AsyncProbeExecutor, ctl: ControllerAPI, run_id: str, version: int) -> AdvanceStats:
    """``ProbeClient.advance`` with one client per executor (its report keys must not repeat); no S checks here."""
    if ex not in _CLIENTS:
        _CLIENTS[ex] = ProbeClient(ctl, run_id, ex.pool, 1 << 30, executor=ex)
    return _CLIENTS[ex].advance(version)
