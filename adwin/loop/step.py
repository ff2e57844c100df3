"""One synchronous OPD step's pieces after sampling (``adwin.loop.sampler``): teacher scoring, the optimizer step.

Both run in micro-batches of ``optim.micro_batch_size`` rows (``adwin.loop.memory``): the teacher's forward
and the student's forward/backward never see more rows at once, and the update equals the whole batch's
because every loss is normalised by the whole batch's token or sample count (docs/decisions.md,
"Micro-batches and memory options"). ``optimize``'s ``reducer`` (``adwin.loop.reduce``) extends the same sums across ranks.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from adwin.config import TrainConfig
from adwin.controller.schemas import WindowOut
from adwin.loop.memory import micro_slices, training_forward
from adwin.loop.reduce import LocalReducer, Reducer, all_sum_grads
from adwin.objectives.loss_table import (
    SAMPLED_TOKEN_LOSSES,  # need only the teacher's realized-token logprobs
)
from adwin.objectives.losses import (
    fill_off,
    loss_mask,
    loss_normalizer,
    opd_loss,
    ratio_percentiles,
    token_logprobs,
    topk_logprobs,
    upcast,
)
from adwin.runtime.guards import is_finite
from adwin.sampling.batch import Batch
from adwin.sampling.rollout import response_values
from adwin.student.fsdp import full_tensor, is_sharded
from adwin.student.lora import trainable_parameters
from adwin.teacher.load import AnyTeachers

log = logging.getLogger(__name__)



@dataclass
class TeacherSignal:
    logprobs: torch.Tensor  # (B, L) realized-token teacher logprobs
    logits: torch.Tensor | None = None  # (B, L, V) raw layout, dense losses only (host memory)
    topk_ids: torch.Tensor | None = None  # (B, L, k) aligned with input_ids
    topk_logprobs: torch.Tensor | None = None  # (B, L, k)


def score_teacher(teachers: AnyTeachers, batch: Batch, cfg: TrainConfig) -> TeacherSignal:
    """Realized-token logprobs always; full logits or top-k only when the configured loss needs them.

    The teacher runs one micro-batch of ``optim.micro_batch_size`` rows at a time and only what the loss
    reads is kept: (B, L) logprobs for the sampled-token losses, plus (B, L, k) top-k for
    ``forward_kl_topk``. The dense losses (``forward_kl``, ``reverse_kl``, ``jsd``) need every row's
    (L, V) logits: they are kept in host memory, B x L x V float32 (docs/design.md, "Memory options").
    """
    ids, attn, routes = batch.rows.input_ids, batch.rows.attention_mask, [p.route for p in batch.prompts]
    name = cfg.loss.name
    logprobs: list[torch.Tensor] = []
    topk_ids: list[torch.Tensor] = []
    topk_lp: list[torch.Tensor] = []
    dense: torch.Tensor | None = None
    for sl in micro_slices(ids.shape[0], cfg.optim.micro_batch_size):
        if name in SAMPLED_TOKEN_LOSSES:
            logprobs.append(teachers.score(ids[sl], attn[sl], routes[sl]))  # (b, L)
            continue
        if name == "forward_kl_topk" and not teachers.dense:  # a server sends the top-k itself
            realized, idx, values = teachers.topk(ids[sl], attn[sl], routes[sl], cfg.loss.topk)  # (b, L), (b, L, k) x2
            logprobs.append(realized)
            topk_lp.append(values)
            topk_ids.append(idx)
            continue
        logits = teachers.logits(ids[sl], attn[sl], routes[sl])  # (b, L, V) float32 on the host
        logprobs.append(token_logprobs(logits, ids[sl]))
        if name == "forward_kl_topk":
            values, idx = topk_logprobs(logits, cfg.loss.topk)  # (b, L, k)
            topk_lp.append(values)
            topk_ids.append(idx)
            continue
        if dense is None:
            dense = torch.empty((ids.shape[0], *logits.shape[1:]), dtype=logits.dtype)  # (B, L, V)
        dense[sl] = logits
        del logits
    signal = TeacherSignal(torch.cat(logprobs), logits=dense)
    if topk_ids:
        signal.topk_ids, signal.topk_logprobs = torch.cat(topk_ids), torch.cat(topk_lp)
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


def _to(t: torch.Tensor | None, sl: slice, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t[sl].to(device)


def optimize(student: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, batch: Batch,
             teacher: TeacherSignal, cfg: TrainConfig, window: int, *,
             reducer: Reducer | None = None) -> tuple[dict[str, float], torch.Tensor]:
    """One AdamW step on the OPD loss over the first ``window`` response tokens.

    The rows go through the student in micro-batches of ``optim.micro_batch_size`` (None: all at once, one
    forward and one backward), each micro-batch's loss normalised by the whole batch's count, so the
    accumulated gradient is the whole batch's. ``reducer`` (data parallelism, ``adwin.loop.reduce``) sums
    that count, the gradients and the metrics' sums across ranks; metrics are then global on every rank
    except the ratio percentiles (``loss/is_ratio_*``), which are this rank's. A sharded student
    (``model.sharding: fsdp``) sums its gradients itself: each backward reduce-scatters them into this
    rank's shards (``adwin.student.fsdp``), so the reducer sums only the normaliser and the metrics.

    Returns the metrics and the student's per-token logprobs before the update (B, L): the behavior
    logprobs of this step's prefixes, which probes carry forward.
    """
    rows, lc = batch.rows, cfg.loss
    device = next(student.parameters()).device
    behavior = behavior_rows(batch, cfg)
    slices = micro_slices(rows.input_ids.shape[0], cfg.optim.micro_batch_size)
    whole = len(slices) == 1 and reducer is None  # the whole batch in one pass: no normaliser, no sums
    reduce = reducer or LocalReducer()
    normalizer = None
    if not whole:
        local = loss_normalizer(loss_mask(rows.response_mask, window), lc.aggregation).reshape(1).to(device)
        normalizer = reduce.all_sum(local)[0]
    optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []
    parts: list[dict[str, float]] = []
    current: list[torch.Tensor] = []
    for sl in slices:
        ids = rows.input_ids[sl].to(device)
        with training_forward(student, cfg):
            logits = student(input_ids=ids, attention_mask=rows.attention_mask[sl].to(device), use_cache=False).logits
        loss, lm = opd_loss(
            lc.name, input_ids=ids, response_mask=rows.response_mask[sl].to(device),
            student_logits=logits, teacher_logprobs=teacher.logprobs[sl].to(device),
            teacher_logits=_to(teacher.logits, sl, device), teacher_topk_ids=_to(teacher.topk_ids, sl, device),
            teacher_topk_logprobs=_to(teacher.topk_logprobs, sl, device),
            window=window, aggregation=lc.aggregation, beta=lc.jsd_beta, clip_low=lc.clip_low, clip_high=lc.clip_high,
            iw_gamma=lc.iw_gamma, behavior_logprobs=_to(behavior, sl, device),
            is_method=lc.is_method, is_low=lc.is_low, is_high=lc.is_high, normalizer=normalizer,
        )
        loss.backward()
        current.append(token_logprobs(logits.detach(), ids).cpu())  # (b, L)
        losses.append(loss.detach())
        parts.append(lm)
        del logits, loss  # before the next micro-batch's forward: one graph at a time
    logprobs = torch.cat(current)  # (B, L)
    if whole:
        total, lm = float(losses[0]), parts[0]
    else:
        total, lm = _combined_metrics(losses, parts, reduce, device)
        if behavior is not None and any(k.startswith("loss/is_ratio_") for k in parts[0]):
            lm |= _ratio_percentiles(logprobs, behavior, loss_mask(rows.response_mask, window))
        if reducer is not None and not is_sharded(student):  # FSDP2 has reduce-scattered them in the backward
            all_sum_grads(trainable_parameters(student), reducer)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    # LoRA: the adapters' norm; a sharded student's is over every rank's shard (a replicated DTensor)
    grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(trainable_parameters(student), clip))
    skip = not is_finite(total, float(grad_norm))
    if skip:  # a NaN/Inf update would corrupt the weights and Adam's moments: drop it (adwin.runtime.guards)
        log.warning("non-finite loss %.4g or grad norm %.4g: optimizer step skipped", total, float(grad_norm))
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    with warnings.catch_warnings():  # torch warns when a skipped first step leaves optimizer.step() uncalled
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()  # the LR schedule follows loop steps, skipped or not
    metrics = {"loss/total": total, "loss/teacher_kl": lm.get("loss/teacher_kl", float("nan")),
               "loss/tokens": lm["loss/tokens"], "optim/grad_norm": float(grad_norm), "optim/skipped": float(skip)}
    metrics |= {k: v for k, v in lm.items() if k in RATIO_METRICS or k.startswith("loss/is_")}  # when configured
    return metrics, logprobs


def _combined_metrics(losses: list[torch.Tensor], parts: list[dict[str, float]], reduce: Reducer,
                      device: torch.device) -> tuple[float, dict[str, float]]:
    """The whole batch's loss and metrics from its micro-batches' (summed across ranks by ``reduce``).

    Losses are already shares of the global loss, so they add; every other metric is a mean over its
    micro-batch's counted tokens, so it is weighted by ``loss/tokens``. Percentiles are left out.
    """
    means = [k for k in parts[0] if k not in ("loss/value", "loss/tokens") and not k.startswith("loss/is_ratio_")]
    sums = torch.zeros(2 + len(means), dtype=torch.float64, device=device)  # (2 + M,)
    sums[0] = torch.stack(losses).double().sum()
    sums[1] = sum(p["loss/tokens"] for p in parts)
    for i, k in enumerate(means):
        sums[2 + i] = math.fsum(p[k] * p["loss/tokens"] for p in parts)
    sums = reduce.all_sum(sums).cpu()
    tokens = float(sums[1])
    out = {"loss/value": float(sums[0]), "loss/tokens": tokens}
    out |= {k: float(sums[2 + i]) / max(tokens, 1.0) for i, k in enumerate(means)}
    return float(sums[0]), out


def _ratio_percentiles(logprobs: torch.Tensor, behavior: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``loss/is_ratio_*`` over this rank's whole batch, as ``opd_loss`` computes them for one batch."""
    lp = upcast(logprobs)
    ratio = (lp - fill_off(upcast(behavior), mask, lp)).exp()  # (B, L)
    return {f"loss/is_ratio_{k}": v for k, v in ratio_percentiles(ratio, mask > 0).items()}


def window_metrics(win: WindowOut) -> dict[str, Any]:
    m: dict[str, Any] = {"window/current": float(win.window), "window/reason": win.reason}
    m |= {f"window/cos_{c}": float(v) for c, v in (win.cosines or {}).items()}
    return m


class FaultCounter:
    """Skipped (non-finite) steps, as ``optimize`` reports them: total and consecutive; ``exhausted`` once
    ``limit`` (``optim.max_bad_steps``) in a row: the trainer then stops with ``NumericalFault``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.consecutive = 0

    def record(self, skipped: bool) -> dict[str, float]:
        if skipped:
            self.total += 1
            self.consecutive += 1
        else:
            self.consecutive = 0
        return {"optim/skipped_steps": float(self.total), "optim/consecutive_skipped": float(self.consecutive)}

    @property
    def exhausted(self) -> bool:
        return self.consecutive >= self.limit

    def state_dict(self) -> dict[str, int]:
        return {"total": self.total, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total, self.consecutive = int(state["total"]), int(state["consecutive"])
