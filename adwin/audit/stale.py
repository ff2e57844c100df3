"""Stale-corrected audit weights: ``rho = p_theta(y) / p_behavior(y)`` per probe token.

Math layer (imports only ``losses`` and ``importance``). Probe tokens were sampled by older student
versions (the behavior logprobs recorded at extension time); the audit measures gradients under the
current weights ``theta``. Weighting each token's loss by a treated ``rho`` (AsyncOPD's old-to-current
importance ratio; ``none`` | ``clip`` | ``cap`` | ``icepop`` from ``adwin.objectives.importance``) makes the audit's
token sums estimate the current policy's expectation again, token by token. ``none`` is the paper's
behaviour: no reweighting; the ratio diagnostics are still measured.
"""

from __future__ import annotations

import torch

from adwin.audit.alignment import ProbeBatch
from adwin.objectives.importance import IS_METHODS, importance_weights, ratio_percentiles
from adwin.objectives.losses import token_logprobs


@torch.no_grad()
def current_logprobs(model: torch.nn.Module, batch: ProbeBatch, micro_batch: int = 8) -> torch.Tensor:
    """log p_theta of every realized token under the current weights (eval mode), (B, L) on CPU."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        for i in range(0, batch.input_ids.shape[0], micro_batch):
            ids = batch.input_ids[i : i + micro_batch].to(device)  # (b, L)
            attn = batch.attention_mask[i : i + micro_batch].to(device)  # (b, L)
            logits = model(input_ids=ids, attention_mask=attn).logits  # (b, L, V)
            out.append(token_logprobs(logits, ids).float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out)  # (B, L)


IS_LEVELS: tuple[str, ...] = ("token", "prefix")


def stale_token_weights(model: torch.nn.Module, batch: ProbeBatch, method: str = "none", low: float = 0.5,
                        high: float = 2.0, version: int | None = None,
                        level: str = "token") -> tuple[torch.Tensor | None, dict[str, float]]:
    """Audit ``token_weights`` (B, L) for ``method`` and the ratio diagnostics as ``audit/is_*`` metrics.

    ``level="token"`` weights token t by its own ratio ``rho_t`` (AsyncOPD's correction: right for the
    token given its prefix, blind to how stale weights shifted the prefix itself). ``level="prefix"``
    weights it by ``prod_{s<=t} rho_s`` over the response, the per-decision importance weight, which
    also re-weights the prefix that led to the token; unbiased for the current policy's expectation of
    every token's gradient, at a variance that grows with staleness (the treatments bound it).

    Returns ``None`` weights for ``none`` (the audit then runs unweighted). Diagnostics: percentiles
    p50/p90/p99/max of ``rho`` over response tokens, the fraction clipped (``clip``) or masked (``cap``,
    ``icepop``), and with ``version`` the fraction of tokens produced by older weights.
    """
    if method not in IS_METHODS:
        raise ValueError(f"is_method must be one of {IS_METHODS}, got {method!r}")
    if batch.behavior_logprobs is None:
        if method != "none":
            raise ValueError(f"is_method={method!r} needs behavior logprobs in the probe batch")
        return None, {}
    if level not in IS_LEVELS:
        raise ValueError(f"is_level must be one of {IS_LEVELS}, got {level!r}")
    mask = batch.response_mask.float()  # (B, L)
    # Off the response the behavior logprobs are whatever the writer left there (-inf, NaN): select,
    # never multiply by the mask, or -inf * 0 = NaN reaches the prefix cumsum and every weight.
    on = mask > 0
    behavior = torch.where(on, batch.behavior_logprobs.float(), torch.zeros_like(mask))  # (B, L)
    log_ratio = torch.where(on, current_logprobs(model, batch) - behavior, torch.zeros_like(mask))  # (B, L)
    if level == "prefix":
        log_ratio = torch.cumsum(log_ratio, dim=1) * mask  # (B, L): log prod_{s<=t} rho_s
    weights, frac = importance_weights(log_ratio, method, low, high, mask=mask)
    pct = ratio_percentiles(torch.exp(log_ratio), mask)
    m = {f"audit/is_{k}": v for k, v in pct.items()}
    m["audit/is_clipped_frac"] = frac if method == "clip" else 0.0
    m["audit/is_masked_frac"] = frac if method in ("cap", "icepop") else 0.0
    if version is not None and batch.versions is not None:
        stale = ((batch.versions < version) & (batch.versions >= 0)).float() * mask
        m["audit/is_stale_token_frac"] = float(stale.sum() / mask.sum().clamp_min(1.0))
    return (None if method == "none" else (weights * mask).detach()), m
