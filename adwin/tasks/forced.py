"""Line skill under teacher forcing: which lines of the reference chain the student writes right when every line
above is the reference's.

``eval/lines_right`` counts the run of right lines of a sampled response from its start, so one early error hides
every later line: a student that is good at late positions but slips once early scores like one that is bad
everywhere. Teacher forcing separates the two. The student reads the prompt and the reference solution in one
forward pass; a chain line is right when its greedy next-token prediction matches every one of its characters
(its newline included). Because each line is computed from the line just above it, a line's score is the student's
skill at that position, whatever it wrote before.

The per-position scores answer whether training on a prefix of each rollout teaches the lines beyond it
(``adwin bench compare`` reports them per method: the share of lines right within each candidate window and beyond
the largest; docs/decisions.md, "The criterion's limits: teacher-forced line skill").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adwin.tasks.chain import parse_prompt, written_lines
from adwin.tasks.suite import BuiltinTask


class NotCharacterLevel(ValueError):
    """The tokenizer does not spell the reference one token per character: a line's tokens are not its own."""


@dataclass(frozen=True)
class ForcedLines:
    """One problem's chain lines under teacher forcing. ``right[k]``: line ``k`` predicted right, character for
    character; ``ends[k]``: the response-token offset just past line ``k`` (its newline included)."""

    right: tuple[bool, ...]
    ends: tuple[int, ...]

    @property
    def share(self) -> float:
        """The share of the chain's lines right (NaN for a problem without lines)."""
        return sum(self.right) / len(self.right) if self.right else float("nan")


def bin_edges(candidates: Sequence[int], horizon: int) -> list[tuple[int, int]]:
    """The position bins of :func:`binned`: ``(0, c1], (c1, c2], ..., (cK, horizon]`` over response tokens; the last
    also takes the lines a horizon shorter than the reference cuts off (every line beyond the largest window)."""
    cuts = sorted({int(c) for c in candidates if 0 < int(c) < horizon})
    edges = [0, *cuts, int(horizon)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def binned(rows: Sequence[ForcedLines], candidates: Sequence[int], horizon: int) -> dict[int, tuple[int, int]]:
    """Per bin (keyed by its upper edge): (lines right, lines) over ``rows``, a line counted in the bin its last
    token falls in. Sums, so data-parallel ranks add them before dividing."""
    out: dict[int, tuple[int, int]] = {}
    edges = bin_edges(candidates, horizon)
    for lo, hi in edges:
        top = hi if hi < edges[-1][1] else float("inf")
        right = total = 0
        for row in rows:
            for ok, end in zip(row.right, row.ends, strict=True):
                if lo < end <= top:
                    right += ok
                    total += 1
        out[hi] = (right, total)
    return out


def reference_lines(task: BuiltinTask, prompt: str) -> tuple[str, list[int]]:
    """The reference solution of ``prompt`` and the character offset just past each of its chain lines (the
    closing ``ans=`` line is not a chain line)."""
    problem = parse_prompt(prompt, task.kind)
    solution = task.solution(problem)
    ends, at = [], 0
    for line in written_lines(solution + "\n")[: problem.n]:
        at += len(line) + 1
        ends.append(at)
    return solution, ends


def reads_characters(tokenizer: object, task: BuiltinTask) -> bool:
    """Whether ``tokenizer`` spells the task's reference solutions one token per character (the built-in tokenizer
    does); read from one fixed reference, so every rank of a data-parallel run answers alike."""
    solution = task.solution(next(iter(task.iter_problems(0, "eval"))))
    return len(tokenizer(solution, add_special_tokens=False)["input_ids"]) == len(solution)  # type: ignore[operator]


@torch.no_grad()
def forced_lines(model: torch.nn.Module, tokenizer: object, task: BuiltinTask, prompt_ids: Sequence[Sequence[int]],
                 prompts: Sequence[str], *, pad_id: int, batch_size: int = 16) -> list[ForcedLines]:
    """:class:`ForcedLines` of each prompt: ``prompt_ids`` as the student reads them in evaluation, the reference
    response after them (the built-in tokenizer is character-level: a character is a token)."""
    from adwin.sampling.rollout import layout

    refs = [reference_lines(task, p) for p in prompts]
    responses = tokenizer([s for s, _ in refs], add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    for (solution, _), ids in zip(refs, responses, strict=True):
        if len(ids) != len(solution):
            raise NotCharacterLevel(f"teacher-forced line skill needs a character-level tokenizer (the built-in "
                                    f"task's); this one spells {len(solution)} characters in {len(ids)} tokens")
    dev = next(model.parameters()).device
    out: list[ForcedLines] = []
    for i in range(0, len(prompts), batch_size):
        ctx, resp = prompt_ids[i : i + batch_size], responses[i : i + batch_size]
        rows = layout(ctx, resp, pad_id)
        logits = model(input_ids=rows.input_ids.to(dev), attention_mask=rows.attention_mask.to(dev)).logits
        hit = (logits[:, :-1].argmax(-1).cpu() == rows.input_ids[:, 1:])  # (b, L-1): token t+1 predicted at t
        for b, (p, r) in enumerate(zip(ctx, resp, strict=True)):
            start = len(p) - 1  # the prediction of the response's first token sits at the prompt's last position
            ok = hit[b, start : start + len(r)]  # (len(r),)
            ends = refs[i + b][1]
            right, begin = [], 0
            for end in ends:
                right.append(bool(ok[begin:end].all()))
                begin = end
            out.append(ForcedLines(tuple(right), tuple(ends)))
    return out
