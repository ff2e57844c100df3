"""Builds the built-in task's assets: tokenizer, SFT of the shared teacher, early snapshot as the
student initialisation, and measurements (accuracy greedy and at T=1, response lengths, timings)."""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from adwin.tasks.calibrate import calibrate_teacher
from adwin.tasks.chain import ANSWER_PREFIX, ROUTES
from adwin.tasks.phases import PHASES, phase_accuracy
from adwin.tasks.profiles import PREPARE_THREADS, SFTSchedule
from adwin.tasks.sft import evaluate_accuracy, train_sft
from adwin.tasks.suite import DEFAULT_TASK, BuiltinTask, get_task
from adwin.tasks.tokenizer import save_tokenizer

logger = logging.getLogger(__name__)


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on every platform
        return []


def _accuracy(result: dict[str, float] | None) -> str:
    return "not measured" if result is None else f"{result['accuracy']:.3f}"


def reference_length_stats(
    tokenizer: Any, n: int = 2000, seed: int = 0, task: BuiltinTask | None = None
) -> dict[str, float]:
    """Token lengths (incl. <eos>) of the reference solutions of ``n`` held-out problems."""
    task = task or get_task(DEFAULT_TASK)
    lengths = [
        len(tokenizer(task.solution(p), add_special_tokens=False)["input_ids"]) + 1
        for p in task.problems(n, seed=seed, split="eval")
    ]
    return {
        "n": float(n),
        "median_response_tokens": float(statistics.median(lengths)),
        "mean_response_tokens": float(statistics.fmean(lengths)),
        "max_response_tokens": float(max(lengths)),
    }


def sft_recipe(builtin: BuiltinTask, profile: str, warm_from: Path | None) -> tuple[SFTSchedule, int]:
    """The SFT schedule and student snapshot step of a prepare: the profile's warm-start recipe when it starts
    from a prepared teacher (``warm_from``), else the profile's own."""
    spec = builtin.profile(profile)
    schedule, step = (spec.schedule, spec.student_step) if warm_from is None or spec.warm is None else (
        spec.warm.schedule, spec.warm.student_step)
    return schedule, builtin.student_step(step, schedule.steps)


def load_warm_start(model: torch.nn.Module, source: Path) -> None:
    """Copies a prepared model's weights into ``model``, a model of the same family (its position limit may
    differ: RoPE keeps no table of positions, so the weights are the same shapes)."""
    from transformers import AutoModelForCausalLM

    model.load_state_dict(AutoModelForCausalLM.from_pretrained(str(source)).state_dict())


def build_assets(root: Path, profile: str = "default", seed: int = 0, threads: int = PREPARE_THREADS,
                 task: str = DEFAULT_TASK, warm_from: Path | None = None,
                 teacher_from: Path | None = None) -> dict[str, Any]:
    """Writes tokenizer/, student/ and teacher/ into ``root``; returns the meta (``assets`` writes it, so this
    module needs nothing from ``assets`` and the two do not import each other).

    Runs on exactly ``threads`` intra-op threads, whatever the caller had set, and restores them after: the
    SFT weights depend on the thread count and on the CPU's instruction set (the kernels' float summation
    order; measured in docs/reliability.md), so ``adwin prepare`` and the lazy prepare inside ``adwin train``
    (which runs on 1 thread) must not differ in it.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _build(root, profile, seed, task, warm_from, teacher_from)
    finally:
        torch.set_num_threads(previous)


def _build(root: Path, profile: str, seed: int, task: str, warm_from: Path | None,
           teacher_from: Path | None = None) -> dict[str, Any]:
    builtin = get_task(task)
    spec = builtin.profile(profile)
    schedule, student_step = sft_recipe(builtin, profile, warm_from)
    start = time.perf_counter()
    load_start = _load()
    timings: dict[str, float] = {}

    t = time.perf_counter()
    tokenizer = save_tokenizer(root / "tokenizer", spec.model.max_positions)
    model = spec.model.build(len(tokenizer), tokenizer, seed=seed)
    if warm_from is not None:
        load_warm_start(model, warm_from)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "profile %s: %d-parameter Llama, %d SFT steps (student at %d) from %s",
        profile,
        n_params,
        schedule.steps,
        student_step,
        warm_from or "scratch",
    )
    timings["setup"] = time.perf_counter() - t

    eval_set = builtin.problems(spec.eval_problems, seed=seed + 1, split="eval")
    max_new = spec.eval_max_new_tokens

    def measure(tag: str) -> dict[str, dict[str, float] | None]:
        t0 = time.perf_counter()
        greedy = tag == "teacher" or spec.student_greedy_eval
        out = {
            "greedy": evaluate_accuracy(model, tokenizer, eval_set, max_new, temperature=0.0, seed=seed, task=builtin)
            if greedy else None,
            "t1": evaluate_accuracy(model, tokenizer, eval_set, max_new, temperature=1.0, seed=seed, task=builtin),
            # teacher-forced skill per response phase (first line / last line and answer)
            "phases": phase_accuracy(model, tokenizer, builtin, eval_set),
        }
        timings[f"eval_{tag}"] = time.perf_counter() - t0
        logger.info("%s accuracy: greedy %s, T=1 %.3f", tag, _accuracy(out["greedy"]), out["t1"]["accuracy"])
        return out

    t = time.perf_counter()
    optimizer, losses_a = train_sft(
        model, tokenizer, schedule, seed=seed, stop_step=student_step, progress_desc="sft (student)",
        task=builtin, student_phase=True,
    )
    timings["sft_student"] = time.perf_counter() - t
    model.save_pretrained(str(root / "student"))
    student_eval = measure("student")

    t = time.perf_counter()
    teacher_schedule = spec.warm.teacher_schedule if spec.warm is not None and teacher_from is not None else None
    if teacher_schedule is not None:  # the teacher's own run, from another task's teacher (WarmStart.teacher_source)
        model = spec.model.build(len(tokenizer), tokenizer, seed=seed)
        load_warm_start(model, teacher_from)
        _, losses_b = train_sft(model, tokenizer, teacher_schedule, seed=seed, progress_desc="sft (teacher)",
                                task=builtin)
    else:
        _, losses_b = train_sft(model, tokenizer, schedule, seed=seed, start_step=student_step, optimizer=optimizer,
                                progress_desc="sft (teacher)", task=builtin)
    timings["sft_teacher"] = time.perf_counter() - t
    calibration = None
    if spec.teacher_calibration:
        t = time.perf_counter()
        calibration = calibrate_teacher(model, tokenizer, builtin, spec.teacher_calibration, seed=seed + 2)
        timings["calibrate_teacher"] = time.perf_counter() - t
    model.save_pretrained(str(root / "teacher"))
    teacher_eval = measure("teacher")

    lengths = reference_length_stats(tokenizer, seed=seed, task=builtin)
    wall = time.perf_counter() - start
    losses = losses_a + losses_b
    measured = {
        "wall_seconds": wall,
        "teacher_accuracy_greedy": teacher_eval["greedy"]["accuracy"],
        "teacher_accuracy_t1": teacher_eval["t1"]["accuracy"],
        "student_accuracy_greedy": student_eval["greedy"]["accuracy"] if student_eval["greedy"] else None,
        "student_accuracy_t1": student_eval["t1"]["accuracy"],
        **{f"{who}_phase_{phase}": ev["phases"][phase] for who, ev in (("teacher", teacher_eval),
                                                                      ("student", student_eval)) for phase in PHASES},
        "median_response_tokens": lengths["median_response_tokens"],
        "max_response_tokens": lengths["max_response_tokens"],
    }
    targets = spec.targets
    checks = {
        "wall_seconds_max": wall <= targets["wall_seconds_max"],
        "teacher_accuracy_min": measured["teacher_accuracy_t1"] >= targets["teacher_accuracy_min"],
        "student_accuracy_max": measured["student_accuracy_t1"] <= targets["student_accuracy_max"],
        "median_response_tokens_min": lengths["median_response_tokens"]
        >= targets["median_response_tokens_min"],
        "max_response_tokens_min": lengths["max_response_tokens"] >= targets["max_response_tokens_min"],
    }
    meta: dict[str, Any] = {
        "task": task,
        "task_summary": builtin.summary,
        "profile": profile,
        "seed": seed,
        "routes": list(ROUTES),
        "teacher_dirs": {route: "teacher" for route in ROUTES},
        "shared_teacher": True,
        "format": {
            "answer_prefix": ANSWER_PREFIX,
            "line_chars": builtin.kind.line_chars(),
            "min_steps": builtin.min_steps,
            "max_steps": builtin.max_steps,
            "max_response_tokens": builtin.horizon,
            "default_candidates": list(builtin.candidates),
            "bos_prepended_by_tokenizer": True,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "vocab_size": len(tokenizer),
        },
        "model": {"architecture": "LlamaForCausalLM", "parameters": n_params, **asdict(spec.model)},
        "sft": {
            **asdict(schedule),
            "warm_from": str(warm_from) if warm_from is not None else None,
            "teacher_warm_from": str(teacher_from) if teacher_schedule is not None else None,
            "teacher_steps": teacher_schedule.steps if teacher_schedule is not None else None,
            # the teacher's own run's recipe (its closing_weight among it); None: the student's run went on
            "teacher_schedule": asdict(teacher_schedule) if teacher_schedule is not None else None,
            "student_step": student_step,
            "loss_first": losses[0] if losses else None,
            "loss_at_student": losses_a[-1] if losses_a else None,
            "loss_last": losses[-1] if losses else None,
        },
        "eval": {
            "problems": spec.eval_problems,
            "split": "eval",
            "seed": seed + 1,
            "teacher": teacher_eval,
            "student": student_eval,
        },
        "teacher_calibration": calibration,
        "reference_lengths": lengths,
        "measured": measured,
        "targets": targets,
        "targets_enforced": spec.enforce_targets,
        "targets_met": checks if spec.enforce_targets else None,
        "timings_seconds": timings,
        "environment": {
            "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # AVX2 / AVX512: the weights depend on it
            "cpu_count": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": _load(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "created_unix": time.time(),
    }
    return meta
