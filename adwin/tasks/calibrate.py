"""The teacher's logit scale, fit by likelihood (temperature scaling) on training problems.

At length a tiny teacher's argmax is right almost everywhere while its probabilities stay soft: ``chain-long``'s
teacher has about one wrong argmax in 10,000 reference tokens, yet the product of ~1,300 reference-token probabilities
is ~0.6, so a T = 1 rollout goes wrong somewhere on a third of the problems. One scalar ``s`` on the logits,
chosen to minimise the reference tokens' negative log-likelihood (the maximum-likelihood temperature ``1 / s``),
makes the model's probabilities as sharp as its errors warrant and no sharper: wrong argmaxes pull ``s`` down.
It is fitted on the train split, never on the held-out problems the prepare measures.

The scale goes into the checkpoint as the final RMSNorm's weight (the logits are linear in it, with tied
embeddings too), so the teacher stays a plain Llama whose T = 1 is the calibrated distribution everywhere it is
loaded (``adwin train``, the suite, a user's own loop).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from scipy.optimize import minimize_scalar

from adwin.tasks.phases import teacher_forced
from adwin.tasks.suite import BuiltinTask

logger = logging.getLogger(__name__)

# the search interval of the scale: 0.25 softens 4x, 20 is as good as greedy for these vocabularies
SCALE_BOUNDS = (0.25, 20.0)


@torch.no_grad()
def reference_logits(model: torch.nn.Module, tokenizer: Any, task: BuiltinTask, n: int, seed: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits at every reference-response position (EOS included) of ``n`` train-split problems, and the
    reference tokens: (N, V) float32 and (N,)."""
    model.eval()
    logits, targets = [], []
    for problem in task.problems(n, seed=seed, split="train"):
        out, target = teacher_forced(model, tokenizer, problem.prompt, task.solution(problem), eos=True)  # (R, V), (R,)
        logits.append(out.float())
        targets.append(target)
    return torch.cat(logits), torch.cat(targets)


def fit_logit_scale(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """The scale ``s`` minimising the mean NLL of ``targets`` under ``softmax(s * logits)``; the NLL is convex in
    ``s``, so a bounded scalar search finds its minimum. ``logits`` (N, V), ``targets`` (N,)."""

    def nll(s: float) -> float:
        return float(torch.nn.functional.cross_entropy(s * logits, targets))

    res = minimize_scalar(nll, bounds=SCALE_BOUNDS, method="bounded")
    return {"scale": float(res.x), "nll_before": nll(1.0), "nll_after": float(res.fun), "tokens": float(len(targets)),
            "argmax_error": float((logits.argmax(-1) != targets).float().mean())}


def apply_logit_scale(model: torch.nn.Module, scale: float) -> None:
    """Multiply every logit of ``model`` (a Llama) by ``scale``, through its final RMSNorm's weight."""
    with torch.no_grad():
        model.get_decoder().norm.weight.mul_(scale)


def calibrate_teacher(model: torch.nn.Module, tokenizer: Any, task: BuiltinTask, n: int, seed: int
                      ) -> dict[str, float]:
    """Fit the teacher's logit scale on ``n`` train-split problems and put it into ``model``; the fit's record."""
    fit = fit_logit_scale(*reference_logits(model, tokenizer, task, n, seed))
    apply_logit_scale(model, fit["scale"])
    logger.info("teacher logit scale %.3f (reference NLL per token %.2e -> %.2e on %d tokens)", fit["scale"],
                fit["nll_before"], fit["nll_after"], int(fit["tokens"]))
    return {**fit, "problems": float(n), "seed": float(seed)}
