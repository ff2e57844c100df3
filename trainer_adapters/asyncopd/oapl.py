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
from typing import Any

import torch

from adwin.backends.logprob_gap import logprob_gap
from adwin.config import OAPLSection
from adwin.objectives.losses import k1, keep_mask, ratio_percentiles, token_logprobs
from adwin.objectives.oapl import OAPLTerms, oapl_loss, sequence_logprob, teacher_return
from adwin.student.lora import trained_state
from adwin.trainer_adapters.asyncopd.groups import group_version
from adwin.trainer_adapters.asyncopd.hf import clip_and_step, item_rows, item_values
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


class OAPLLearner:
    """One optimizer step of eq. 3 per call; see the module docstring. ``checker(text, answer)`` and
    ``decode(token_ids)`` are needed only when the reward uses the task."""

    def __init__(self, student: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any, *,
                 pad_id: int, width: int | None, options: OAPLSection, grad_clip: float = 1.0,
                 checker: Callable[[str, str], bool] | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self.uses_task = options.reward == "task" or (options.reward == "weighted" and options.task_weight > 0)
        if self.uses_task and (checker is None or decode is None):
            raise ValueError("loss.oapl.reward uses the task: the learner needs the task's checker and a decoder")
        self.student, self.optimizer, self.lr_scheduler = student, optimizer, lr_scheduler
        self.pad_id, self.width, self.options, self.grad_clip = pad_id, width, options, grad_clip
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

    def loss(self, items: Sequence[StreamItem]) -> tuple[torch.Tensor, OAPLTerms, dict[str, float]]:
        """Eq. 3 on ``items`` under the live student, with gradients; no optimizer step."""
        groups = check_groups(items)
        rows = item_rows(items, self.pad_id, self.width)
        self.shapes.append(tuple(rows.input_ids.shape))  # type: ignore[arg-type]
        device = next(self.student.parameters()).device
        ids = rows.input_ids.to(device)
        mask = rows.response_mask.float().to(device)  # (B, L): the trained window is the whole response
        behavior = item_values(items, rows, "logprobs").to(device)  # (B, L) ln pi_inf per token
        teacher = item_values(items, rows, "teacher_logprobs").to(device)  # (B, L)
        logits = self.student(input_ids=ids, attention_mask=rows.attention_mask.to(device)).logits  # (B, L, V)
        tok_lp = token_logprobs(logits, ids)  # (B, L)
        seq_lp = sequence_logprob(tok_lp, mask)  # (B,)
        inf_lp = sequence_logprob(behavior, mask)  # (B,)
        reward, metrics = self.rewards(items, teacher_return(teacher, behavior, mask).detach())
        gid = torch.tensor([it.group for it in items], device=device)
        o = self.options
        loss, terms = oapl_loss(seq_lp, inf_lp, reward, gid, beta=o.beta, value_beta=o.value_beta)
        metrics |= _diagnostics(tok_lp.detach(), behavior, teacher, mask, terms, reward)
        metrics |= {"oapl/groups": float(len(groups)), "oapl/group_size_mean": len(items) / len(groups)}
        # |log p_theta - log p_behavior| of the realized tokens: the lag plus any rollout-engine mismatch
        metrics |= logprob_gap(tok_lp.detach().cpu(), behavior.cpu(), rows.response_mask)
        return loss, terms, metrics

    def update(self, items: list[StreamItem], version: int) -> dict[str, float]:
        self.student.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss, _, metrics = self.loss(items)
        loss.backward()
        grad_norm = clip_and_step(self.student, self.optimizer, self.lr_scheduler, self.grad_clip)
        return {"loss/total": float(loss.detach()), "optim/grad_norm": grad_norm} | metrics

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
