"""Held-out evaluation: accuracy mean@k and teacher KL on student rollouts; on the built-in tasks also how far
each response gets (``eval/lines_right``, ``eval/closing_right``: :meth:`adwin.tasks.suite.BuiltinTask.score_lines`).

Data-parallel runs shard the evaluation rows (problem x sample) over the ranks and all-reduce the sums
(correct answers, line measures, KL, token and length counts), so every rank gets the same numbers; under
``rollout.seeding: per_sample`` they equal the 1-process evaluation's (each row's noise is its own).

``parts.eval_log``, when a list, receives each evaluation's per-row scores (:class:`EvalRows`): the paired
statistics of ``adwin bench compare`` and ``adwin bench curve`` are taken over problems.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from adwin.config import TrainConfig
from adwin.loop.distributed import LocalDist
from adwin.loop.parts import Parts
from adwin.loop.sampler import Sampler
from adwin.objectives.losses import token_logprobs
from adwin.sampling.rollout import layout
from adwin.student.fsdp import full_weights
from adwin.tasks.row_scores import Forcing, score_rows
from adwin.teacher.client import TeacherUnavailable

log = logging.getLogger(__name__)

# the logged key of each line measure (adwin.tasks.suite.LINE_MEASURES)
LINE_KEYS = {"lines_right": "eval/lines_right", "closing_right": "eval/closing_right",
             "forced_lines": "eval/forced_lines"}


@dataclass(frozen=True)
class EvalRows:
    """One evaluation's scores per row on this rank: rows ``first, first + 1, ...`` of the problem-major order
    (each held-out problem's ``k`` samples together). ``scores``: measure (``accuracy``, ``lines_right``,
    ``closing_right``) -> one value per row; a measure the task does not define is absent."""

    first: int
    k: int
    scores: dict[str, list[float]]

    def per_problem(self, measure: str) -> list[float]:
        """``measure`` per problem, the mean over its ``k`` samples (the rows must hold whole problems)."""
        rows = self.scores[measure]
        if self.first % self.k or len(rows) % self.k:
            raise ValueError(f"rows {self.first}..{self.first + len(rows)} do not hold whole problems of k={self.k}")
        return [float(np.mean(rows[i : i + self.k])) for i in range(0, len(rows), self.k)]


@torch.no_grad()
def evaluate(parts: Parts, cfg: TrainConfig, gen: Sampler, dist: LocalDist | None = None) -> dict[str, float]:
    """Accuracy mean@k on held-out problems and the teacher KL (k1 of KL(p || q)) on those rollouts.

    Samples from its own seeded RNG (``cfg.seed``), restoring the training RNG after: every evaluation of a
    run draws the same noise (initial and final are paired; with ``rollout.seeding: per_sample`` each row's
    noise comes from its own generator, keyed by the row), and training draws the same numbers whatever
    the evaluation schedule, so a run extended with ``--resume --steps`` (whose shorter first run evaluated
    at its last step) continues exactly as a straight run. A teacher server that does not answer leaves
    ``eval/teacher_kl`` NaN (the next step's scoring stops the run if it stays down).
    """
    with torch.random.fork_rng(), full_weights(parts.student):  # sharded: one gather for the whole evaluation
        torch.manual_seed(cfg.seed)
        return _evaluate(parts, cfg, gen, dist or LocalDist())


def _evaluate(parts: Parts, cfg: TrainConfig, gen: Sampler, dist: LocalDist) -> dict[str, float]:
    e = cfg.eval
    chunk = e.batch_size  # rows generated and scored together
    problems = [p for p in parts.eval_prompts[: e.n_problems] for _ in range(e.k)]
    mine = dist.shard(len(problems))
    problems, first = problems[mine], mine.start
    ctx, responses, order = gen.evaluation_rows(problems, first)
    texts = parts.tokenizer.batch_decode(responses, skip_special_tokens=True)
    correct = [parts.checker(txt, p.answer) for txt, p in zip(texts, problems, strict=True) if p.answer is not None]
    lines: dict[str, list[float]] = {}
    forced_bins: dict[str, tuple[float, float]] = {}
    if cfg.data.task == "builtin":
        forcing = Forcing(parts.student, parts.tokenizer, ctx, first, e.k, gen.pad, e.batch_size,
                          cfg.window.candidates, cfg.rollout.max_response_len) if e.forced_lines else None
        lines, bins = score_rows(cfg.data.builtin_task, [p.prompt for p in problems], texts, forcing)
        forced_bins = {f"eval/forced_lines@{hi}": pair for hi, pair in bins.items()}
    if parts.eval_log is not None:
        scores = {"accuracy": [float(c) for c in correct]} if len(correct) == len(problems) else {}
        parts.eval_log.append(EvalRows(first, e.k, scores | lines))
    lengths = [len(r) for r in responses]
    kl_sum, kl_tokens = 0.0, 0.0
    dev = next(parts.student.parameters()).device
    for i in range(0, len(order), chunk):
        idx = order[i : i + chunk]
        rows = layout([ctx[b] for b in idx], [responses[b] for b in idx], gen.pad)
        logits = parts.student(input_ids=rows.input_ids.to(dev), attention_mask=rows.attention_mask.to(dev)).logits
        s_lp = token_logprobs(logits, rows.input_ids.to(dev)).cpu()  # (b, L)
        try:
            t_lp = parts.teachers.score(rows.input_ids, rows.attention_mask, [problems[b].route for b in idx])  # (b, L)
        except TeacherUnavailable as e:  # telemetry only: the next step's scoring stops the run if it stays down
            log.warning("eval/teacher_kl: not measured (%s)", e)
            kl_sum = math.nan
            break
        mask = rows.response_mask.float()  # (b, L)
        kl_sum += float(((s_lp - t_lp) * mask).sum())
        kl_tokens += float(mask.sum())
    # (sum, count) per mean: summed over ranks in a data-parallel run
    means = {"eval/accuracy": (float(sum(correct)), float(len(correct)))} | {
        LINE_KEYS[m]: (float(sum(v)), float(len(v))) for m, v in lines.items()} | forced_bins
    if dist.world == 1:
        out = {"eval/teacher_kl": kl_sum / max(kl_tokens, 1.0), "eval/mean_len": float(np.mean(lengths))}
        return out | {k: total / n for k, (total, n) in means.items() if n}
    # every rank scores the same task, so every rank has the same measures, in the same order
    sums = torch.tensor([kl_sum, kl_tokens, float(sum(lengths)), float(len(lengths)),
                         *(x for pair in means.values() for x in pair)], dtype=torch.float64)
    kl_sum, kl_tokens, len_sum, n_rows, *pairs = dist.all_sum(sums).tolist()
    out = {"eval/teacher_kl": kl_sum / max(kl_tokens, 1.0), "eval/mean_len": len_sum / max(n_rows, 1.0)}
    return out | {k: pairs[2 * i] / pairs[2 * i + 1] for i, k in enumerate(means) if pairs[2 * i + 1]}

