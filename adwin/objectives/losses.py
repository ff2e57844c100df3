"""OPD estimators: per-token losses, window masks, importance weights and aggregation.

Math layer: imports nothing from the controller, probes or application modules.
Token log-probabilities and mask primitives live in ``adwin.objectives.logprobs``, the top-k and dense-logit
divergences in ``adwin.objectives.divergences``; both are re-exported here.

Position convention (docs/design.md): the token at ``input_ids[b, i]`` is predicted by ``logits[b, i-1]``.
All per-token tensors here are aligned with ``input_ids`` (shape ``(B, L)``): the value at ``[b, i]``
concerns the realized token ``input_ids[b, i]``. Position 0 has no predictor and is always masked.
Per-action tensors (MC actions, teacher top-k) are ``(B, L, m)`` with the same alignment: ``[b, i, j]``
concerns candidate ``j`` for the token at position ``i``, scored by ``logits[b, i-1]``. Raw model logits
(student and teacher alike) keep the model layout ``(B, L, V)`` and are shifted here.

KL directions: ``p`` is the student, ``q`` the teacher. Reverse KL is ``KL(p || q)``, forward is
``KL(q || p)``. Every per-token function returns exact zeros off its mask (``torch.where``, so NaN or inf
in padding cannot leak into the loss or its gradient).
"""

from __future__ import annotations

import math

import torch

from adwin.objectives.aggregation import (  # noqa: F401  (re-exported: part of the losses API)
    AGGREGATIONS,
    aggregate,
    loss_mask,
    loss_normalizer,
)
from adwin.objectives.divergences import (  # noqa: F401  (re-exported: part of the losses API)
    forward_kl,
    forward_kl_topk,
    forward_kl_topk_terms,
    generalized_jsd,
    reverse_kl,
)
from adwin.objectives.importance import (  # noqa: F401  (re-exported: part of the losses API)
    IS_METHODS,
    ISMethod,
    importance_weights,
    ratio_percentiles,
)
from adwin.objectives.logprobs import (  # noqa: F401  (re-exported: part of the losses API)
    action_logprobs,
    fill_off,
    keep_mask,
    response_positions,
    token_logprobs,
    topk_logprobs,
    upcast,
    window_mask,
)
from adwin.objectives.loss_table import BEHAVIOR_LOSSES, SAMPLED_TOKEN_LOSSES, TOKEN_LOSSES

LOSS_NAMES: tuple[str, ...] = TOKEN_LOSSES


def _pg_surrogate(
    logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    *,
    clip: tuple[float, float] | None,
    is_method: str,
    is_low: float,
    is_high: float,
) -> torch.Tensor:
    """Elementwise ``-rho * sg(A_theta)`` with optional PPO clip or IS treatment (any shape)."""
    adv = (teacher_logp - logp).detach()  # A_theta, recomputed under the current student
    log_ratio = logp - behavior_logp.detach()
    if is_method == "none":
        ratio = torch.exp(log_ratio)  # differentiable: grad(-rho*A) = -rho*A*grad(log p)
        per = -ratio * adv
        if clip is not None:
            eps_low, eps_high = clip
            per = torch.maximum(per, -torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
        return per
    if clip is not None:
        raise ValueError("use either the PPO clip or an is_method other than 'none', not both")
    weights, _ = importance_weights(log_ratio.detach(), is_method, is_low, is_high)
    # value -w*A, gradient -w*A*grad(log p): the carrier exp(lp - sg(lp)) is 1 with gradient grad(log p),
    # so rejected tokens (w = 0) give exactly zero gradient even when rho overflowed.
    carrier = torch.exp(logp - logp.detach())
    return -(weights * adv) * carrier


# ----------------------------------------------------------------------------- sampled-token losses


def reverse_kl_pg(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    behavior_logprobs: torch.Tensor | None = None,
    clip: tuple[float, float] | None = None,
    is_method: str = "none",
    is_low: float = 0.5,
    is_high: float = 2.0,
) -> torch.Tensor:
    """Token-local reverse-KL policy-gradient loss (ADWIN eq. 23-24, discount 0), per token.

    student_logprobs, teacher_logprobs, mask: (B, L). Returns (B, L) per-token losses, 0 off the mask.

    Advantage ``A = log q(y) - log p_theta(y)`` is a constant (stop-gradient). Without behavior
    logprobs the loss is ``-A * log p_theta(y)`` (on-policy: ``clip`` would never bind and is ignored).
    With them, the old-to-current importance ratio ``rho = p_theta / p_behavior`` (AsyncOPD's reference
    surrogate, ``A_theta`` recomputed at learner time, unclipped by default) gives ``-rho * A``, whose
    gradient is ``-rho * A * grad log p_theta``; ``clip=(eps_low, eps_high)`` applies the PPO pessimistic
    clip. ``is_method`` (see ``importance_weights``) instead replaces ``rho`` by a constant weight
    ``w(rho)``: value ``-w * A``, gradient ``-w * A * grad log p_theta``.
    """
    student_logprobs = upcast(student_logprobs)
    # padding may hold anything (-inf, NaN): neutralize it so A = 0 and rho = 1 off the mask
    teacher = fill_off(upcast(teacher_logprobs), mask, student_logprobs.detach())
    if behavior_logprobs is None:
        per_token = -(teacher - student_logprobs).detach() * student_logprobs
    else:
        behavior = fill_off(upcast(behavior_logprobs), mask, student_logprobs.detach())
        per_token = _pg_surrogate(student_logprobs, teacher, behavior, clip=clip,
                                  is_method=is_method, is_low=is_low, is_high=is_high)
    return fill_off(per_token, mask)


def reverse_kl_mc(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    behavior_logprobs: torch.Tensor | None = None,
    clip: tuple[float, float] | None = None,
    is_method: str = "none",
    is_low: float = 0.5,
    is_high: float = 2.0,
) -> torch.Tensor:
    """Multi-sample MC reverse-KL surrogate (AsyncOPD eq. 15), per position.

    student_logprobs: (B, L, m) current-student logprobs of ``m`` cached actions per position (see
    ``action_logprobs``); teacher_logprobs, behavior_logprobs: (B, L, m); mask: (B, L) -> (B, L).
    Loss per position ``-(1/m) sum_i rho_i * sg(A_theta(a_i))`` with ``A_theta = log q - log p_theta``.
    Its gradient is unbiased for the dense reverse-KL gradient when the actions are drawn from the
    behavior policy (which must cover the student's support). Without behavior logprobs the actions are
    taken to come from the current student (``rho = 1`` in value, gradient ``grad log p_theta``).
    """
    if student_logprobs.dim() != 3:
        raise ValueError(f"student_logprobs must be (B, L, m), got {tuple(student_logprobs.shape)}")
    for name, t in (("teacher_logprobs", teacher_logprobs), ("behavior_logprobs", behavior_logprobs)):
        if t is not None and t.shape != student_logprobs.shape:
            raise ValueError(f"{name} must match student_logprobs {tuple(student_logprobs.shape)}, "
                             f"got {tuple(t.shape)}")
    logp = upcast(student_logprobs)  # (B, L, m)
    teacher = fill_off(upcast(teacher_logprobs), mask, logp.detach())
    behavior = logp.detach() if behavior_logprobs is None else fill_off(
        upcast(behavior_logprobs), mask, logp.detach())
    per_action = _pg_surrogate(logp, teacher, behavior, clip=clip,
                               is_method=is_method, is_low=is_low, is_high=is_high)  # (B, L, m)
    return fill_off(per_action.mean(dim=-1), mask)


def k1(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 estimate of KL(p || q) from a token sampled from p: ``log p - log q`` (unbiased, signed)."""
    return student_logprobs - teacher_logprobs


def k2(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 estimate of KL(p || q): ``(log p - log q)^2 / 2`` (biased, low variance, >= 0).

    As a directly backpropagated loss its gradient ``-A * grad log p`` equals reverse_kl_pg's.
    """
    return 0.5 * (student_logprobs - teacher_logprobs) ** 2


def k3(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(p || q): ``q/p - 1 - log(q/p)`` (unbiased, >= 0).

    As a directly backpropagated loss its expected gradient is the *forward*-KL gradient.
    """
    log_r = teacher_logprobs - student_logprobs
    return torch.expm1(log_r) - log_r




# ----------------------------------------------------------------------------- IW-OPD position weights


def iw_opd_weights(advantage: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """IW-OPD per-token weights ``1 + gamma * (1 - C_t / C)`` (constants, no gradient).

    advantage, mask: (B, L). Per sample, ``C_t`` is the cumulative ``|A|`` over the sample's masked
    tokens strictly before ``t`` and ``C`` the total over all of them, so the first token weighs
    ``1 + gamma`` and the weight falls towards 1 as the sample's teacher-student disagreement is used
    up: late positions count less. A sample with ``C = 0`` (no disagreement, hence no loss) gets
    ``1 + gamma`` everywhere. Returns (B, L), 0 off the mask.
    """
    if not math.isfinite(gamma) or gamma < 0:
        raise ValueError(f"iw_gamma must be finite and >= 0, got {gamma}")
    keep = mask > 0
    a = torch.where(keep, upcast(advantage.detach()).abs(), torch.zeros((), dtype=upcast(advantage).dtype))
    a = torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)  # (B, L)
    before = a.cumsum(dim=1) - a  # (B, L) exclusive cumulative |A|
    total = a.sum(dim=1, keepdim=True)  # (B, 1)
    frac = torch.where(total > 0, before / total.clamp_min(torch.finfo(a.dtype).tiny), torch.zeros_like(before))
    return torch.where(keep, 1.0 + gamma * (1.0 - frac), torch.zeros_like(frac))


# ----------------------------------------------------------------------------- aggregation, dispatch


def _require(name: str, **inputs: torch.Tensor | None) -> None:
    missing = [k for k, v in inputs.items() if v is None]
    if missing:
        raise ValueError(f"loss {name!r} needs {', '.join(missing)}")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(fill_off(x.detach(), mask).sum() / mask.sum().clamp_min(1.0))


def opd_loss(
    name: str,
    *,
    input_ids: torch.Tensor,
    response_mask: torch.Tensor,
    student_logits: torch.Tensor | None = None,
    student_logprobs: torch.Tensor | None = None,
    teacher_logprobs: torch.Tensor | None = None,
    teacher_logits: torch.Tensor | None = None,
    teacher_topk_ids: torch.Tensor | None = None,
    teacher_topk_logprobs: torch.Tensor | None = None,
    behavior_logprobs: torch.Tensor | None = None,
    action_ids: torch.Tensor | None = None,
    window: int | None = None,
    aggregation: str = "token-mean",
    beta: float = 0.5,
    clip_low: float | None = None,
    clip_high: float | None = None,
    is_method: str = "none",
    is_low: float = 0.5,
    is_high: float = 2.0,
    iw_gamma: float = 0.0,
    normalizer: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One OPD loss by name over the first ``window`` response tokens -> (scalar loss, metrics).

    Shapes: input_ids, response_mask (B, L); student_logits, teacher_logits (B, L, V) raw layout;
    student_logprobs (B, L) realized-token logprobs (instead of logits, for reverse_kl_pg/k2/k3);
    teacher_logprobs, behavior_logprobs (B, L), or (B, L, m) for ``reverse_kl_mc`` together with
    action_ids (B, L, m); teacher_topk_* (B, L, k). ``clip_low``/``clip_high`` are the PPO epsilons (both
    or neither). Metrics: ``loss/value``, ``loss/tokens`` (counted tokens), ``loss/teacher_kl`` (mean k1
    of KL(p || q) on sampled tokens, when the teacher's realized-token logprobs are known;
    ``reverse_kl_mc`` averages over the cached actions), ``loss/teacher_kl_k3``, and per loss the IS-ratio
    percentiles and affected fractions or the top-k masses. ``iw_gamma > 0`` (sampled-token losses only)
    multiplies each token's loss by the IW-OPD weight ``iw_opd_weights(A, mask, iw_gamma)`` with
    ``A = log q - log p`` over the counted tokens (metric ``loss/iw_weight_mean``).

    ``normalizer``: the aggregation's denominator when this batch is one shard (micro-batch, rank) of a
    larger one: the sum of ``loss_normalizer(loss_mask(...), aggregation)`` over all shards. The shards'
    losses (and gradients) then add up to the whole batch's; the metrics stay this shard's own means
    (weight them by ``loss/tokens`` to combine). None: this batch is the whole batch.
    """
    if name not in LOSS_NAMES:
        raise ValueError(f"loss must be one of {LOSS_NAMES}, got {name!r}")
    if (clip_low is None) != (clip_high is None):
        raise ValueError("give both clip_low and clip_high, or neither")
    clip = None if clip_low is None else (float(clip_low), float(clip_high))  # type: ignore[arg-type]
    if teacher_logits is not None and student_logits is not None and teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher_logits {tuple(teacher_logits.shape)} must match student_logits "
                         f"{tuple(student_logits.shape)} (same vocabulary, same layout)")
    mask = loss_mask(response_mask, window)  # (B, L)
    metrics: dict[str, float] = {"loss/tokens": float(mask.sum())}

    realized: torch.Tensor | None = student_logprobs
    teacher_realized = teacher_logprobs if name != "reverse_kl_mc" else None
    if name != "reverse_kl_mc":
        # only reverse_kl_pg/k2/k3 differentiate through it; elsewhere it feeds metrics, so skip the graph
        with torch.set_grad_enabled(torch.is_grad_enabled() and name in SAMPLED_TOKEN_LOSSES):
            if realized is None and student_logits is not None:
                realized = token_logprobs(student_logits, input_ids)  # (B, L)
            if teacher_realized is None and teacher_logits is not None:
                teacher_realized = token_logprobs(teacher_logits, input_ids)  # (B, L)

    if name in SAMPLED_TOKEN_LOSSES:
        _require(name, student_logits_or_logprobs=realized, teacher_logprobs=teacher_realized)
        if name == "reverse_kl_pg":
            per_token = reverse_kl_pg(realized, teacher_realized, mask, behavior_logprobs=behavior_logprobs,
                                      clip=clip, is_method=is_method, is_low=is_low, is_high=is_high)
        else:
            fn = k2 if name == "k2" else k3
            safe_teacher = fill_off(upcast(teacher_realized), mask, realized.detach())
            per_token = fill_off(fn(realized, safe_teacher), mask)
    elif name == "reverse_kl_mc":
        _require(name, student_logits=student_logits, action_ids=action_ids, teacher_logprobs=teacher_logprobs)
        logp = action_logprobs(student_logits, action_ids)  # (B, L, m)
        per_token = reverse_kl_mc(logp, teacher_logprobs, mask, behavior_logprobs=behavior_logprobs,
                                  clip=clip, is_method=is_method, is_low=is_low, is_high=is_high)
        k1_mc = k1(logp.detach(), fill_off(upcast(teacher_logprobs), mask, logp.detach())).mean(-1)
        metrics["loss/teacher_kl"] = _masked_mean(k1_mc, mask)
        realized = logp  # for the ratio metrics below
    elif name == "forward_kl_topk":
        _require(name, student_logits=student_logits, teacher_topk_ids=teacher_topk_ids,
                 teacher_topk_logprobs=teacher_topk_logprobs)
        if teacher_topk_logprobs.shape != teacher_topk_ids.shape:
            raise ValueError("teacher_topk_ids and teacher_topk_logprobs must have the same (B, L, k) shape")
        logp_top = action_logprobs(student_logits, teacher_topk_ids)  # (B, L, k)
        per_token = forward_kl_topk_terms(logp_top, teacher_topk_logprobs, mask)
        lq = upcast(teacher_topk_logprobs).detach()
        q_mass = torch.where(torch.isfinite(lq), lq.exp(), torch.zeros_like(lq)).sum(-1)  # (B, L)
        p_mass = logp_top.detach().exp().sum(-1)  # (B, L)
        metrics["loss/topk_teacher_mass"] = _masked_mean(q_mass, mask)
        metrics["loss/topk_student_mass"] = _masked_mean(p_mass, mask)
    else:  # dense
        _require(name, student_logits=student_logits, teacher_logits=teacher_logits)
        if name == "forward_kl":
            per_token = forward_kl(student_logits, teacher_logits, mask)
        elif name == "reverse_kl":
            per_token = reverse_kl(student_logits, teacher_logits, mask)
        else:
            per_token = generalized_jsd(student_logits, teacher_logits, beta, mask)

    if iw_gamma:
        if name not in SAMPLED_TOKEN_LOSSES:
            raise ValueError(f"iw_gamma needs a sampled-token loss {SAMPLED_TOKEN_LOSSES}, got {name!r}")
        lp = upcast(realized.detach())
        weights = iw_opd_weights(fill_off(upcast(teacher_realized), mask, lp) - lp, mask, iw_gamma)  # (B, L)
        per_token = per_token * weights
        metrics["loss/iw_weight_mean"] = _masked_mean(weights, mask)

    loss = aggregate(per_token, mask, aggregation, normalizer)
    metrics["loss/value"] = float(loss.detach())
    if name != "reverse_kl_mc" and realized is not None and teacher_realized is not None:
        lp = upcast(realized.detach())
        lq = fill_off(upcast(teacher_realized), mask, lp)
        metrics["loss/teacher_kl"] = _masked_mean(k1(lp, lq), mask)
        metrics["loss/teacher_kl_k3"] = _masked_mean(k3(lp, lq), mask)
    if behavior_logprobs is not None and realized is not None and name in BEHAVIOR_LOSSES:
        teacher = teacher_logprobs if name == "reverse_kl_mc" else teacher_realized
        metrics.update(_ratio_metrics(realized, teacher, behavior_logprobs, mask, clip=clip,
                                      is_method=is_method, is_low=is_low, is_high=is_high))
    return loss, metrics


def _ratio_metrics(
    logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: tuple[float, float] | None,
    is_method: str,
    is_low: float,
    is_high: float,
) -> dict[str, float]:
    """Old-to-current ratio diagnostics over the mask; logp etc. (B, L) or (B, L, m)."""
    lp = upcast(logp.detach())
    log_ratio = lp - fill_off(upcast(behavior_logp), mask, lp)
    adv = fill_off(upcast(teacher_logp), mask, lp) - lp
    keep = torch.broadcast_to(keep_mask(mask, log_ratio), log_ratio.shape)
    n = keep.float().sum().clamp_min(1.0)
    ratio = log_ratio.exp()
    out = {f"loss/is_ratio_{k}": v for k, v in ratio_percentiles(ratio, keep).items()}
    out["loss/logprob_abs_diff"] = float(fill_off(log_ratio.abs(), keep).sum() / n)
    if is_method != "none":
        out["loss/is_frac_affected"] = importance_weights(log_ratio, is_method, is_low, is_high, mask=keep)[1]
    if clip is not None:
        # PPO clip binds (zero gradient) when the ratio left the trust region in the advantage's direction
        bound = ((adv > 0) & (ratio > 1.0 + clip[1])) | ((adv < 0) & (ratio < 1.0 - clip[0]))
        out["loss/clip_frac"] = float((bound & keep).float().sum() / n)
    return out
