"""``loss``: the training objective's section of ``TrainConfig`` (adwin.objectives).

Which loss needs what is ``adwin.objectives.loss_table``; this section only validates against it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from adwin.config.base import ISHighField, ISLowField, ISMethodField, _Strict, check_is_bounds
from adwin.config.oapl import OAPLSection
from adwin.objectives.loss_table import ALL_LOSSES, BEHAVIOR_LOSSES, SAMPLED_TOKEN_LOSSES

LossName = Literal[ALL_LOSSES]  # type: ignore[valid-type]  # pydantic reads the names from the table


class LossConfig(_Strict):
    name: LossName = Field("reverse_kl_pg", description="the OPD loss (adwin.objectives.loss_table says what "
                           "each needs)")
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "token-mean", description="how per-token losses reduce to the batch's")
    jsd_beta: float = Field(0.5, ge=0.0, le=1.0, description="mixture weight of loss.name: jsd")
    topk: int = Field(20, ge=1, le=1_000_000, description="teacher tokens per position of forward_kl_topk")
    clip_low: float | None = Field(None, gt=0.0, lt=1.0, description="PPO clip epsilon below 1 (with clip_high)")
    clip_high: float | None = Field(None, gt=0.0, description="PPO clip epsilon above 1 (with clip_low)")
    # old-to-current ratio rho = p_theta / p_behavior on the sampled tokens (behavior: the logprobs recorded
    # when the tokens were sampled); only the behavior-weighted losses use it (BEHAVIOR_LOSSES)
    is_method: ISMethodField = "none"
    is_low: ISLowField = 0.5
    is_high: ISHighField = 2.0
    mc_samples: int = Field(1, ge=1, le=4096, description="m cached actions per position for reverse_kl_mc")
    iw_gamma: float = Field(0.0, ge=0.0, le=100.0, description="IW-OPD position weight 1 + gamma(1 - cum|A|/total|A|); 0 = off")
    oapl: OAPLSection = Field(default_factory=OAPLSection)

    @model_validator(mode="after")
    def _oapl_section_needs_oapl(self) -> LossConfig:
        if self.name != "oapl" and self.oapl != OAPLSection():
            default = OAPLSection()
            changed = [f"loss.oapl.{k}" for k in OAPLSection.model_fields if getattr(self.oapl, k) != getattr(default, k)]
            raise ValueError(f"{', '.join(changed)}: read only by loss.name: oapl (got {self.name!r}); drop it")
        if self.name == "oapl":  # a mean over sequences of eq. 3's squares, on the realized tokens
            if self.aggregation != "token-mean":
                raise ValueError("loss.aggregation: oapl's loss is a mean over sequences of squared residuals; "
                                 "leave aggregation at its default")
            if self.mc_samples != 1:
                raise ValueError("loss.mc_samples: oapl scores realized sequences, no MC actions; leave it at 1")
        return self

    @model_validator(mode="after")
    def _iw_needs_sampled_tokens(self) -> LossConfig:
        if self.iw_gamma > 0 and self.name not in SAMPLED_TOKEN_LOSSES:
            raise ValueError(f"loss.iw_gamma: IW-OPD weights need a sampled-token loss {SAMPLED_TOKEN_LOSSES}, "
                             f"got loss.name={self.name!r}")
        return self

    @model_validator(mode="after")
    def _ratio_needs_behavior_loss(self) -> LossConfig:
        check_is_bounds("loss", self.is_method, self.is_low, self.is_high)
        if (self.clip_low is None) != (self.clip_high is None):
            raise ValueError("loss.clip_low and loss.clip_high: give both (the PPO clip) or neither")
        if self.is_method != "none" and self.clip_low is not None:
            raise ValueError(f"loss.is_method={self.is_method!r} and loss.clip_low/clip_high: use either the PPO "
                             "clip or an is_method, not both")
        if self.weights_by_behavior and self.name not in BEHAVIOR_LOSSES:
            knob = "loss.is_method" if self.is_method != "none" else "loss.clip_low/clip_high"
            raise ValueError(f"{knob}: only {BEHAVIOR_LOSSES} weight tokens by the old-to-current ratio, got "
                             f"loss.name={self.name!r}; unset {knob} or pick one of those losses")
        return self

    @property
    def weights_by_behavior(self) -> bool:
        """The loss needs the behavior logprobs of the sampled tokens (an IS treatment or the PPO clip)."""
        return self.is_method != "none" or self.clip_low is not None
