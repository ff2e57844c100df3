"""OAPL learner of the AsyncOPD pipeline: eq. 3 on whole prompt groups sampled by one inference policy.

The scheduler runs with ``groups`` (``SchedulerConfig``): every batch is ``B / G`` complete prompt groups,
each sampled entirely by the weights the rollout workers hold (``pi_inf``, synced every ``loss.oapl.lag``
updates; Algorithm 1). Per item, over its trained window (the tokens it generated, at most the window in
force when it was submitted):

- ``ln pi(y|x)``: the live student's token log-probabilities summed over the window (differentiable);
- ``ln pi_inf(y|x)``: the behaviour log-probabilities the rollout worker recorded when it sampled them;
- the reward (``loss.oapl.reward``): ``teacher`` = ``sum_t log q(y_t) - log pi_inf(y_t)`` over the same
  window (the negative reverse-KL return; with ``beta = 1`` the optimum is the teacher's distribution of
  window prefixes), ``task`` = the task's checker on the decoded response (0/1; config-refused unless the
  window is the full horizon), ``weighted`` = ``task_weight * task + teacher_weight * teacher``.

Loss: ``adwin.objectives.oapl.oapl_loss`` (mean over sequences). No importance ratio enters the loss; the
ratio ``pi / pi_inf`` per token is still reported (``loss/is_ratio_*``) so runs compare with the IS learner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adwin.backends.logprob_gap import logprob_gap
from adwin.config import TrainConfig
from adwin.loop.learner import learner_step
from adwin.loop.memory import training_forward
from adwin.objectives.losses import k1, keep_mask, ratio_percentiles, token_logprobs
from adwin.objectives.oapl import OAPLTerms, oapl_loss, sequence_logprob, soft_value, teacher_return
from adwin.sampling.rollout import Rows
from adwin.student.lora import trained_state
from adwin.trainer_adapters.asyncopd.groups import group_version
from adwin.trainer_adapters.asyncopd.hf import item_rows, item_values
from adwin.trainer_adapters.asyncopd.items import StreamItem


def check_groups(items: Sequence[StreamItem]) -> dict[int, list[StreamItem]]:
    """Items by prompt group; refuses a group sampled by more than one inference policy (eq. 2's V would
    average over two distributions). The scheduler's ``GroupBuffer`` never hands one over; this is the
    learner's own guard."""
    groups: dict[int, list[StreamItem]] = {}
    for it in items:
        if it.group < 0:
            raise ValueError(f"item {it.request_id} has no prompt group: OAPL needs scheduler groups")
        groups.setdefault(it.group, []).append(it)
    for g, members in groups.items():
        if group_version(members) is None:
            versions = sorted({v for it in members for v in it.token_versions})
            raise ValueError(f"prompt group {g} mixes inference policies (token versions {versions}) or holds an "
                             "item cut by a sync; OAPL estimates V over one policy's samples")
    return groups


@dataclass
class _Prepared:
    """One update's items as tensors, before the student's forward; (B, L) or (B,) on the student's device."""

    rows: Rows
    mask: torch.Tensor  # (B, L) the trained window: the whole response
    behavior: torch.Tensor  # (B, L) ln pi_inf per token
    teacher: torch.Tensor  # (B, L)
    inf_lp: torch.Tensor  # (B,) ln pi_inf(y|x)
    reward: torch.Tensor  # (B,)
    values: torch.Tensor  # (B,) eq. 2's V over the whole batch's groups
    gid: torch.Tensor  # (B,) prompt group
    metrics: dict[str, float]


class OAPLLearner:
    """One optimizer step of eq. 3 per call; see the module docstring. The options are ``cfg.loss.oapl``; the
    step itself (micro-batches of whole sequences, memory options, clipping, the non-finite skip) is the
    synchronous trainer's (``adwin.loop.learner``): eq. 2's values come from the whole batch first, so a
    micro-batch's share of eq. 3 needs no other rows. ``checker(text, answer)`` and ``decode(token_ids)`` are
    needed only when the reward uses the task."""

    def __init__(self, student: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                 cfg: TrainConfig, *, pad_id: int, width: int | None,
                 checker: Callable[[str, str], bool] | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        options = cfg.loss.oapl
        self.uses_task = options.reward == "task" or (options.reward == "weighted" and options.task_weight > 0)
        if self.uses_task and (checker is None or decode is None):
            raise ValueError("loss.oapl.reward uses the task: the learner needs the task's checker and a decoder")
        self.student, self.optimizer, self.lr_scheduler, self.cfg = student, optimizer, lr_scheduler, cfg
        self.pad_id, self.width, self.options = pad_id, width, options
        self.checker, self.decode = checker, decode
        self.shapes: list[tuple[int, int]] = []  # (B, L) of every update: fixed when width is given

    def rewards(self, items: Sequence[StreamItem], teacher: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(N,) rewards from the (N,) teacher returns and, when used, the checker; with their means."""
        o = self.options
        out = {"oapl/reward_teacher_mean": float(teacher.mean())}
        task = torch.zeros_like(teacher)
        if self.uses_task:
            assert self.checker is not None and self.decode is not None
            missing = next((it.prompt_id for it in items if it.answer is None), None)
            if missing is not None:
                raise ValueError(f"loss.oapl.reward uses the task, but prompt {missing} has no answer")
            task = torch.tensor([float(self.checker(self.decode(it.tokens), it.answer)) for it in items],  # type: ignore[arg-type]
                                dtype=teacher.dtype)
            out["oapl/reward_task_mean"] = float(task.mean())
        if o.reward == "teacher":
            r = teacher
        elif o.reward == "task":
            r = task
        else:
            r = o.task_weight * task + o.teacher_weight * teacher
        return r, out

    def _prepare(self, items: Sequence[StreamItem]) -> _Prepared:
        groups = check_groups(items)
        rows = item_rows(items, self.pad_id, self.width)
        self.shapes.append(tuple(rows.input_ids.shape))  # type: ignore[arg-type]
        device = next(self.student.parameters()).device
        mask = rows.response_mask.float().to(device)  # (B, L)
        behavior = item_values(items, rows, "logprobs").to(device)  # (B, L)
        teacher = item_values(items, rows, "teacher_logprobs").to(device)  # (B, L)
        reward, metrics = self.rewards(items, teacher_return(teacher, behavior, mask).detach())
        gid = torch.tensor([it.group for it in items], device=device)  # (B,)
        o = self.options
        values = soft_value(reward, gid, o.beta if o.value_beta is None else o.value_beta)  # (B,)
        metrics |= {"oapl/groups": float(len(groups)), "oapl/group_size_mean": len(items) / len(groups)}
        return _Prepared(rows, mask, behavior, teacher, sequence_logprob(behavior, mask), reward, values, gid, metrics)

    def _share(self, p: _Prepared, sl: slice, ids: torch.Tensor, logits: torch.Tensor,
               normalizer: torch.Tensor | None, terms: list[OAPLTerms]) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 3 over the rows ``sl`` as a share of the batch's mean (``normalizer``: its sequences; None: the
        rows are the batch), and their (b, L) token logprobs, with gradients."""
        tok_lp = token_logprobs(logits, ids)  # (b, L)
        seq_lp = sequence_logprob(tok_lp, p.mask[sl])  # (b,)
        loss, t = oapl_loss(seq_lp, p.inf_lp[sl], p.reward[sl], p.gid[sl], beta=self.options.beta, values=p.values[sl])
        terms.append(t)
        if normalizer is not None:  # the slice's mean -> its share of the whole batch's mean over sequences
            loss = loss * (seq_lp.shape[0] / normalizer)
        return loss, tok_lp

    def _metrics(self, p: _Prepared, tok_lp: torch.Tensor, terms: list[OAPLTerms]) -> dict[str, float]:
        whole = OAPLTerms(*(torch.cat([getattr(t, f) for t in terms]) for f in OAPLTerms.__dataclass_fields__))
        tok_lp, behavior = tok_lp.detach().cpu(), p.behavior.cpu()  # (B, L) x2
        out = p.metrics | _diagnostics(tok_lp, behavior, p.teacher.cpu(), p.mask.cpu(), whole, p.reward.cpu())
        # |log p_theta - log p_behavior| of the realized tokens: the lag plus any rollout-engine mismatch
        return out | logprob_gap(tok_lp, behavior, p.rows.response_mask)

    def loss(self, items: Sequence[StreamItem]) -> tuple[torch.Tensor, OAPLTerms, dict[str, float]]:
        """Eq. 3 on ``items`` under the live student, whole batch, with gradients; no optimizer step."""
        p = self._prepare(items)
        ids = p.rows.input_ids.to(p.mask.device)
        with training_forward(self.student, self.cfg):
            logits = self.student(input_ids=ids, attention_mask=p.rows.attention_mask.to(ids.device),
                                  use_cache=False).logits  # (B, L, V)
        terms: list[OAPLTerms] = []
        loss, tok_lp = self._share(p, slice(None), ids, logits, None, terms)
        return loss, terms[0], self._metrics(p, tok_lp, terms)

    def update(self, items: list[StreamItem], version: int) -> dict[str, float]:
        p = self._prepare(items)
        terms: list[OAPLTerms] = []

        def loss_fn(sl: slice, ids: torch.Tensor, logits: torch.Tensor,
                    normalizer: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
            loss, _ = self._share(p, sl, ids, logits, normalizer, terms)
            return loss, {"loss/value": float(loss.detach()), "loss/tokens": float(p.mask[sl].sum())}

        n = torch.tensor(float(len(items)), dtype=torch.float64)  # eq. 3 is a mean over sequences
        up = learner_step(self.student, self.optimizer, self.lr_scheduler, p.rows, self.cfg, loss_fn, window=None,
                          normalizer=n)
        return {"loss/total": up.loss} | up.optim_metrics() | self._metrics(p, up.logprobs, terms)

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy: the learner keeps training while workers load it."""
        return {k: v.detach().clone() for k, v in trained_state(self.student).items()}  # LoRA: the adapters


def _diagnostics(tok_lp: torch.Tensor, behavior: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor,
                 terms: OAPLTerms, reward: torch.Tensor) -> dict[str, float]:
    """Ratio and fit statistics, comparable with the IS learner's (``loss/is_ratio_*``, ``loss/teacher_kl``)."""
    keep = keep_mask(mask, tok_lp)  # (B, L)
    n = keep.float().sum().clamp_min(1.0)
    log_ratio = torch.where(keep, tok_lp - behavior, torch.zeros_like(tok_lp))  # (B, L) ln pi / pi_inf per token
    out = {f"loss/is_ratio_{k}": v for k, v in ratio_percentiles(log_ratio.exp(), keep).items()}
    out["loss/logprob_abs_diff"] = float(log_ratio.abs().sum() / n)
    kl = torch.where(keep, k1(tok_lp, torch.where(keep, teacher, tok_lp)), torch.zeros_like(tok_lp))
    out["loss/teacher_kl"] = float(kl.sum() / n)
    out["loss/tokens"] = float(n)
    out |= {"oapl/residual_rms": float(terms.residuals.pow(2).mean().sqrt()),
            "oapl/value_mean": float(terms.values.mean()),
            "oapl/advantage_abs_mean": float(terms.advantages.abs().mean()),
            "oapl/reward_mean": float(reward.mean()),
            "oapl/seq_log_ratio_mean": float(terms.log_ratios.mean()),
            "oapl/seq_log_ratio_abs_mean": float(terms.log_ratios.abs().mean())}
    return out
