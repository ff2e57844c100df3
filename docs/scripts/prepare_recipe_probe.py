"""Probe a cheaper SFT recipe for `adwin prepare` (docs/task.md, "Targets and measured numbers"): train a built-in task's
model with another step count, batch or model size and print, at each checkpoint, the T = 1 accuracy and
the teacher-forced phase skill on held-out problems. The steps up to --student are the student's (what
`chain-late` hides from them stays hidden); one line of JSON per checkpoint.

    python docs/scripts/prepare_recipe_probe.py --task chain --steps 1000 --warmup 25 --student 300 --checks 200,400
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

from adwin.tasks.phases import phase_accuracy
from adwin.tasks.sft import evaluate_accuracy, train_sft
from adwin.tasks.suite import TASK_NAMES, get_task
from adwin.tasks.tokenizer import build_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=TASK_NAMES, default="chain")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--student", type=int, default=600, help="the last step trained as the student's")
    ap.add_argument("--checks", default="", help="more checkpoints, comma-separated (the student and the end always)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--mlp", type=int, default=256)
    ap.add_argument("--problems", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    task, tok = get_task(a.task), build_tokenizer()
    spec = task.profile("default")  # the long tasks' models cover their horizon
    schedule = dataclasses.replace(spec.schedule, steps=a.steps, warmup=a.warmup, lr=a.lr, batch_size=a.batch)
    model = dataclasses.replace(spec.model, num_heads=a.heads, num_layers=a.layers,
                                intermediate_size=a.mlp).build(len(tok), tok, seed=0)
    evalset = task.problems(a.problems, seed=1, split="eval")
    checks = sorted({int(x) for x in a.checks.split(",") if x} | {a.student, a.steps})
    optimizer, previous, t0 = None, 0, time.perf_counter()
    for check in checks:
        optimizer, losses = train_sft(model, tok, schedule, seed=0, start_step=previous, stop_step=check,
                                      optimizer=optimizer, task=task, student_phase=check <= a.student,
                                      progress_desc=f"{previous}-{check}")
        previous, t_eval = check, time.perf_counter()
        accuracy = evaluate_accuracy(model, tok, evalset, spec.eval_max_new_tokens, temperature=1.0, seed=0, task=task)
        line = {"task": a.task, "steps": a.steps, "batch": a.batch, "heads": a.heads, "layers": a.layers,
                "mlp": a.mlp, "lr": a.lr, "step": check, "accuracy_t1": accuracy["accuracy"],
                "phases": phase_accuracy(model, tok, task, evalset), "loss": losses[-1],
                "train_s": round(t_eval - t0, 1), "eval_s": round(time.perf_counter() - t_eval, 1)}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        t0 = time.perf_counter()


if __name__ == "__main__":
    main()
