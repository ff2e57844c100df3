"""Supervised fine-tuning and accuracy evaluation of the built-in task's tiny models (CPU-friendly).

The models are small Llama decoders built from a config in code (nothing comes from a hub). SFT
minimises next-token cross-entropy on the response tokens only (prompt and padding masked).
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from adwin.tasks.chain import Problem, check_answer
from adwin.tasks.profiles import SFTSchedule
from adwin.tasks.suite import DEFAULT_TASK, BuiltinTask, get_task

logger = logging.getLogger(__name__)


def encode_example(
    tokenizer: PreTrainedTokenizerBase,
    problem: Problem,
    rng: random.Random | None = None,
    noise_line_rate: float = 0.0,
    task: BuiltinTask | None = None,
    student_phase: bool = False,
) -> tuple[list[int], list[int]]:
    """Token ids of <bos> prompt response <eos>, and the labels (-100 on the prompt, on planted
    mistakes, see :mod:`adwin.tasks.noise`, and on what ``task`` hides from the student phase)."""
    return encode_examples(tokenizer, [problem], rng, noise_line_rate, task, student_phase)[0]


def encode_examples(
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    rng: random.Random | None = None,
    noise_line_rate: float = 0.0,
    task: BuiltinTask | None = None,
    student_phase: bool = False,
) -> list[tuple[list[int], list[int]]]:
    """:func:`encode_example` of every problem, writing them in order from one ``rng`` (so the same
    mistakes are planted as one call per problem would) and tokenizing in two batched calls: one call
    per text cost half of a prepare's data preparation."""
    if not problems:  # a tokenizer's batched call fails on an empty list
        return []
    task = task or get_task(DEFAULT_TASK)
    rng = rng or random.Random(0)
    written = [task.write(p, rng, noise_line_rate, student_phase) for p in problems]
    prompts = tokenizer([p.prompt for p in problems])["input_ids"]
    responses = tokenizer([text for text, _ in written], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    out = []
    for prompt_ids, response_ids, (text, trained) in zip(prompts, responses, written, strict=True):
        # a writer may flag the EOS itself (one flag more than characters); else it follows the last character
        eos_trained = trained[len(text)] if len(trained) > len(text) else trained[-1]
        trained = trained[: len(text)]
        if len(response_ids) != len(trained):
            raise ValueError("the built-in task's tokenizer must be character-level")
        ids = prompt_ids + response_ids + [eos]
        labels = [-100] * len(prompt_ids) + [t if ok else -100 for t, ok in zip(response_ids, trained, strict=True)]
        out.append((ids, labels + [eos if eos_trained else -100]))
    return out


def make_batches(
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    batch_size: int,
    seed: int,
    noise_line_rate: float = 0.0,
    task: BuiltinTask | None = None,
    student_phase: bool = False,
    group_batches: int | None = 8,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(input_ids, attention_mask, labels) batches, each (B, T). Examples are grouped by length within
    chunks of ``group_batches`` batches (None: all of them, so a batch holds chains of one length class
    and a step costs about its own tokens) so that padding wastes little compute, then the batch order
    is shuffled. Every example lands in exactly one batch."""
    noise_rng = random.Random(f"adwin-noise:{seed}")
    encoded = encode_examples(tokenizer, problems, noise_rng, noise_line_rate, task, student_phase)
    rng = random.Random(seed)
    chunk = max(1, len(encoded)) if group_batches is None else batch_size * group_batches
    batches = []
    for start in range(0, len(encoded), chunk):
        group = sorted(encoded[start : start + chunk], key=lambda e: len(e[0]))
        for b in range(0, len(group), batch_size):
            part = group[b : b + batch_size]
            width = max(len(ids) for ids, _ in part)
            input_ids = np.full((len(part), width), tokenizer.pad_token_id, dtype=np.int64)  # (B, T)
            mask = np.zeros((len(part), width), dtype=np.int64)  # (B, T)
            labels = np.full((len(part), width), -100, dtype=np.int64)  # (B, T)
            for i, (ids, example_labels) in enumerate(part):
                input_ids[i, : len(ids)] = ids
                mask[i, : len(ids)] = 1
                labels[i, : len(ids)] = example_labels
            input_ids, mask, labels = (torch.from_numpy(a) for a in (input_ids, mask, labels))
            batches.append((input_ids, mask, labels))
    rng.shuffle(batches)
    return batches


def closing_mask(input_ids: torch.Tensor, prefix_ids: list[int]) -> torch.Tensor:
    """(B, T) bool: the positions from each row's first occurrence of ``prefix_ids`` on (all False in a row
    without one)."""
    k = len(prefix_ids)
    if input_ids.size(1) < k:
        return torch.zeros_like(input_ids, dtype=torch.bool)
    windows = input_ids.unfold(1, k, 1)  # (B, T-k+1, k)
    hit = (windows == torch.tensor(prefix_ids, dtype=input_ids.dtype)).all(-1)  # (B, T-k+1)
    hit = torch.nn.functional.pad(hit, (0, k - 1))  # (B, T)
    return hit.long().cumsum(1) > 0


def weighted_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, closing: torch.Tensor, weight: float
) -> torch.Tensor:
    """Next-token cross-entropy over the labelled targets, the targets inside ``closing`` weighing
    ``weight`` and the others 1: ``sum(w * ce) / sum(w)``, the plain mean (the Llama loss) at weight 1.
    logits (B, T, V); labels and closing (B, T), both aligned with the input ids."""
    logits, target = logits[:, :-1].float(), labels[:, 1:]  # (B, T-1, V), (B, T-1)
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100, reduction="none"
    ).view_as(target)  # (B, T-1)
    w = torch.where(closing[:, 1:], weight, 1.0) * (target != -100)  # (B, T-1)
    return (ce * w).sum() / w.sum()


def train_sft(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    schedule: SFTSchedule,
    seed: int,
    start_step: int = 0,
    stop_step: int | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    on_step: Callable[[int, float], None] | None = None,
    progress_desc: str = "sft",
    routes: tuple[str, ...] | None = None,
    task: BuiltinTask | None = None,
    student_phase: bool = False,
) -> tuple[torch.optim.Optimizer, list[float]]:
    """Runs SFT steps ``start_step .. stop_step - 1`` of ``schedule`` (default: to the end), so
    training can pause for a snapshot and resume with the same optimizer, learning-rate schedule and
    problem stream (a segment trains on problems start*B .. stop*B - 1 of the seed's stream, grouped
    by length within the segment). ``routes`` restricts training to some sub-tasks. ``task`` writes
    the solutions (default ``chain``); its planted-mistake rate, when set, replaces the schedule's;
    ``student_phase`` marks the steps before the student snapshot. ``schedule.closing_weight`` other than 1
    weights the targets from the task's ``closing_prefix`` on (:func:`weighted_lm_loss`).
    Returns the optimizer and the step losses."""
    from tqdm.auto import tqdm

    stop_step = schedule.steps if stop_step is None else stop_step
    n_steps = stop_step - start_step
    task = task or get_task(DEFAULT_TASK)
    prefix_ids: list[int] = []
    if schedule.closing_weight != 1.0:
        if task.closing_prefix is None:  # the weight would weigh nothing: refuse rather than train unweighted
            raise ValueError(f"SFTSchedule.closing_weight={schedule.closing_weight} needs a task with a closing "
                             f"phase (BuiltinTask.closing_prefix); {task.name!r} has none: set it to 1")
        prefix_ids = tokenizer(task.closing_prefix, add_special_tokens=False)["input_ids"]
    problems = task.sft_problems(schedule.steps * schedule.batch_size * 2, seed=seed)
    if routes is not None:
        problems = [p for p in problems if p.route in routes]
    problems = problems[start_step * schedule.batch_size : stop_step * schedule.batch_size]
    line_rate = schedule.noise_line_rate if task.noise_line_rate is None else task.noise_line_rate
    batches = make_batches(
        tokenizer, problems, schedule.batch_size, seed=seed + start_step, noise_line_rate=line_rate, task=task,
        student_phase=student_phase, group_batches=None if task.sft_group_all else 8,
    )
    if optimizer is None:
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=schedule.lr, betas=(0.9, 0.98), weight_decay=schedule.weight_decay
        )
    model.train()
    losses: list[float] = []
    bar = tqdm(total=n_steps, desc=progress_desc, unit="step", leave=False)
    for i, (input_ids, mask, labels) in enumerate(batches[:n_steps]):
        step = start_step + i
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(step)
        # Right padding under a causal mask: no real token ever attends to a pad, so no attention
        # mask is needed and SDPA takes its fast causal path. Pads are masked out of the loss.
        del mask
        if prefix_ids:
            closing = closing_mask(input_ids, prefix_ids)  # (B, T)
            loss = weighted_lm_loss(model(input_ids=input_ids).logits, labels, closing, schedule.closing_weight)
        else:
            loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        bar.update(1)
        if on_step is not None:
            on_step(step, losses[-1])
    bar.close()
    model.eval()
    return optimizer, losses


@torch.no_grad()
def generate_responses(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int = 256,
) -> list[str]:
    """Responses (decoded, special tokens dropped), sampled by the evaluation's sampler, which drops a
    row from the batch once it stopped (:func:`adwin.sampling.compact.generate_compacting`): a batch
    of students that ramble to the horizon beside ones that stop early costs what its live rows cost."""
    from adwin.sampling.compact import generate_compacting

    model.eval()
    torch.manual_seed(seed)
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        gen = generate_compacting(model, encoded[start : start + batch_size], max_new_tokens,
                                  eos={tokenizer.eos_token_id}, pad_id=tokenizer.pad_token_id, temperature=temperature)
        out += [tokenizer.decode(ids, skip_special_tokens=True) for ids in gen.response_ids]
    return out


def evaluate_accuracy(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    task: BuiltinTask | None = None,
) -> dict[str, float]:
    """Accuracy overall and per route, plus response length statistics (tokens incl. EOS)."""
    answer = (task or get_task(DEFAULT_TASK)).answer
    start = time.perf_counter()
    responses = generate_responses(
        model, tokenizer, [p.prompt for p in problems], max_new_tokens, temperature, seed
    )
    correct = [check_answer(r, answer(p)) for r, p in zip(responses, problems, strict=True)]
    # tokens incl. <eos>; a response cut at max_new_tokens had no <eos> to count
    lengths = [
        min(len(tokenizer(r, add_special_tokens=False)["input_ids"]) + 1, max_new_tokens) for r in responses
    ]
    result: dict[str, float] = {
        "accuracy": sum(correct) / max(1, len(correct)),
        "n": float(len(problems)),
        "median_response_tokens": float(statistics.median(lengths)) if lengths else 0.0,
        "max_response_tokens": float(max(lengths)) if lengths else 0.0,
        "seconds": time.perf_counter() - start,
    }
    for route in sorted({p.route for p in problems}):
        hits = [c for c, p in zip(correct, problems, strict=True) if p.route == route]
        result[f"accuracy_{route}"] = sum(hits) / len(hits)
    return result
