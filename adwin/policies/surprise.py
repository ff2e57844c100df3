"""Teacher-surprise horizon: the per-step observation behind the ``surprise`` window policy.

A response token is *lost* when the teacher's logprob of the student's token is below ``threshold``
(-9.2 ~ log 1e-4: the teacher would essentially never have produced it). Per sample, the *surprise
position* is the number of response tokens up to and including the ``rank``-th lost token, or the
sample's length when it has fewer lost tokens (the rollout may have been cut by the current window:
then the position is censored at the window, which is what lets the horizon grow by at most ``scale``
per step). The step's proposal is ``scale x`` the ``quantile`` of those positions over the batch; the
policy (``SurpriseWindow``, below) smooths it with an EMA and clips it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import torch

from adwin.objectives.losses import response_positions
from adwin.policies.base import PolicyFields, WindowConfigError, check_positive_int


class SurpriseParams(Protocol):
    threshold: float
    rank: int
    quantile: float
    scale: float


def surprise_positions(teacher_logprobs: torch.Tensor, response_mask: torch.Tensor, threshold: float,
                       rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample surprise positions and whether each sample had ``rank`` lost tokens.

    teacher_logprobs, response_mask: (B, L), aligned with ``input_ids`` (the value at ``[b, i]`` is the
    teacher's logprob of ``input_ids[b, i]``). Returns positions (B,) float and reached (B,) bool.
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    on = response_mask > 0  # (B, L)
    lp = torch.nan_to_num(teacher_logprobs.float(), nan=float("-inf"))  # NaN counts as lost
    lost = on & (lp < threshold)  # (B, L)
    n_lost = lost.long().cumsum(dim=1)  # (B, L) lost tokens up to and including i
    pos = response_positions(response_mask)  # (B, L), -1 off the response
    hit = lost & (n_lost == rank)  # (B, L): at most one True per row, the rank-th lost token
    length = on.long().sum(dim=1)  # (B,)
    reached = hit.any(dim=1)  # (B,)
    at_hit = torch.where(hit, pos + 1, torch.zeros_like(pos)).sum(dim=1)  # (B,) tokens up to and including it
    return torch.where(reached, at_hit, length).float(), reached


def surprise_metrics(teacher_logprobs: torch.Tensor, response_mask: torch.Tensor,
                     params: SurpriseParams) -> dict[str, float]:
    """One step's ``rollout/surprise_*`` metrics; ``rollout/surprise_horizon`` is the policy's input.

    ``rollout/surprise_horizon`` = ``scale`` x quantile of the surprise positions;
    ``rollout/surprise_position_q`` the quantile itself; ``rollout/surprise_reached_frac`` the fraction
    of samples with at least ``rank`` lost tokens; ``rollout/surprise_lost_frac`` lost / response tokens.
    """
    positions, reached = surprise_positions(teacher_logprobs, response_mask, params.threshold, params.rank)
    if positions.numel() == 0:
        return {}
    q = float(torch.quantile(positions, params.quantile))
    on = response_mask > 0
    lp = torch.nan_to_num(teacher_logprobs.float(), nan=float("-inf"))
    n_tokens = float(on.sum())
    return {
        "rollout/surprise_horizon": params.scale * q,
        "rollout/surprise_position_q": q,
        "rollout/surprise_reached_frac": float(reached.float().mean()),
        "rollout/surprise_lost_frac": float((on & (lp < params.threshold)).sum()) / max(n_tokens, 1.0),
    }


class SurpriseWindow:
    """Teacher-surprise horizon: a gradient-free adaptive baseline (no probes, no audits).

    Each step the trainer reports ``rollout/surprise_horizon`` (``adwin.policies.surprise``: ``scale`` x the
    ``quantile`` over samples of the response position of the ``rank``-th token whose teacher logprob is
    below ``threshold``). The next window is an EMA of those proposals, ``(1 - ema) * old + ema * new``,
    rounded and clipped to ``[min_window, max_window]``. Before the first observation the window is
    ``initial`` (default: the full horizon, so the first observations see whole rollouts).

    Observations arrive as step metrics (``observe_step``), once per step: a repeated or older step is
    ignored, so a step reported twice (in parts, or retried) cannot move the EMA twice.
    """

    name: ClassVar[str] = "surprise"
    audited: ClassVar[bool] = False
    spec_args: ClassVar[tuple[str, ...]] = ()
    METRIC = "rollout/surprise_horizon"  # the step input: the trainer reports it with every step (surprise_metrics)

    def __init__(
        self,
        max_len: int,
        *,
        min_window: int = 1,
        max_window: int | None = None,
        ema: float = 0.3,
        initial: int | None = None,
    ) -> None:
        self.max_len = check_positive_int("max_len", max_len)
        self.min_window = check_positive_int("min", min_window)
        self.max_window = check_positive_int("max", max_window if max_window is not None else max_len)
        if self.max_window > self.max_len:
            raise WindowConfigError(f"max={self.max_window} must be <= max_len={self.max_len}")
        if self.min_window > self.max_window:
            raise WindowConfigError(f"min={self.min_window} must be <= max={self.max_window}")
        if isinstance(ema, bool) or not isinstance(ema, (int, float)) or not 0.0 < ema <= 1.0:
            raise WindowConfigError(f"ema must be in (0, 1] (the weight of the newest observation), got {ema!r}")
        self.ema = float(ema)
        self.initial = check_positive_int("initial", initial if initial is not None else self.max_window)
        if not self.min_window <= self.initial <= self.max_window:
            raise WindowConfigError(f"initial={self.initial} must be in [min={self.min_window}, max={self.max_window}]")
        self.level = float(self.initial)  # the EMA, before rounding and clipping
        self.last_step = -1
        self.observations = 0

    @classmethod
    def from_fields(cls, f: PolicyFields) -> SurpriseWindow:
        """``options``: ``min`` (default: the smallest candidate, else 1), ``max`` (default ``max_len``) and
        ``ema`` (default 0.3); the trainer's measurement parameters travel along for the record."""
        lo, hi = f.options.get("min"), f.options.get("max")
        return cls(f.max_len, min_window=int(lo) if lo is not None else (int(f.candidates[0]) if f.candidates else 1),
                   max_window=int(hi) if hi is not None else None, ema=float(f.options.get("ema", 0.3)),
                   initial=f.initial)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SurpriseWindow:
        policy = cls(int(state["max_len"]), min_window=int(state["min"]), max_window=int(state["max"]),
                     ema=float(state["ema"]), initial=int(state["initial"]))
        policy.load_state_dict(state)
        return policy

    def window(self, step: int) -> int:
        return min(self.max_window, max(self.min_window, int(round(self.level))))

    def observe(self, result: Any) -> bool:
        return False  # audits do not steer this policy

    def observe_step(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Fold step ``step``'s surprise horizon into the EMA; True when the window changed."""
        value = metrics.get(self.METRIC)
        if value is None or step <= self.last_step:
            return False
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{self.METRIC} must be finite and >= 0, got {value}")
        before = self.window(step)
        self.level = (1.0 - self.ema) * self.level + self.ema * value
        self.last_step, self.observations = step, self.observations + 1
        return self.window(step + 1) != before

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_len": self.max_len,
            "min": self.min_window,
            "max": self.max_window,
            "ema": self.ema,
            "initial": self.initial,
            "level": self.level,
            "last_step": self.last_step,
            "observations": self.observations,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.max_len, self.min_window, self.max_window = int(state["max_len"]), int(state["min"]), int(state["max"])
        self.ema, self.initial = float(state["ema"]), int(state["initial"])
        self.level, self.last_step = float(state["level"]), int(state["last_step"])
        self.observations = int(state.get("observations", 0))
