"""Held-out evaluation: accuracy mean@k and teacher KL on student rollouts.

Data-parallel runs shard the evaluation rows (problem x sample) over the ranks and all-reduce the sums
(correct answers, KL, token and length counts), so every rank gets the same numbers; under
``rollout.seeding: per_sample`` they equal the 1-process evaluation's (each row's noise is its own).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from adwin.config import TrainConfig
from adwin.loop.distributed import LocalDist
from adwin.loop.parts import Parts
from adwin.loop.sampler import Sampler
from adwin.loop.sharding import seeds_for
from adwin.objectives.losses import token_logprobs

log = logging.getLogger(__name__)

@torch.no_grad()
def evaluate(parts: Parts, cfg: TrainConfig, gen: Sampler, chunk: int = 64,
             dist: LocalDist | None = None) -> dict[str, float]:
    """Accuracy mean@k on held-out problems and the teacher KL (k1 of KL(p || q)) on those rollouts.

    Samples from its own seeded RNG (``cfg.seed``), restoring the training RNG after: every evaluation of a
    run draws the same noise (initial and final are paired; with ``rollout.seeding: per_sample`` each row's
    noise comes from its own generator, keyed by the row), and training draws the same numbers whatever
    the evaluation schedule, so a run extended with ``--resume --steps`` (whose shorter first run evaluated
    at its last step) continues exactly as a straight run.
    """
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        return _evaluate(parts, cfg, gen, chunk, dist or LocalDist())


def _evaluate(parts: Parts, cfg: TrainConfig, gen: Sampler, chunk: int, dist: LocalDist) -> dict[str, float]:
    e = cfg.eval
    problems = [p for p in parts.eval_prompts[: e.n_problems] for _ in range(e.k)]
    mine = dist.shard(len(problems))
    problems, first = problems[mine], mine.start
    correct, kl_sum, kl_tokens, lengths = [], 0.0, 0.0, []
    for i in range(0, len(problems), chunk):
        part = problems[i : i + chunk]
        seeds = seeds_for(cfg, "eval", 0, range(first + i, first + i + len(part)))
        g = gen.roll_out(part, 1, cfg.rollout.max_response_len, evaluation=True, seeds=seeds)
        texts = parts.tokenizer.batch_decode(g.response_ids, skip_special_tokens=True)
        correct += [parts.checker(txt, p.answer) for txt, p in zip(texts, part, strict=True) if p.answer is not None]
        rows = g.rows
        dev = next(parts.student.parameters()).device
        logits = parts.student(input_ids=rows.input_ids.to(dev), attention_mask=rows.attention_mask.to(dev)).logits
        s_lp = token_logprobs(logits, rows.input_ids.to(dev)).cpu()  # (b, L)
        t_lp = parts.teachers.score(rows.input_ids, rows.attention_mask, [p.route for p in part])  # (b, L)
        mask = rows.response_mask.float()
        kl_sum += float(((s_lp - t_lp) * mask).sum())
        kl_tokens += float(mask.sum())
        lengths += [len(r) for r in g.response_ids]
    if dist.world == 1:
        out = {"eval/teacher_kl": kl_sum / max(kl_tokens, 1.0), "eval/mean_len": float(np.mean(lengths))}
        if correct:
            out["eval/accuracy"] = float(np.mean(correct))
        return out
    sums = torch.tensor([kl_sum, kl_tokens, float(sum(lengths)), float(len(lengths)), float(sum(correct)),
                         float(len(correct))], dtype=torch.float64)
    kl_sum, kl_tokens, len_sum, n_rows, n_correct, n_checked = dist.all_sum(sums).tolist()
    out = {"eval/teacher_kl": kl_sum / max(kl_tokens, 1.0), "eval/mean_len": len_sum / max(n_rows, 1.0)}
    if n_checked:
        out["eval/accuracy"] = n_correct / n_checked
    return out

