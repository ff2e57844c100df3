"""Levers for ``chain-late-long``'s teacher at T = 1 (docs/task.md, "What was measured" of the long tasks).

``train``: the teacher's own run as the prepare does it (a fresh model with ``chain-late``'s cached prepared
teacher loaded, the task's SFT stream, batch 16, 20 warm-up steps, 5 % planted mistakes, seed 0), with one
lever changed, then saved and measured on the prepare's 64 held-out problems:

* ``--closing-weight W``: the closing line's tokens (from ``fin:`` to the EOS) weigh W in the loss (the
  recipe's 2, ``SFTSchedule.closing_weight``; the default here is 1, the recipe before it);
* ``--warm TASK``: start from that task's cached prepared teacher instead of ``chain-late``'s;
* ``--short-share S``: the curriculum's short whole chains take S of the draws and the excerpts 0.85 - S
  (the task-length share stays 0.15; S = 0.85 is the curriculum without excerpts).

``measure`` (any saved model; with ``--calibrate N`` after the prepare's logit-scale fit on N train problems,
``adwin.tasks.calibrate``): answer accuracy at T = 1 (two sampling seeds) and greedy, the phases under
teacher forcing, and on the first 32 problems the share whose whole solution verifies (every line, the closing
line and the answer) beside the share whose answer is right. ``diagnose``: under teacher forcing, by chain
length, the mean probability of the reference chain lines and of the closing line, and the closing characters
whose argmax is wrong (index in ``fin:A+B=S\\nans=S``).

    python docs/scripts/late_long_teacher.py train out/A800 --steps 800 --threads 1
    python docs/scripts/late_long_teacher.py train out/C --closing-weight 4 --threads 1
    python docs/scripts/late_long_teacher.py train out/W2 --closing-weight 2
    python docs/scripts/late_long_teacher.py measure out/W2 --calibrate 512
    python docs/scripts/late_long_teacher.py train out/D --short-share 0.85 --threads 1
    python docs/scripts/late_long_teacher.py measure ~/.cache/adwin/builtin/chain-late-long-default-seed0/teacher
    python docs/scripts/late_long_teacher.py diagnose out/C
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import adwin.tasks.long as long_tasks
from adwin.tasks.assets import assets_root
from adwin.tasks.build import load_warm_start
from adwin.tasks.calibrate import calibrate_teacher
from adwin.tasks.chain import check_answer
from adwin.tasks.phases import phase_accuracy, teacher_forced
from adwin.tasks.profiles import SFTSchedule
from adwin.tasks.sft import evaluate_accuracy, generate_responses, train_sft
from adwin.tasks.suite import get_task

TASK = get_task("chain-late-long")
HORIZON = 2048


def _emit(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _root(task: str) -> Path:
    return assets_root(None, "default", 0, task)


def train(args: argparse.Namespace) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(_root("chain-late-long") / "tokenizer"))
    model = TASK.profile("default").model.build(len(tokenizer), tokenizer, seed=0)
    load_warm_start(model, _root(args.warm) / "teacher")
    if args.short_share is not None:
        long_tasks.SFT_SHORT_SHARE, long_tasks.SFT_EXCERPT_SHARE = args.short_share, 0.85 - args.short_share
    schedule = SFTSchedule(steps=args.steps, batch_size=16, lr=args.lr, warmup=20, noise_line_rate=0.05,
                           closing_weight=args.closing_weight)
    t = time.perf_counter()
    train_sft(model, tokenizer, schedule, seed=0, progress_desc="sft", task=TASK)
    _emit({"steps": args.steps, "lr": args.lr, "s_per_step": (time.perf_counter() - t) / args.steps})
    model.save_pretrained(args.model)
    measure(args)


def _load(path: str) -> tuple[torch.nn.Module, object]:
    tokenizer = AutoTokenizer.from_pretrained(str(_root("chain-late-long") / "tokenizer"))
    return AutoModelForCausalLM.from_pretrained(path).eval(), tokenizer


def measure(args: argparse.Namespace) -> None:
    model, tokenizer = _load(args.model)
    problems = TASK.problems(64, seed=1, split="eval")
    out: dict[str, object] = {}
    if args.calibrate:  # the prepare's logit-scale fit, on its train draw (seed 0 + 2)
        out["calibration"] = calibrate_teacher(model, tokenizer, TASK, args.calibrate, seed=2)
    for seed in (0, 1):
        out[f"t1_seed{seed}"] = evaluate_accuracy(model, tokenizer, problems, HORIZON, 1.0, seed, TASK)["accuracy"]
    out["greedy"] = evaluate_accuracy(model, tokenizer, problems, HORIZON, 0.0, 0, TASK)["accuracy"]
    out["phases"] = phase_accuracy(model, tokenizer, TASK, problems)
    head = problems[:32]
    for temperature in (0.0, 1.0):
        responses = generate_responses(model, tokenizer, [p.prompt for p in head], HORIZON, temperature, 0)
        out[f"T{temperature:g}_32"] = {
            "answer": sum(check_answer(r, TASK.answer(p)) for r, p in zip(responses, head, strict=True)) / 32,
            "verified": sum(TASK.verify(p.prompt, r) for r, p in zip(responses, head, strict=True)) / 32,
        }
    _emit(out)


@torch.no_grad()
def diagnose(args: argparse.Namespace) -> None:
    model, tokenizer = _load(args.model)
    rows = []
    for problem in TASK.problems(64, seed=1, split="eval"):
        response = TASK.solution(problem)
        logits, target = teacher_forced(model, tokenizer, problem.prompt, response)  # (R, V), (R,)
        logp = torch.log_softmax(logits.float(), -1)  # (R, V)
        token_logp = logp.gather(1, target[:, None]).squeeze(1)  # (R,)
        lines = response.split("\n")
        start = len(response) - len(lines[-1]) - len(lines[-2]) - 1  # the closing line's first character
        pred = logp.argmax(-1)  # (R,)
        wrong = [j - start for j in range(start, len(response)) if pred[j] != target[j]]
        rows.append((problem.n, token_logp[:start].sum().item(), token_logp[start:].sum().item(), wrong))
    for lo, hi in ((36, 72), (73, 109), (110, 145)):
        part = [r for r in rows if lo <= r[0] <= hi]
        _emit({"lines": f"{lo}-{hi}", "problems": len(part),
               "p_chain_lines": sum(math.exp(r[1]) for r in part) / len(part),
               "p_closing": sum(math.exp(r[2]) for r in part) / len(part),
               "closing_argmax_right": sum(not r[3] for r in part) / len(part)})
    _emit({"wrong_closing_char_index": sorted(j for r in rows for j in r[3])})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["train", "measure", "diagnose"])
    parser.add_argument("model", help="where train saves the model; the model measure / diagnose read")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--closing-weight", type=float, default=1.0,
                        help="the closing line's loss weight (the recipe's is 2: SFTSchedule.closing_weight)")
    parser.add_argument("--short-share", type=float)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calibrate", type=int, default=0,
                        help="measure after the prepare's logit-scale fit on this many train problems (0: none)")
    parser.add_argument("--warm", default="chain-late", help="the cached task whose prepared teacher it starts from")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    {"train": train, "measure": measure, "diagnose": diagnose}[args.command](args)


if __name__ == "__main__":
    main()
