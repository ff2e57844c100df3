"""Transformers stages of the AsyncOPD pipeline: rollout snapshot, teacher scoring, MC reverse-KL learner.

- ``HFRolloutEngine`` (defined in ``engine``): a rollout worker's student snapshot, continuous batching on
  its KV cache, sampling the behavior distribution and the MC actions (AsyncOPD Appendix G).
- ``HFTeacherScorer``: teacher logprobs of the realized tokens (probe audits) and of the cached actions.
- ``HFLearner``: recomputes ``log p_theta`` of the cached actions under the current student and applies
  ``adwin.objectives.losses.reverse_kl_mc`` via ``opd_loss``: ``-(1/m) sum_i rho_i sg(A_theta(a_i))`` with
  ``A_theta = log q - log p_theta`` recomputed at learner time and unclipped old-to-current IS
  ``rho = p_theta / p_behavior`` (the config's ``is_method``/clip can override, off by default). The update is
  the one both schedulers share (``adwin.loop.learner``: micro-batches, memory options, clipping, the
  non-finite skip).

Probes are audited by the one probe client (``adwin.probes.client``): ``build_asyncopd`` gives the hooks' client
an ``InlineAuditor`` on the learner's student and the run's audit settings.

Learner batches are padded to the global maximum width (``max prompt + max_response_len``) when
``width`` is given, so the window caps generated tokens but never changes tensor shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from adwin.backends.logprob_gap import logprob_gap
from adwin.config import TrainConfig
from adwin.loop.learner import learner_step
from adwin.objectives.loss_table import ASYNCOPD_TOKEN_LOSSES as LEARNER_LOSSES
from adwin.objectives.losses import opd_loss
from adwin.sampling.rollout import Rows, layout, response_values
from adwin.student.lora import trained_state
from adwin.teacher.local import Teachers
from adwin.teacher.served import ServedTeachers
from adwin.trainer_adapters.asyncopd.engine import (
    HFRolloutEngine as HFRolloutEngine,  # run.py imports it here
)
from adwin.trainer_adapters.asyncopd.items import StreamItem


def item_rows(items: Sequence[StreamItem], pad_id: int, width: int | None) -> Rows:
    """Right-padded prompt+response rows, widened to ``width`` when given (B, L)."""
    return layout([it.prompt_ids for it in items], [it.tokens for it in items], pad_id, width=width)


def _per_action(items: Sequence[StreamItem], rows: Rows, field: str, fill: float) -> torch.Tensor:
    """(B, L, m) tensor of a per-token, per-action list field, aligned with ``input_ids``."""
    m = max((len(it.mc_actions[0]) for it in items if it.mc_actions), default=1)
    dtype = torch.long if field == "mc_actions" else torch.float32
    # an item without cached actions (m = 0, or a probe) keeps ``fill`` on its response columns
    vals = [getattr(it, field) or [[fill] * m] * it.response_len for it in items]
    return response_values(rows, vals, fill=fill, dtype=dtype, trailing=(m,))


def item_values(items: Sequence[StreamItem], rows: Rows, field: str) -> torch.Tensor:
    """(B, L) tensor of a per-token list field (behavior or teacher logprobs), aligned with ``input_ids``."""
    missing = next((it.request_id for it in items if getattr(it, field) is None), None)
    if missing is not None:
        raise ValueError(f"item {missing} has no {field}")
    return response_values(rows, [getattr(it, field) for it in items])


class McActionsNeedLocalTeacher(ValueError):
    """Items carry MC actions but the teacher is behind a server, which scores realized tokens only."""


class HFTeacherScorer:
    """Teacher logprobs of realized tokens and cached MC actions, one teacher pass per batch, through the one
    scoring path (``adwin.teacher.scoring``: the student's columns, no (B, L, V) log-softmax on the host).
    Without MC actions (``reverse_kl_pg``, OAPL, probes) only the realized tokens are scored, which a teacher
    server can answer too."""

    def __init__(self, teachers: Teachers | ServedTeachers, pad_id: int) -> None:
        self.teachers, self.pad_id = teachers, pad_id

    def score(self, items: list[StreamItem]) -> None:
        rows = item_rows(items, self.pad_id, None)
        routes = [it.route for it in items]
        mc = None
        if any(it.mc_actions for it in items):
            if not isinstance(self.teachers, Teachers):
                raise McActionsNeedLocalTeacher("the teacher logprobs of MC actions need an in-process teacher "
                                                "(model.teacher_backend: hf); a server scores realized tokens only")
            acts = _per_action(items, rows, "mc_actions", -1)  # (B, L, m)
            realized, mc = self.teachers.actions(rows.input_ids, rows.attention_mask, routes, acts)  # (B, L), (B, L, m)
        else:
            realized = self.teachers.score(rows.input_ids, rows.attention_mask, routes)  # (B, L)
        for b, it in enumerate(items):
            n_p, n = len(it.prompt_ids), it.response_len
            it.teacher_logprobs = realized[b, n_p : n_p + n].tolist()
            if mc is not None and it.mc_actions:
                it.teacher_mc_logprobs = mc[b, n_p : n_p + n].tolist()



class HFLearner:
    """One optimizer step of the OPD loss per call; see the module docstring. The step itself (micro-batches,
    memory options, clipping, the non-finite skip) is the synchronous trainer's (``adwin.loop.learner``).

    ``loss.name: reverse_kl_mc`` uses the cached MC actions; ``reverse_kl_pg`` is the same old-to-current IS
    estimator on the realized tokens only (one action per position, no MC cache).
    """

    def __init__(self, student: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                 cfg: TrainConfig, *, pad_id: int, width: int | None) -> None:
        if cfg.loss.name not in LEARNER_LOSSES:
            raise ValueError(f"the AsyncOPD learner supports {LEARNER_LOSSES}, got {cfg.loss.name!r}")
        self.student, self.optimizer, self.lr_scheduler, self.cfg = student, optimizer, lr_scheduler, cfg
        self.pad_id, self.width = pad_id, width
        self.shapes: list[tuple[int, int]] = []  # (B, L) of every update: fixed when width is given

    def update(self, items: list[StreamItem], version: int) -> dict[str, float]:
        lc = self.cfg.loss
        mc = lc.name == "reverse_kl_mc"
        if mc and any(not it.mc_actions or it.teacher_mc_logprobs is None for it in items):
            raise ValueError("every training item needs cached MC actions and their teacher logprobs")
        rows = item_rows(items, self.pad_id, self.width)
        self.shapes.append((len(items), rows.input_ids.shape[1]))
        realized = item_values(items, rows, "logprobs")  # (B, L) behavior logprobs of the realized tokens
        if mc:
            actions = _per_action(items, rows, "mc_actions", -1)  # (B, L, m)
            behavior = _per_action(items, rows, "mc_logprobs", 0.0)  # (B, L, m)
            teacher = _per_action(items, rows, "teacher_mc_logprobs", 0.0)  # (B, L, m)
        else:
            actions, behavior, teacher = None, realized, item_values(items, rows, "teacher_logprobs")  # (B, L) x2
        device = next(self.student.parameters()).device

        def loss_fn(sl: slice, ids: torch.Tensor, logits: torch.Tensor,
                    normalizer: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
            return opd_loss(lc.name, input_ids=ids, response_mask=rows.response_mask[sl].to(device),
                            student_logits=logits, teacher_logprobs=teacher[sl].to(device),
                            behavior_logprobs=behavior[sl].to(device),
                            action_ids=None if actions is None else actions[sl].to(device),
                            aggregation=lc.aggregation, is_method=lc.is_method, is_low=lc.is_low, is_high=lc.is_high,
                            clip_low=lc.clip_low, clip_high=lc.clip_high, normalizer=normalizer)

        up = learner_step(self.student, self.optimizer, self.lr_scheduler, rows, self.cfg, loss_fn, window=None,
                          behavior=behavior, actions=actions)
        out = {"loss/total": up.loss} | up.optim_metrics()
        out |= {k: float(v) for k, v in up.metrics.items() if k != "loss/value"}
        # |log p_theta - log p_behavior| of the realized tokens: staleness plus any rollout-engine mismatch
        out |= logprob_gap(up.logprobs, realized, rows.response_mask)
        return out

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy: the learner keeps training while workers load it."""
        return {k: v.detach().clone() for k, v in trained_state(self.student).items()}  # LoRA: the adapters
