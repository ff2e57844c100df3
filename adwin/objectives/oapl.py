"""OAPL: off-policy A*PO with a lagged inference policy (Ritter et al., eqs. 1-3), at sequence level.

Math layer: imports nothing from the controller, probes or application modules.

For a prompt ``x`` and a group of ``G`` responses ``y_1..y_G`` sampled from the inference policy
``pi_inf`` (the lagged weights the rollout workers hold), with a sequence-level reward ``r``:

- the optimal value of the KL-regularised problem ``max_pi E_pi[r] - beta KL(pi || pi_inf)`` is
  estimated from the group (eq. 2): ``V(x) = beta_v ln (1/G) sum_i exp(r_i / beta_v)``;
- the loss regresses the policy's log-ratio onto the optimal advantage (eq. 3):
  ``sum_i (beta ln pi(y_i|x) / pi_inf(y_i|x) - (r_i - V(x)))^2``.

Its unique minimiser (with the exact ``V``) is ``pi* ∝ pi_inf exp(r / beta)`` whatever distribution the
``y`` are drawn from: no importance ratio and no clipping. ``beta_v`` is the paper's ``beta_1`` (section 5,
two betas); it defaults to ``beta``. ``ln pi(y|x)`` is a sum of token log-probabilities over the trained
window (``sequence_logprob``); every tensor here is per sequence, ``(N,)``, with ``groups`` naming each
sequence's prompt group (any integer ids). ``V`` never mixes groups and carries no gradient (rewards are
constants).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from adwin.objectives.logprobs import fill_off, upcast


def _check_beta(name: str, beta: float) -> None:
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"{name} must be finite and > 0, got {beta}")


def soft_value(rewards: torch.Tensor, groups: torch.Tensor, beta: float) -> torch.Tensor:
    """``V = beta ln mean_i exp(r_i / beta)`` over each group, returned per sequence: (N,) -> (N,).

    Written as ``m + beta log1p(mean expm1((r - m) / beta))`` with ``m`` the group's max reward, in
    float64: for ``beta -> 0`` every term but the maxima is ``expm1(-inf) = -1`` and ``V -> max r``
    without overflowing ``exp(r / beta)``; for ``beta -> inf`` ``expm1(d) ~ d`` keeps the small
    deviations that a plain logsumexp minus ``ln G`` would cancel away, and ``V -> mean r``.
    """
    _check_beta("beta", beta)
    if rewards.dim() != 1 or groups.shape != rewards.shape:
        raise ValueError(f"rewards and groups must be (N,) of one shape, got {tuple(rewards.shape)} and "
                         f"{tuple(groups.shape)}")
    r = rewards.detach().to(torch.float64)  # (N,)
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite")
    _, gid = torch.unique(groups, return_inverse=True)  # (N,) dense group index
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    top = torch.full((n_groups,), -math.inf, dtype=r.dtype).scatter_reduce(0, gid, r, reduce="amax")  # (n_groups,)
    d = (r - top[gid]) / beta  # (N,) <= 0
    count = torch.zeros(n_groups, dtype=r.dtype).index_add_(0, gid, torch.ones_like(r))  # (n_groups,)
    mean_expm1 = torch.zeros(n_groups, dtype=r.dtype).index_add_(0, gid, torch.expm1(d)) / count  # (n_groups,)
    value = top + beta * torch.log1p(mean_expm1)  # (n_groups,)
    return value[gid].to(upcast(rewards).dtype)  # (N,)


def sequence_logprob(token_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of token log-probabilities over the mask (the trained window): (B, L), (B, L) -> (B,).

    Padding may hold anything (-inf, NaN); it is replaced before the sum, so it reaches neither the
    value nor the gradient."""
    return fill_off(upcast(token_logprobs), mask).sum(dim=1)


@dataclass(frozen=True)
class OAPLTerms:
    """The per-sequence pieces of one OAPL loss evaluation, (N,) each, detached (for metrics)."""

    values: torch.Tensor  # V of each sequence's group
    advantages: torch.Tensor  # r - V
    log_ratios: torch.Tensor  # ln pi(y) - ln pi_inf(y)
    residuals: torch.Tensor  # beta * log_ratio - advantage


def oapl_loss(
    seq_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    groups: torch.Tensor,
    *,
    beta: float,
    value_beta: float | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, OAPLTerms]:
    """Eq. 3 averaged over the ``N`` sequences of the batch -> (scalar loss, terms).

    seq_logprobs: (N,) ``ln pi(y|x)`` under the trained weights (differentiable); inference_logprobs:
    (N,) ``ln pi_inf(y|x)`` recorded when the sequence was sampled; rewards: (N,); groups: (N,) prompt
    group of each sequence. ``values``: (N,) ``V`` of each sequence's prompt when it is known or was
    estimated from other samples of ``pi_inf``; by default eq. 2 on the batch's own groups. The mean (not
    the paper's sum) keeps the loss's scale independent of the batch size; the minimiser is the same.
    """
    _check_beta("beta", beta)
    n = seq_logprobs.shape
    if seq_logprobs.dim() != 1 or inference_logprobs.shape != n or rewards.shape != n or groups.shape != n:
        raise ValueError("seq_logprobs, inference_logprobs, rewards and groups must all be (N,), got "
                         f"{[tuple(t.shape) for t in (seq_logprobs, inference_logprobs, rewards, groups)]}")
    logp = upcast(seq_logprobs)  # (N,)
    if values is None:
        values = soft_value(rewards, groups, beta if value_beta is None else value_beta)  # (N,)
    elif values.shape != n:
        raise ValueError(f"values must be (N,) like seq_logprobs, got {tuple(values.shape)}")
    values = upcast(values).detach()
    adv = (upcast(rewards).detach() - values).to(logp.dtype)  # (N,) r - V, a constant
    log_ratio = logp - upcast(inference_logprobs).detach().to(logp.dtype)  # (N,)
    residual = beta * log_ratio - adv  # (N,)
    loss = residual.pow(2).mean()
    terms = OAPLTerms(values.detach(), adv.detach(), log_ratio.detach(), residual.detach())
    return loss, terms


def teacher_return(teacher_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor,
                   mask: torch.Tensor) -> torch.Tensor:
    """The ``teacher`` reward: ``sum_t log q(y_t) - log pi_inf(y_t)`` over the window, (B, L) x 2 -> (B,).

    It is minus the sequence's reverse-KL return under the behaviour policy; with ``beta = 1`` the
    optimum ``pi_inf exp(r)`` is the teacher's own distribution over window prefixes.
    """
    diff = fill_off(upcast(teacher_logprobs), mask) - fill_off(upcast(behavior_logprobs), mask)  # (B, L)
    return fill_off(diff, mask).sum(dim=1)
