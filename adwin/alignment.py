"""The prefix-full alignment audit (ADWIN section 4.2).

Math layer: imports nothing from the controller, probes or application modules.

Segments: candidates ``c_1 < ... < c_K`` split response positions into ``K + 1`` segments
``[0, c_1), [c_1, c_2), ..., [c_{K-1}, c_K), [c_K, inf)``. ``g_s`` is the gradient of the summed
per-token loss over segment ``s`` (summed over samples: batch level). The prefix gradient of window
``c_k`` is ``g_0 + ... + g_{k-1}``; the full gradient is the sum of all segments. Everything follows
from the Gram matrix ``G[s, s'] = <g_s, g_s'>``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class ProbeBatch:
    """A batch of completed probes, all tensors (B, L) and aligned with ``input_ids``."""

    input_ids: torch.Tensor  # (B, L) long
    attention_mask: torch.Tensor  # (B, L) 0/1
    response_mask: torch.Tensor  # (B, L) 0/1, 1 on response tokens
    teacher_logprobs: torch.Tensor  # (B, L) log q of the realized token, 0 off the response
    behavior_logprobs: torch.Tensor | None = None  # (B, L) log p_behavior at extension time
    versions: torch.Tensor | None = None  # (B, L) student version that produced each token, -1 off response

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        if len(shape) != 2:
            raise ValueError(f"input_ids must be (B, L), got shape {shape}")
        for name in ("attention_mask", "response_mask", "teacher_logprobs", "behavior_logprobs", "versions"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"{name} must have shape {shape} like input_ids, got {tuple(t.shape)}")


@dataclass
class AuditResult:
    """What one audit measured. ``gram`` is (K+1, K+1) over segments; cosines are keyed by candidate."""

    candidates: list[int]
    cosines: dict[int, float]
    macro_cosines: dict[int, float] = field(default_factory=dict)
    gram: np.ndarray | None = None  # (K+1, K+1) float64
    grad_norms: dict[int, float] = field(default_factory=dict)  # norm of each prefix gradient, and "full" as max_len key
    tokens_per_segment: list[int] = field(default_factory=list)
    method: str = "fast"
    metric: str = "identity"
    elapsed_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": list(self.candidates),
            "cosines": {str(k): v for k, v in self.cosines.items()},
            "macro_cosines": {str(k): v for k, v in self.macro_cosines.items()},
            "gram": None if self.gram is None else np.asarray(self.gram, dtype=float).tolist(),
            "grad_norms": {str(k): v for k, v in self.grad_norms.items()},
            "tokens_per_segment": list(self.tokens_per_segment),
            "method": self.method,
            "metric": self.metric,
            "elapsed_s": self.elapsed_s,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AuditResult:
        return cls(
            candidates=[int(c) for c in d["candidates"]],
            cosines={int(k): float(v) for k, v in d["cosines"].items()},
            macro_cosines={int(k): float(v) for k, v in d.get("macro_cosines", {}).items()},
            gram=None if d.get("gram") is None else np.asarray(d["gram"], dtype=np.float64),
            grad_norms={int(k): float(v) for k, v in d.get("grad_norms", {}).items()},
            tokens_per_segment=[int(t) for t in d.get("tokens_per_segment", [])],
            method=str(d.get("method", "fast")),
            metric=str(d.get("metric", "identity")),
            elapsed_s=float(d.get("elapsed_s", 0.0)),
            extra={str(k): float(v) for k, v in d.get("extra", {}).items()},
        )


def cosines_from_gram(gram: np.ndarray | Sequence[Sequence[float]], candidates: Sequence[int]) -> dict[int, float]:
    """Cosine of each candidate prefix gradient with the full gradient, from the segment Gram matrix.

    gram: (K+1, K+1). With ``P_k = 1[s < k]`` and ``F = 1``: ``<g_w, g_full> = P^T G F``,
    ``|g_w|^2 = P^T G P``, ``|g_full|^2 = F^T G F``. A zero-norm prefix gives cosine 0.
    """
    g = np.asarray(gram, dtype=np.float64)
    k = len(candidates)
    if g.shape != (k + 1, k + 1):
        raise ValueError(f"gram must be ({k + 1}, {k + 1}) for {k} candidates, got {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("gram has non-finite entries")
    ones = np.ones(k + 1)
    full_sq = float(ones @ g @ ones)
    out: dict[int, float] = {}
    for i, c in enumerate(candidates):
        p = np.zeros(k + 1)
        p[: i + 1] = 1.0
        pref_sq = float(p @ g @ p)
        denom = math.sqrt(max(pref_sq, 0.0) * max(full_sq, 0.0))
        out[int(c)] = float(np.clip((p @ g @ ones) / denom, -1.0, 1.0)) if denom > 0 else 0.0
    return out


def gram_from_sketches(sketches: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Sum per-rank sketches (each (K+1, D)) and return the (K+1, K+1) Gram of the summed sketch.

    Sketches are linear in the gradient, so the sum of the ranks' sketches is the sketch of the
    whole batch's segment gradients.
    """
    arr = np.asarray(sketches, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise ValueError(f"sketches must be (ranks, K+1, D) or (K+1, D), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("sketches have non-finite entries")
    total = arr.sum(axis=0)  # (K+1, D)
    return total @ total.T
