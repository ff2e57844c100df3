"""Per-phase skill of a model on a built-in task, measured under teacher forcing on reference solutions.

* ``early``: the response's first line (13 characters): two table look-ups on prompt values.
* ``late``: the response's last line and the answer (``01:...\\nans=d`` for ``chain``,
  ``fin:A+B=S\\nans=S`` for ``chain-late``).

A problem counts as solved in a phase when the model's argmax equals every reference character of
that phase, given the reference prefix. Teacher forcing separates the skills: a rollout that fails
early never reaches the late phase, so sampled accuracy cannot tell "weak late" from "derailed early".
"""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from adwin.tasks.chain import Problem
from adwin.tasks.suite import BuiltinTask

PHASES = ("early", "late")


def phase_spans(response: str) -> dict[str, tuple[int, int]]:
    """Character spans [start, end) of each phase in a reference response (without EOS)."""
    lines = response.split("\n")
    first_end = len(lines[0]) + 1
    late_start = len(response) - len(lines[-1]) - len(lines[-2]) - 1
    return {"early": (0, first_end), "late": (late_start, len(response))}


@torch.no_grad()
def teacher_forced(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompt: str, response: str,
                   eos: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits that predict each token of ``response`` given ``prompt`` and the response before it, and those
    tokens: (R, V) and (R,); with ``eos`` the EOS after the response is one more token."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    if eos:
        response_ids = [*response_ids, tokenizer.eos_token_id]
    logits = model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0]  # (P + R, V)
    # the prediction of response token j sits at position P + j - 1
    return logits[len(prompt_ids) - 1 : -1], torch.tensor(response_ids)


@torch.no_grad()
def phase_accuracy(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    task: BuiltinTask,
    problems: list[Problem],
) -> dict[str, float]:
    """Fraction of ``problems`` whose every reference character of a phase is the model's argmax."""
    model.eval()
    hits = dict.fromkeys(PHASES, 0)
    for problem in problems:
        response = task.solution(problem)
        logits, target = teacher_forced(model, tokenizer, problem.prompt, response)  # (R, V), (R,)
        pred = logits.argmax(-1)  # (R,)
        for phase, (lo, hi) in phase_spans(response).items():
            hits[phase] += int(bool((pred[lo:hi] == target[lo:hi]).all()))
    n = max(1, len(problems))
    return {phase: hits[phase] / n for phase in PHASES}
