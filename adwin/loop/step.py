"""One synchronous OPD step's pieces after sampling (``adwin.loop.sampler``): teacher scoring, the optimizer step."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from adwin.config import TrainConfig
from adwin.controller.schemas import WindowOut
from adwin.loop.sampler import Batch
from adwin.objectives.losses import opd_loss, token_logprobs
from adwin.runtime.guards import is_finite
from adwin.sampling.rollout import response_values
from adwin.sampling.teacher import Teachers

log = logging.getLogger(__name__)

@dataclass
class TeacherSignal:
    logprobs: torch.Tensor  # (B, L) realized-token teacher logprobs
    logits: torch.Tensor | None = None  # (B, L, V) raw layout, dense losses only
    topk_ids: torch.Tensor | None = None  # (B, L, k) aligned with input_ids
    topk_logprobs: torch.Tensor | None = None  # (B, L, k)


def score_teacher(teachers: Teachers, batch: Batch, cfg: TrainConfig) -> TeacherSignal:
    """Realized-token logprobs always; full logits or top-k only when the configured loss needs them."""
    ids, attn, routes = batch.rows.input_ids, batch.rows.attention_mask, [p.route for p in batch.prompts]
    if cfg.loss.name == "reverse_kl_pg":
        return TeacherSignal(teachers.score(ids, attn, routes))
    logits = teachers.logits(ids, attn, routes)  # (B, L, V)
    signal = TeacherSignal(token_logprobs(logits, ids), logits=logits)
    if cfg.loss.name == "forward_kl_topk":
        aligned = torch.nn.functional.pad(torch.log_softmax(logits[:, :-1], -1), (0, 0, 1, 0))  # (B, L, V)
        signal.topk_logprobs, signal.topk_ids = aligned.topk(min(cfg.loss.topk, logits.shape[-1]), dim=-1)
        signal.logits = None
    return signal


RATIO_METRICS = ("loss/iw_weight_mean", "loss/clip_frac", "loss/logprob_abs_diff")


def behavior_rows(batch: Batch, cfg: TrainConfig) -> torch.Tensor | None:
    """(B, L) behavior logprobs on the response columns when the loss weights by them, else None."""
    if not cfg.loss.weights_by_behavior:
        return None
    if batch.behavior_logprobs is None:
        raise ValueError("loss.is_method / loss.clip_* need the rollouts' behavior logprobs: sample the batch "
                         "with Sampler.roll_out under the same config")
    return response_values(batch.rows, batch.behavior_logprobs)


def optimize(student: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, batch: Batch,
             teacher: TeacherSignal, cfg: TrainConfig, window: int) -> tuple[dict[str, float], torch.Tensor]:
    """One AdamW step on the OPD loss over the first ``window`` response tokens.

    Returns the metrics and the student's per-token logprobs before the update (B, L): the behavior
    logprobs of this step's prefixes, which probes carry forward.
    """
    rows, lc = batch.rows, cfg.loss
    device = next(student.parameters()).device
    behavior = behavior_rows(batch, cfg)
    optimizer.zero_grad(set_to_none=True)
    logits = student(input_ids=rows.input_ids.to(device), attention_mask=rows.attention_mask.to(device)).logits
    loss, lm = opd_loss(
        lc.name, input_ids=rows.input_ids.to(device), response_mask=rows.response_mask.to(device),
        student_logits=logits, teacher_logprobs=teacher.logprobs.to(device),
        teacher_logits=None if teacher.logits is None else teacher.logits.to(device),
        teacher_topk_ids=None if teacher.topk_ids is None else teacher.topk_ids.to(device),
        teacher_topk_logprobs=None if teacher.topk_logprobs is None else teacher.topk_logprobs.to(device),
        window=window, aggregation=lc.aggregation, beta=lc.jsd_beta, clip_low=lc.clip_low, clip_high=lc.clip_high,
        iw_gamma=lc.iw_gamma, behavior_logprobs=None if behavior is None else behavior.to(device),
        is_method=lc.is_method, is_low=lc.is_low, is_high=lc.is_high,
    )
    loss.backward()
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), clip)
    skip = not is_finite(float(loss.detach()), float(grad_norm))
    if skip:  # a NaN/Inf update would corrupt the weights and Adam's moments: drop it (adwin.runtime.guards)
        log.warning("non-finite loss %.4g or grad norm %.4g: optimizer step skipped", float(loss.detach()),
                    float(grad_norm))
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    with warnings.catch_warnings():  # torch warns when a skipped first step leaves optimizer.step() uncalled
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()  # the LR schedule follows loop steps, skipped or not
    current = token_logprobs(logits.detach(), rows.input_ids.to(device)).cpu()  # (B, L)
    metrics = {"loss/total": float(loss.detach()), "loss/teacher_kl": lm.get("loss/teacher_kl", float("nan")),
               "loss/tokens": lm["loss/tokens"], "optim/grad_norm": float(grad_norm), "optim/skipped": float(skip)}
    metrics |= {k: v for k, v in lm.items() if k in RATIO_METRICS or k.startswith("loss/is_")}  # when configured
    return metrics, current



def window_metrics(win: WindowOut) -> dict[str, Any]:
    m: dict[str, Any] = {"window/current": float(win.window), "window/reason": win.reason}
    m |= {f"window/cos_{c}": float(v) for c, v in (win.cosines or {}).items()}
    return m


