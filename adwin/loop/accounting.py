"""Rollout token accounting and per-phase wall clocks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from adwin.loop.sampler import Batch


class TokenLedger:
    """Rollout token accounting: sync tokens vs. what a full-rollout run of the same steps would generate.

    Full-rollout estimate per step: finished samples count their real length; each truncated sample
    counts the mean length of the probes completed so far (probes *are* truncated samples continued to
    EOS or the horizon), clamped to ``[window, max_len]``, and never less than the sample's own length (a
    streaming scheduler's update can hold samples cut at an earlier, longer window); before any probe
    completes, ``max_len`` (an upper bound). A full-policy run has no truncation below ``max_len``, so its
    estimate is exact.
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.completed_lengths: list[int] = []
        self.sync = self.full = 0.0

    def add_completed(self, length: int) -> None:
        """A probe continued a truncated sample to its end: ``length`` is that sample's full length."""
        self.completed_lengths.append(int(length))

    def record(self, batch: Batch, window: int, probe_tokens_total: int) -> dict[str, float]:
        lens = [len(r) for r in batch.response_ids]
        truncated = [not f for f in batch.finished]
        est = float(np.mean(self.completed_lengths)) if self.completed_lengths else float(self.max_len)
        est = min(max(est, float(window)), float(self.max_len))
        sync = float(sum(lens))
        short = sum(1 for n, cut in zip(lens, truncated, strict=True) if cut and n <= est)
        full = float(sum(n for n, cut in zip(lens, truncated, strict=True) if not cut or n > est)) + est * short
        self.sync += sync
        self.full += full
        return {"rollout/sync_tokens": sync, "rollout/full_equiv_tokens": full,
                "rollout/truncated_frac": float(np.mean(truncated)), "rollout/mean_len": float(np.mean(lens)),
                "rollout/sync_tokens_total": self.sync, "rollout/full_equiv_tokens_total": self.full,
                "probe/tokens_total": float(probe_tokens_total)}

    def totals(self, probe_tokens_total: int) -> dict[str, float]:
        return {"sync_tokens": self.sync, "probe_tokens": float(probe_tokens_total), "full_equiv_tokens": self.full}


class Clock:
    """Wall time per phase of the current step (``time/<phase>``)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def reset(self) -> None:
        self.spent = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.spent.items()}


