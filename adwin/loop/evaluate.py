"""Held-out evaluation: accuracy mean@k and teacher KL on student rollouts."""

from __future__ import annotations

import logging

import numpy as np
import torch

from adwin.config import TrainConfig
from adwin.loop.parts import Parts
from adwin.loop.sampler import Sampler
from adwin.objectives.losses import token_logprobs

log = logging.getLogger(__name__)

@torch.no_grad()
def evaluate(parts: Parts, cfg: TrainConfig, gen: Sampler, chunk: int = 64) -> dict[str, float]:
    """Accuracy mean@k on held-out problems and the teacher KL (k1 of KL(p || q)) on those rollouts.

    Samples from its own seeded RNG (``cfg.seed``), restoring the training RNG after: every evaluation of a
    run draws the same noise (initial and final are paired), and training draws the same numbers whatever
    the evaluation schedule, so a run extended with ``--resume --steps`` (whose shorter first run evaluated
    at its last step) continues exactly as a straight run.
    """
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        return _evaluate(parts, cfg, gen, chunk)


def _evaluate(parts: Parts, cfg: TrainConfig, gen: Sampler, chunk: int) -> dict[str, float]:
    e = cfg.eval
    problems = [p for p in parts.eval_prompts[: e.n_problems] for _ in range(e.k)]
    correct, kl_sum, kl_tokens, lengths = [], 0.0, 0.0, []
    for i in range(0, len(problems), chunk):
        part = problems[i : i + chunk]
        g = gen.roll_out(part, 1, cfg.rollout.max_response_len, evaluation=True)
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
    out = {"eval/teacher_kl": kl_sum / max(kl_tokens, 1.0), "eval/mean_len": float(np.mean(lengths))}
    if correct:
        out["eval/accuracy"] = float(np.mean(correct))
    return out

