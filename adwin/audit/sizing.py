"""How much evidence a decision needs, from what the last audit measured (math layer, no torch).

An audit resolves the full gradient's signal (``adwin.policies.resolution``) when its samples ``N`` reach
``resolve_samples * B`` and its signal z reaches ``min_z``. For ``N`` samples of a full gradient with noise scale
``B = tr(Sigma) / |mu|^2`` and effective dimension ``d = tr(Sigma)^2 / tr(Sigma^2)`` the signal z
(``adwin.audit.truth.signal_z``) is about ``sqrt(N (N - 1) / 2) * sqrt(d) / B``: the cross-sample sum
``N (N - 1) |mu|^2`` over its no-signal standard error ``sqrt(2 N (N - 1) tr(Sigma^2))``. So a decision needs about

    N* = B * max(resolve_samples, min_z * sqrt(2 / d))

samples. The decision budget (``adwin.audit.budget``) sizes each round to that many over the audits the decision
pools (``audit.evidence_audits``), within what it can afford: larger rounds come rarer, the budget's share stays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def samples_needed(noise_scale: float, effective_dim: float | None, *, min_z: float, resolve_samples: float) -> float:
    """``N*`` of the module docstring; inf where the samples showed no mean (``noise_scale`` inf or <= 0). Without
    an effective dimension (too few samples to measure it) the z term assumes ``d = 2``: ``N* >= min_z * B``."""
    if not math.isfinite(noise_scale) or noise_scale <= 0:
        return math.inf
    d = effective_dim if effective_dim is not None and math.isfinite(effective_dim) and effective_dim > 0 else 2.0
    return noise_scale * max(resolve_samples, min_z * math.sqrt(2.0 / d))


def batches_needed(samples: float, *, probe_batch: int, depth: int) -> int:
    """Batches of ``probe_batch`` one audit must hold so that ``depth`` audits of that size (the pooled evidence
    of a decision) read ``samples``; at least 1, and a large number for inf (the caller caps it)."""
    if probe_batch < 1 or depth < 1:
        raise ValueError(f"probe_batch and depth must be >= 1, got {probe_batch}, {depth}")
    if samples <= 0:
        return 1
    if not math.isfinite(samples):
        return 1 << 30
    return max(1, math.ceil(samples / (probe_batch * depth)))


@dataclass
class EvidenceSizer:
    """The decision budget's evidence target (``DecisionBudget.sizer``): after each audit, the batches of ``P`` the
    next one should pool so that its decision resolves (``window.signal_z``, ``window.resolve_samples``; ``depth``:
    ``audit.evidence_audits``). Before the first measurement, one batch."""

    probe_batch: int
    min_z: float = 3.0
    resolve_samples: float = 1.0
    depth: int = 1
    samples: float = math.nan  # N* at the last audit's measurement (nan before one)
    batches: int = 1

    def observe(self, noise_scale: float | None, effective_dim: float | None) -> None:
        """The last audit's measurement; a missing noise scale (no mean seen: B infinite) asks for all there is."""
        self.samples = samples_needed(math.inf if noise_scale is None else noise_scale, effective_dim,
                                      min_z=self.min_z, resolve_samples=self.resolve_samples)
        self.batches = batches_needed(self.samples, probe_batch=self.probe_batch, depth=self.depth)

    def state_dict(self) -> dict[str, float | None]:
        # None before a measurement: a saved state equals itself (nan does not) and stays plain JSON
        return {"samples": None if math.isnan(self.samples) else self.samples, "batches": float(self.batches)}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        samples = state.get("samples")
        self.samples = math.nan if samples is None else float(samples)
        self.batches = int(state.get("batches") or 1)
