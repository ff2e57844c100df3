"""An evaluation's per-row measures on the built-in tasks, in one call: how far each sampled response gets
(``lines_right``, ``closing_right``: :meth:`adwin.tasks.suite.BuiltinTask.score_lines`) and, when asked, the
teacher-forced line skill of its problem (``forced_lines``: :mod:`adwin.tasks.forced`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adwin.tasks.forced import binned, forced_lines, reads_characters
from adwin.tasks.suite import get_task

log = logging.getLogger(__name__)
_warned: set[str] = set()  # tasks warned about: one warning a process, not one per evaluation


@dataclass(frozen=True)
class Forcing:
    """What the teacher-forced score reads: the student, its tokenizer and pad id, the rows' prompt ids, where the
    rows start in the problem-major order (``first``; ``k`` rows per problem), the forward's batch size, and the
    window bins (``candidates`` up to ``horizon``)."""

    model: torch.nn.Module
    tokenizer: object
    prompt_ids: Sequence[Sequence[int]]
    first: int
    k: int
    pad_id: int
    batch_size: int
    candidates: Sequence[int]
    horizon: int


def score_rows(task_name: str, prompts: Sequence[str], texts: Sequence[str],
               forcing: Forcing | None = None) -> tuple[dict[str, list[float]], dict[int, tuple[float, float]]]:
    """Per measure, one value per row (keyed even without rows: data-parallel ranks sum alike); with ``forcing``
    also ``forced_lines`` (each row's share of lines right) and, per window bin keyed by its upper edge, (lines
    right, lines) summed over this rank's problems."""
    task = get_task(task_name)
    out: dict[str, list[float]] = {m: [] for m in task.line_measures}
    for prompt, text in zip(prompts, texts, strict=True):
        for measure, value in task.score_lines(prompt, text).measures().items():
            out[measure].append(value)
    if forcing is None:
        return out, {}
    f, k = forcing, forcing.k
    # rows first.. are problem-major: row r belongs to problem r // k, whose first row on this rank stands for it;
    # a problem's k rows share one reference, so each problem is scored once
    heads = [i for i in range(len(prompts)) if i == 0 or (f.first + i) // k != (f.first + i - 1) // k]
    if not reads_characters(f.tokenizer, task):  # a student of its own tokenizer on a built-in task
        if task.name not in _warned:
            _warned.add(task.name)
            log.warning("eval/forced_lines: not scored: teacher forcing scores a line character by character, and "
                        "the student's tokenizer is not character-level; eval.forced_lines: false leaves it out")
        return out, {}
    scored = forced_lines(f.model, f.tokenizer, task, [f.prompt_ids[i] for i in heads], [prompts[i] for i in heads],
                          pad_id=f.pad_id, batch_size=f.batch_size)
    of_problem = {(f.first + i) // k: s for i, s in zip(heads, scored, strict=True)}
    out["forced_lines"] = [of_problem[(f.first + i) // k].share for i in range(len(prompts))]
    bins = binned(scored, f.candidates, f.horizon)
    return out, {hi: (float(r), float(n)) for hi, (r, n) in bins.items()}
