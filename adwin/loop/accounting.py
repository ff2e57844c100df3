"""Rollout token accounting and per-phase wall clocks."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from adwin.sampling.batch import Batch


class TokenLedger:
    """Rollout token accounting: sync tokens vs. what a full-rollout run of the same steps would generate.

    Full-rollout estimate per step: finished samples count their real length; a sample cut by its window
    ``w`` counts the expected full length of a rollout longer than ``w``: the mean length of the completed
    probes longer than ``w`` (probes are rollouts continued to EOS or the horizon), ``max_len`` (an upper
    bound) while none is, clamped to ``[w, max_len]`` and never less than the sample's own length (a
    streaming scheduler's update can hold samples cut at an earlier, longer window). Conditioning on
    ``> w`` matters where probes are not all truncations (a streaming scheduler's probes are fresh
    requests, many of which end before the window): their plain mean would count a cut sample at its own
    length. A full-policy run has no truncation below ``max_len``, so its estimate is exact.
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.completed_lengths: list[int] = []
        self.sync = self.full = 0.0

    def add_completed(self, length: int) -> None:
        """A probe ran to its end: ``length`` is a full rollout's length."""
        self.completed_lengths.append(int(length))

    def full_length(self, window: int) -> float:
        """Expected full length of a rollout that its window ``window`` cut."""
        longer = [n for n in self.completed_lengths if n > window]
        est = float(np.mean(longer)) if longer else float(self.max_len)
        return min(max(est, float(window)), float(self.max_len))

    def record(self, batch: Batch, window: int, probe_tokens_total: int,
               windows: Sequence[int] | None = None) -> dict[str, float]:
        """One step's row; ``windows``: the window each sample was cut at, where they differ (a streaming
        scheduler's update holds samples submitted under several windows), else ``window`` for all."""
        lens = [len(r) for r in batch.response_ids]
        truncated = [not f for f in batch.finished]
        cut_at = list(windows) if windows is not None else [window] * len(lens)
        ests = {w: self.full_length(w) for w in set(cut_at)}
        sync = float(sum(lens))
        full = float(sum(max(float(n), ests[w]) if cut else float(n)
                         for n, cut, w in zip(lens, truncated, cut_at, strict=True)))
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


