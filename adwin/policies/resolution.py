"""Whether an audit resolves the full gradient's signal, and where the window goes when it does not
(``window.unresolved``, ``window.signal_z``, ``window.resolve_samples``).

An audit reads ``N`` samples (one probe batch, or the pool of the last audits: ``audit.evidence_audits``) and
measures, from their cross Gram, the full gradient's noise scale ``B = tr(Sigma) / |mu|^2`` and the signal z of its
mean (``adwin.audit.truth.noise_scale``, ``signal_z``). The batch Gram's full-gradient energy is
``N^2 |mu|^2 + N tr(Sigma)``, so its signal share is ``N / (N + B)``: where ``N`` is far below ``B`` every batch
cosine reads its pure-noise value ``sqrt(N_w / N_F)``, a function of token counts alone. An audit is *resolved* when
its signal z reaches ``signal_z`` and ``N >= resolve_samples * B``; otherwise the decision follows the fallback:

- ``hold``: the window stays (the last window decided on resolved evidence, or ``window.initial``);
- ``horizon``: the full horizon (full-rollout OPD until an audit resolves);
- ``noise_rule``: the shortest candidate whose pure-noise reading clears the threshold (what the batch cosine reads
  with no signal, so it costs no more than the paper's rule would under noise, and says so);
- ``decide``: the paper's rule on the cosines as they are; the audit is still marked unresolved.

An audit that measured neither z nor ``B`` (no per-sample vectors: ``audit.ci_level`` unset with the batch
estimator) is not judged: the rule decides. docs/decisions.md, "Unresolved audits".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from adwin.policies.base import WindowConfigError

# what an audit submission carries for the judgement, as stats (the probe client sends them, the controller reads them)
RESOLUTION_STATS: tuple[str, ...] = ("signal_z", "noise_scale", "evidence_samples", "effective_dim")
# window.unresolved, in the order the controller's float options encode them (0.0, 1.0, ...)
UNRESOLVED: tuple[str, ...] = ("hold", "horizon", "noise_rule", "decide")


def unresolved_option(value: float) -> str:
    """The controller carries ``unresolved`` as a float option: its index in ``UNRESOLVED``."""
    if value not in tuple(float(i) for i in range(len(UNRESOLVED))):
        raise WindowConfigError(f"option unresolved must be an index 0..{len(UNRESOLVED) - 1} of {UNRESOLVED}, "
                                f"got {value}")
    return UNRESOLVED[int(value)]


def check_criteria(fallback: str, signal_z: float, resolve_samples: float) -> None:
    if fallback not in UNRESOLVED:
        raise WindowConfigError(f"unresolved must be one of {UNRESOLVED}, got {fallback!r}")
    if not math.isfinite(signal_z) or signal_z < 0:
        raise WindowConfigError(f"signal_z must be a finite number >= 0, got {signal_z}")
    if not math.isfinite(resolve_samples) or resolve_samples < 0:
        raise WindowConfigError(f"resolve_samples must be a finite number >= 0, got {resolve_samples}")


@dataclass(frozen=True)
class Resolution:
    """What one audit's evidence can resolve. ``resolved`` None: the audit measured no signal (not judged)."""

    resolved: bool | None
    signal_z: float | None = None
    noise_scale: float | None = None  # B; inf where the samples show no mean at all
    samples: float | None = None  # N, pooled


@runtime_checkable
class JudgesEvidence(Protocol):
    """A policy that judges each audit's resolution (``AdaptiveWindow``): its last audit's ``Resolution``."""

    resolution: Resolution


def unresolved(policy: Any) -> bool:
    """Whether ``policy``'s last audit was judged unresolved (False for a policy that judges none)."""
    return isinstance(policy, JudgesEvidence) and policy.resolution.resolved is False


def evidence_of(result: Any) -> tuple[float | None, float | None, float | None]:
    """(signal z, noise scale B, samples N) of an audit: attributes of that name, or an ``AuditResult``'s
    ``extra`` (``signal_z``, ``noise_scale``, ``evidence_samples``)."""
    extra = getattr(result, "extra", None) or {}

    def read(name: str, key: str) -> float | None:
        v = getattr(result, name, None)
        if v is None:
            v = extra.get(key)
        return None if v is None else float(v)

    z = read("signal_z", "signal_z")
    scale = read("noise_scale", "noise_scale")
    return z, scale, read("samples", "evidence_samples")


def judge(z: float | None, scale: float | None, samples: float | None, *, min_z: float,
          resolve_samples: float) -> Resolution:
    """Resolved iff ``z >= min_z`` and ``N >= resolve_samples * B`` (module docstring); None without a z. Without a
    ``B`` (the audit's samples show no mean, ``B`` infinite, so their z is <= 0; or a submitter that measures none)
    the z alone decides."""
    if z is None:
        return Resolution(None)
    enough = resolve_samples <= 0 or scale is None or (samples is not None and samples >= resolve_samples * scale)
    return Resolution(bool(z >= min_z and enough), z, scale, samples)


def fallback_window(fallback: str, *, current: int, max_len: int, candidates: Sequence[int], threshold: float,
                    noise: Mapping[int, float] | None) -> int | None:
    """The window an unresolved audit leads to; None for ``decide`` (the rule decides on the cosines)."""
    if fallback == "hold":
        return current
    if fallback == "horizon":
        return max_len
    if fallback == "noise_rule":
        floor = noise or {}
        admissible = [c for c in candidates if floor.get(c, float("-inf")) >= threshold]
        return min(admissible) if admissible else max_len
    return None
