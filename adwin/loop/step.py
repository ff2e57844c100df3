"""One synchronous OPD step's pieces after sampling (``adwin.loop.sampler``): teacher scoring, the optimizer step
(the loss of ``adwin.loop.learner.learner_step``, the update both schedulers share).

Both run in micro-batches of ``optim.micro_batch_size`` rows (``adwin.loop.memory``): the teacher's forward
and the student's forward/backward never see more rows at once, and the update equals the whole batch's
because every loss is normalised by the whole batch's token or sample count (docs/decisions.md,
"Micro-batches and memory options"). ``optimize``'s ``reducer`` (``adwin.loop.reduce``) extends the same sums across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adwin.config import TrainConfig
from adwin.controller.schemas import WindowOut
from adwin.loop.learner import learner_step
from adwin.loop.memory import micro_slices
from adwin.loop.reduce import Reducer
from adwin.objectives.loss_table import (
    SAMPLED_TOKEN_LOSSES,  # need only the teacher's realized-token logprobs
)
from adwin.objectives.losses import opd_loss, token_logprobs
from adwin.sampling.batch import Batch
from adwin.sampling.rollout import response_values
from adwin.teacher.load import AnyTeachers


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
    ``forward_kl_topk`` (taken by the scorer, ``adwin.teacher.scoring``: no (B, L, V) log-softmax here). The dense losses (``forward_kl``, ``reverse_kl``, ``jsd``) need every row's
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
        if name == "forward_kl_topk":  # taken by the scorer (on the teacher's device, or by the server)
            realized, idx, values = teachers.topk(ids[sl], attn[sl], routes[sl], cfg.loss.topk)  # (b, L), (b, L, k) x2
            logprobs.append(realized)
            topk_lp.append(values)
            topk_ids.append(idx)
            continue
        logits = teachers.logits(ids[sl], attn[sl], routes[sl])  # (b, L, V) float32 on the host
        logprobs.append(token_logprobs(logits, ids[sl]))
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
    """One AdamW step on the OPD loss over the first ``window`` response tokens (``adwin.loop.learner``).

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
    behavior = behavior_rows(batch, cfg)  # (B, L) or None

    def loss_fn(sl: slice, ids: torch.Tensor, logits: torch.Tensor,
                normalizer: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        return opd_loss(
            lc.name, input_ids=ids, response_mask=rows.response_mask[sl].to(device),
            student_logits=logits, teacher_logprobs=teacher.logprobs[sl].to(device),
            teacher_logits=_to(teacher.logits, sl, device), teacher_topk_ids=_to(teacher.topk_ids, sl, device),
            teacher_topk_logprobs=_to(teacher.topk_logprobs, sl, device),
            window=window, aggregation=lc.aggregation, beta=lc.jsd_beta, clip_low=lc.clip_low, clip_high=lc.clip_high,
            iw_gamma=lc.iw_gamma, behavior_logprobs=_to(behavior, sl, device),
            is_method=lc.is_method, is_low=lc.is_low, is_high=lc.is_high, normalizer=normalizer,
        )

    up = learner_step(student, optimizer, scheduler, rows, cfg, loss_fn, window=window, behavior=behavior,
                      reducer=reducer)
    lm = up.metrics
    metrics = {"loss/total": up.loss, "loss/teacher_kl": lm.get("loss/teacher_kl", float("nan")),
               "loss/tokens": lm["loss/tokens"]} | up.optim_metrics()
    metrics |= {k: v for k, v in lm.items() if k in RATIO_METRICS or k.startswith("loss/is_")}  # when configured
    return metrics, up.logprobs


def window_metrics(win: WindowOut) -> dict[str, Any]:
    m: dict[str, Any] = {"window/current": float(win.window), "window/reason": win.reason}
    m |= {f"window/cos_{c}": float(v) for c, v in (win.cosines or {}).items()}
    return m
