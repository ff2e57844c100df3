"""The SFT run of `adwin prepare --task NAME` (default profile, seed 0: the same batches, optimizer and
snapshot as adwin/tasks/build.py) with the teacher-forced phase skill measured at more steps on the way,
and the prepare's own measurements (greedy and T = 1 accuracy, phase skill) at the student snapshot and at
the end. Like the prepare, the run starts from the warm-start source's cached teacher when there is one
(`adwin prepare --task chain` first), else from scratch. Training is untouched by the checks (no dropout, the batches are drawn beforehand), so the
student and teacher are the prepare's. One line of JSON per measurement (docs/task.md, the long tasks).

    python docs/scripts/prepare_curve.py --task chain-long --checks 60,120,240,300,360,420,480,540
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

from adwin.tasks.assets import warm_source
from adwin.tasks.build import load_warm_start, sft_recipe
from adwin.tasks.phases import phase_accuracy
from adwin.tasks.profiles import PREPARE_THREADS
from adwin.tasks.sft import evaluate_accuracy, train_sft
from adwin.tasks.suite import TASK_NAMES, get_task
from adwin.tasks.tokenizer import build_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=TASK_NAMES, default="chain-long")
    ap.add_argument("--checks", default="", help="steps at which to measure the phase skill, comma-separated")
    ap.add_argument("--threads", type=int, default=PREPARE_THREADS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    task, tok, seed = get_task(a.task), build_tokenizer(), 0
    spec = task.profile("default")
    model = spec.model.build(len(tok), tok, seed=seed)
    warm_from = warm_source(None, "default", seed, a.task)
    if warm_from is not None:
        load_warm_start(model, warm_from)
    schedule, student = sft_recipe(task, "default", warm_from)
    eval_set = task.problems(spec.eval_problems, seed=seed + 1, split="eval")
    checks = {int(x) for x in a.checks.split(",") if x}
    step_seconds: list[float] = []
    last = [time.perf_counter()]

    def log(record: dict[str, Any]) -> None:
        record |= {"task": a.task, "load": [round(x, 2) for x in os.getloadavg()], "utc": time.strftime("%H:%M:%S")}
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    def on_step(step: int, loss: float) -> None:
        step_seconds.append(time.perf_counter() - last[0])
        if step + 1 in checks:
            t = time.perf_counter()
            phases = phase_accuracy(model, tok, task, eval_set)
            log({"step": step + 1, "loss": loss, "phases": phases, "mean_step_s": sum(step_seconds) / len(step_seconds),
                 "eval_s": time.perf_counter() - t})
            step_seconds.clear()
            model.train()
        last[0] = time.perf_counter()

    def measure(tag: str, step: int) -> None:
        t = time.perf_counter()
        record: dict[str, Any] = {"step": step, "tag": tag}
        for temperature in (1.0, 0.0):
            r = evaluate_accuracy(model, tok, eval_set, spec.eval_max_new_tokens, temperature=temperature, seed=seed,
                                  task=task)
            record[f"T{temperature}"] = {k: r[k] for k in ("accuracy", "median_response_tokens",
                                                            "max_response_tokens", "seconds")}
        record["phases"] = phase_accuracy(model, tok, task, eval_set)
        record["eval_s"] = time.perf_counter() - t
        log(record)
        step_seconds.clear()  # the step times exclude the measurements
        last[0] = time.perf_counter()
        model.train()

    log({"warm_from": str(warm_from) if warm_from else None, "steps": schedule.steps, "student_step": student})
    t0 = time.perf_counter()
    optimizer, _ = train_sft(model, tok, schedule, seed=seed, stop_step=student, task=task, student_phase=True,
                             on_step=on_step, progress_desc="sft (student)")
    log({"sft_student_s": time.perf_counter() - t0})
    measure("student", student)
    t0 = time.perf_counter()
    train_sft(model, tok, schedule, seed=seed, start_step=student, optimizer=optimizer, task=task, on_step=on_step,
              progress_desc="sft (teacher)")
    log({"sft_teacher_s": time.perf_counter() - t0})
    measure("teacher", schedule.steps)


if __name__ == "__main__":
    main()
