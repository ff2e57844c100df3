"""verl's own distillation loss as the audit's per-token loss (``adwin.audit.grams.TokenLoss``).

The audit sums a per-token loss over each segment and differentiates the sums. verl's
``verl.trainer.distillation.losses.distillation_loss`` returns one aggregated scalar; with its ``token-sum``
aggregation that scalar is ``sum_t m_t l_t`` over the response mask ``m`` (the per-token losses ``l_t`` do not
depend on the mask), so ``l = d(loss)/dm`` taken with ``create_graph`` is exactly verl's per-token loss, still
differentiable in the student's weights. verl's function is called as its actor calls it: the registered
estimator (``kl``/``k1``/``k3``/...), the clamp, and with ``use_policy_gradient`` the registered policy loss on the
detached advantage ``-l`` with ``old_log_probs`` the current log-probabilities (ratio 1: the audit runs under the
weights it differentiates). With ``loss_mode=k1`` and policy gradient that is adwin's ``reverse_kl_pg``.

The aggregation is the one thing replaced: segment gradients are sums (cosines are scale-free, and the
data-parallel sum needs sums). verl's task-reward PPO term (``use_task_rewards``) is not audited: the window is a
distillation decision. ``forward_kl_topk`` needs the student's full logits and is refused
(``UnsupportedDistillationLoss``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from tensordict import TensorDict
from verl.trainer.distillation.losses import distillation_loss, get_distillation_loss_settings
from verl.utils import tensordict_utils as tu

from adwin.audit.grams import TokenLoss


class UnsupportedDistillationLoss(ValueError):
    """A verl distillation loss the audit cannot evaluate from the realized tokens' log-probabilities."""


class _SegmentSum:
    """What ``distillation_loss`` reads from verl's ``ActorConfig``, with the audit's token-sum aggregation."""

    loss_agg_mode = "token-sum"
    loss_scale_factor = None

    def __init__(self) -> None:
        self.global_batch_info: dict[str, Any] = {}


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(B, n[, k]) padded per-row values in verl's no-padding layout for a one-token prompt: each row becomes
    ``n + 1`` values (verl's ``no_padding_2_padding`` reads a row's response from its first ``n``)."""
    pad = torch.zeros_like(x[:, :1])
    return torch.cat([x, pad], dim=1).flatten(0, 1)  # (B * (n + 1)[, k])


def verl_token_loss(distillation_config: Any) -> TokenLoss:
    """The per-token loss of verl's ``distillation_config`` (a ``verl.workers.config.DistillationConfig``)."""
    cfg = copy.deepcopy(distillation_config)  # distillation_loss writes global_batch_info into it
    mode = cfg.distillation_loss.loss_mode
    if not get_distillation_loss_settings(mode).use_estimator:
        raise UnsupportedDistillationLoss(f"distillation.distillation_loss.loss_mode={mode!r} reads the student's top-k "
                                          "logits; the audit evaluates single-sample estimators (k1, k3, kl, ...)")

    def loss(logp: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # logp, teacher, mask: (B, n) aligned columns of the audited chunk
        if not bool((mask > 0).any()):
            return logp * 0.0  # verl's range metrics need one response token; this chunk has none
        b, n = logp.shape
        m = (mask > 0).to(logp.dtype).detach().requires_grad_(True)  # (B, n): the mask the loss is linear in
        data = TensorDict({
            "prompts": torch.zeros(b, 1, dtype=torch.long, device=logp.device),
            "responses": torch.zeros(b, n, dtype=torch.long, device=logp.device),
            "attention_mask": torch.ones(b, n + 1, dtype=torch.long, device=logp.device),
            "response_mask": m,
            "teacher_logprobs": _flat(teacher.detach().unsqueeze(-1)),  # (B * (n + 1), 1)
            "old_log_probs": logp.detach(),  # ratio 1 under the audited weights
        }, batch_size=[])  # mixed row and flat layouts: no common batch dimension
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
        total, _ = distillation_loss(_SegmentSum(), cfg, {"log_probs": _flat(logp)}, data)
        (per,) = torch.autograd.grad(total, m, create_graph=True)  # (B, n): verl's per-token loss
        return per * (mask > 0)

    return loss
