"""Distribution losses: teacher top-k forward KL and the dense-logit divergences (forward and
reverse KL, generalized JSD), per token.

Math layer: imports nothing from the controller, probes or application modules. Re-exported by
``adwin.objectives.losses``, which dispatches to them by name in ``opd_loss``.

KL directions: ``p`` is the student, ``q`` the teacher. Reverse KL is ``KL(p || q)``, forward is
``KL(q || p)``. Outputs are (B, L), aligned with ``input_ids``, exact zeros off the mask when one is given.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from adwin.objectives.logprobs import action_logprobs, fill_off, keep_mask, upcast


def forward_kl_topk(
    student_logits: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Teacher top-k forward KL (GKD OPD), per token: ``max(0, sum_{v in topk} q(v)(log q(v) - log p(v)))``.

    student_logits: (B, L, V) raw layout; teacher_topk_ids, teacher_topk_logprobs: (B, L, k) aligned with
    ``input_ids`` (the teacher's top-k for the token at ``i``); mask: (B, L) -> (B, L). Neither side is
    renormalized on the top-k support; non-finite teacher logprobs (unfilled slots) count as q = 0.
    """
    if teacher_topk_logprobs.shape != teacher_topk_ids.shape:
        raise ValueError("teacher_topk_ids and teacher_topk_logprobs must have the same (B, L, k) shape")
    logp = action_logprobs(student_logits, teacher_topk_ids)  # (B, L, k)
    return forward_kl_topk_terms(logp, teacher_topk_logprobs, mask)


def forward_kl_topk_terms(logp: torch.Tensor, teacher_topk_logprobs: torch.Tensor,
                           mask: torch.Tensor) -> torch.Tensor:
    """forward_kl_topk from the student's top-k logprobs (B, L, k) -> (B, L)."""
    lq = upcast(teacher_topk_logprobs).detach()
    present = torch.isfinite(lq) & keep_mask(mask, lq)
    lq = torch.where(present, lq, torch.zeros_like(lq))
    q = torch.where(present, lq.exp(), torch.zeros_like(lq))
    per_token = (q * (lq - logp)).sum(dim=-1).clamp_min(0.0)  # (B, L)
    return fill_off(per_token, mask)


def _dense_logps(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shifted student and (constant) teacher log-softmax, both (B, L-1, V)."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"teacher_logits {tuple(teacher_logits.shape)} must match student_logits "
                         f"{tuple(student_logits.shape)} (same vocabulary, same layout)")
    t_raw = upcast(teacher_logits[:, :-1]).detach()  # (B, L-1, V)
    if mask is not None:
        # a NaN teacher row off the mask would still poison the gradient through 0 * NaN
        t_raw = torch.where((mask[:, 1:] > 0).unsqueeze(-1), t_raw, torch.zeros_like(t_raw))
    s = torch.log_softmax(upcast(student_logits[:, :-1]), dim=-1)
    return s, torch.log_softmax(t_raw, dim=-1)


def _kl_rows(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """``KL(a || b)`` over the last dim, with ``0 * log 0 = 0``: (..., V) -> (...)."""
    a = log_a.exp()
    return torch.where(a > 0, a * (log_a - log_b), torch.zeros_like(a)).sum(dim=-1)


def _finish(per_pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    per_token = F.pad(per_pos, (1, 0), value=0.0)  # (B, L): position 0 has no predictor
    return per_token if mask is None else fill_off(per_token, mask)


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """Dense ``KL(q || p)`` per token from full logits (both (B, L, V) raw layout) -> (B, L)."""
    s, t = _dense_logps(student_logits, teacher_logits, mask)
    return _finish(_kl_rows(t, s), mask)


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """Dense ``KL(p || q)`` per token from full logits (both (B, L, V) raw layout) -> (B, L)."""
    s, t = _dense_logps(student_logits, teacher_logits, mask)
    return _finish(_kl_rows(s, t), mask)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Generalized JSD per token (GKD eq. 1), TRL's ``generalized_jsd_loss`` convention -> (B, L).

    ``M = beta * q + (1 - beta) * p`` and ``JSD = beta * KL(q || M) + (1 - beta) * KL(p || M)`` for
    ``0 < beta < 1``; ``beta = 0`` is forward ``KL(q || p)`` and ``beta = 1`` reverse ``KL(p || q)``,
    special-cased exactly as in TRL (the interior tends to 0, not to those KLs, at the endpoints: near
    them it behaves like ``beta * KL(q || p)`` and ``(1 - beta) * KL(p || q)``).
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    s, t = _dense_logps(student_logits, teacher_logits, mask)
    if beta == 0.0:
        return _finish(_kl_rows(t, s), mask)
    if beta == 1.0:
        return _finish(_kl_rows(s, t), mask)
    log_m = torch.logsumexp(torch.stack([t + math.log(beta), s + math.log1p(-beta)]), dim=0)
    per_pos = beta * _kl_rows(t, log_m) + (1.0 - beta) * _kl_rows(s, log_m)
    return _finish(per_pos, mask)
