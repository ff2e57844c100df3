"""One learner update of the student, shared by both schedulers: the synchronous trainer's step
(``adwin.loop.step.optimize``) and the AsyncOPD learners (``trainer_adapters/asyncopd``: IS and OAPL).

A caller brings only its loss (``MicroLoss``: one micro-batch's share of the batch loss from the student's
logits); ``learner_step`` does the rest the same way for every loss:

- the rows go through the student in micro-batches of ``optim.micro_batch_size`` rows under the memory
  options (``adwin.loop.memory.training_forward``: ``model.gradient_checkpointing``, ``model.autocast``,
  ``model.lora.dropout``), each micro-batch's loss normalised by the whole batch's count, so the accumulated
  gradient is the whole batch's (docs/decisions.md, "Micro-batches and memory options");
- a data-parallel ``reducer`` (``adwin.loop.reduce``) sums the normaliser, the gradients and the metrics;
- the gradient norm is clipped at ``optim.grad_clip``;
- a non-finite loss or gradient norm skips the optimizer step (``adwin.runtime.guards``); the LR schedule
  steps either way. The run counts skipped steps with ``FaultCounter`` and stops at ``optim.max_bad_steps``
  in a row.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from adwin.config import TrainConfig
from adwin.loop.memory import micro_slices, training_forward
from adwin.loop.reduce import LocalReducer, Reducer, all_sum_grads
from adwin.objectives.losses import (
    action_logprobs,
    fill_off,
    keep_mask,
    loss_mask,
    loss_normalizer,
    ratio_percentiles,
    token_logprobs,
    upcast,
)
from adwin.runtime.guards import NumericalFault, is_finite
from adwin.sampling.rollout import Rows
from adwin.student.fsdp import full_tensor, is_sharded
from adwin.student.lora import trainable_parameters

log = logging.getLogger(__name__)

MicroLoss = Callable[[slice, torch.Tensor, torch.Tensor, "torch.Tensor | None"], tuple[torch.Tensor, dict[str, float]]]
"""``(rows, input_ids (b, L) on the student's device, student logits (b, L, V), normalizer)`` -> this micro-batch's
share of the batch loss and its metrics (``loss/value``, ``loss/tokens``, means over its counted tokens).
``normalizer`` None: the micro-batch is the whole batch."""


@dataclass
class Update:
    """What one ``learner_step`` did."""

    loss: float  # the whole batch's loss
    metrics: dict[str, float]  # the loss's metrics over the whole batch (``loss/*``)
    grad_norm: float  # before clipping
    skipped: bool  # non-finite: the optimizer did not step
    logprobs: torch.Tensor  # (B, L) the student's realized-token logprobs before the update

    def optim_metrics(self) -> dict[str, float]:
        return {"optim/grad_norm": self.grad_norm, "optim/skipped": float(self.skipped)}


def learner_step(student: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any, rows: Rows,
                 cfg: TrainConfig, loss_fn: MicroLoss, *, window: int | None,
                 normalizer: torch.Tensor | None = None, behavior: torch.Tensor | None = None,
                 actions: torch.Tensor | None = None, reducer: Reducer | None = None) -> Update:
    """One optimizer step on ``loss_fn`` over ``rows``; see the module docstring.

    ``window``: the counted response tokens (None: all of them). ``normalizer``: this rank's share of the
    loss's denominator (None: ``loss_normalizer`` of the window under ``loss.aggregation``). ``behavior``
    ((B, L), or (B, L, m) with ``actions``: the cached actions the ratio is over) lets the ratio percentiles
    (``loss/is_ratio_*``) be recomputed over the whole batch when it ran in micro-batches; with a reducer they
    stay this rank's. ``lr_scheduler`` None: no schedule to step.
    """
    device = next(student.parameters()).device
    slices = micro_slices(rows.input_ids.shape[0], cfg.optim.micro_batch_size)
    whole = len(slices) == 1 and reducer is None  # the whole batch in one pass: no normaliser, no sums
    reduce = reducer or LocalReducer()
    mask = loss_mask(rows.response_mask, window)  # (B, L)
    total_norm = None
    if not whole:
        local = normalizer if normalizer is not None else loss_normalizer(mask, cfg.loss.aggregation)
        total_norm = reduce.all_sum(local.reshape(1).to(device))[0]
    optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []
    parts: list[dict[str, float]] = []
    current: list[torch.Tensor] = []
    ratio_lp: list[torch.Tensor] = []
    for sl in slices:
        ids = rows.input_ids[sl].to(device)  # (b, L)
        with training_forward(student, cfg):
            logits = student(input_ids=ids, attention_mask=rows.attention_mask[sl].to(device), use_cache=False).logits
        loss, lm = loss_fn(sl, ids, logits, total_norm)
        loss.backward()
        current.append(token_logprobs(logits.detach(), ids).cpu())  # (b, L)
        if actions is not None and not whole:
            ratio_lp.append(action_logprobs(logits.detach(), actions[sl].to(device)).cpu())  # (b, L, m)
        losses.append(loss.detach())
        parts.append(lm)
        del logits, loss  # before the next micro-batch's forward: one graph at a time
    logprobs = torch.cat(current)  # (B, L)
    if whole:
        total, lm = float(losses[0]), parts[0]
    else:
        total, lm = combined_metrics(losses, parts, reduce, device)
        if behavior is not None and any(k.startswith("loss/is_ratio_") for k in parts[0]):
            lm |= _ratio_percentiles(torch.cat(ratio_lp) if ratio_lp else logprobs, behavior, mask)
        if reducer is not None and not is_sharded(student):  # FSDP2 has reduce-scattered them in the backward
            all_sum_grads(trainable_parameters(student), reducer)
    grad_norm, skipped = apply_gradients(student, optimizer, lr_scheduler, total, cfg.optim.grad_clip)
    return Update(total, lm, grad_norm, skipped, logprobs)


def apply_gradients(student: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any, loss: float,
                    grad_clip: float) -> tuple[float, bool]:
    """Clip (``grad_clip <= 0``: the norm is measured, not clipped), then step, or skip a non-finite step;
    the LR schedule follows steps, skipped or not. Returns the pre-clip norm and whether the step was skipped."""
    clip = grad_clip if grad_clip > 0 else float("inf")
    # LoRA: the adapters' norm; a sharded student's is over every rank's shard (a replicated DTensor)
    grad_norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(trainable_parameters(student), clip)))
    skip = not is_finite(loss, grad_norm)
    if skip:  # a NaN/Inf update would corrupt the weights and Adam's moments: drop it
        log.warning("non-finite loss %.4g or grad norm %.4g: optimizer step skipped", loss, grad_norm)
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    if lr_scheduler is not None:
        with warnings.catch_warnings():  # torch warns when a skipped first step leaves optimizer.step() uncalled
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            lr_scheduler.step()
    return grad_norm, skip


def combined_metrics(losses: list[torch.Tensor], parts: list[dict[str, float]], reduce: Reducer,
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
    """``loss/is_ratio_*`` over this rank's whole batch, as ``opd_loss`` computes them for one batch;
    ``logprobs``/``behavior`` (B, L) or (B, L, m), ``mask`` (B, L)."""
    lp = upcast(logprobs)
    ratio = (lp - fill_off(upcast(behavior), mask, lp)).exp()  # (B, L[, m])
    return {f"loss/is_ratio_{k}": v for k, v in ratio_percentiles(ratio, keep_mask(mask, ratio)).items()}


class FaultCounter:
    """Skipped (non-finite) steps, as ``learner_step`` reports them: total and consecutive; ``exhausted`` once
    ``limit`` (``optim.max_bad_steps``) in a row: the run then stops with ``NumericalFault`` (``fault``)."""

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

    def fault(self, step: int, saved: object) -> NumericalFault:
        """The error that stops the run at ``step``, naming the checkpoint ``saved`` of the last good state."""
        return NumericalFault(f"{self.consecutive} consecutive non-finite steps at step {step} "
                              f"(optim.max_bad_steps={self.limit}): run stopped; last good state saved in {saved}")

    def state_dict(self) -> dict[str, int]:
        return {"total": self.total, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total, self.consecutive = int(state["total"]), int(state["consecutive"])
