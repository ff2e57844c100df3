"""Probe the long tasks' SFT recipe cheaply (docs/task.md, the long tasks): train from scratch or from a cached
prepared `chain` model (``teacher`` / ``student``, default profile, seed 0) on a long task's SFT stream, and at
each checkpoint print, on 64 held-out problems under teacher forcing (one forward each, no sampling):

* ``pT1``: the mean probability of the whole reference response (a T = 1 sample reproduces it exactly; a
  sample that leaves it almost never comes back to the right answer, so this tracks T = 1 accuracy),
* ``line_err``: the share of lines with a character that is not the argmax, ``first``: the first line right.

At the end, the wrong argmax characters by their index in the line (0-2: the counter). One thread; one line
of JSON per checkpoint. Arguments: source, steps, lr, planted-mistake rate, task, checks, warm-up steps.

    python docs/scripts/long_warm_probe.py teacher 400 3e-3 0.05 chain-long 50,100,200,300,400 20
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import sys
import time

import torch

from adwin.tasks.assets import assets_root
from adwin.tasks.build import load_warm_start
from adwin.tasks.profiles import SFTSchedule
from adwin.tasks.sft import train_sft
from adwin.tasks.suite import get_task
from adwin.tasks.tokenizer import build_tokenizer


def main() -> None:
    torch.set_num_threads(1)
    source, steps, lr, noise, name = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    checks = [int(x) for x in sys.argv[6].split(",")]
    warmup = int(sys.argv[7]) if len(sys.argv) > 7 else 10
    task, tok = get_task(name), build_tokenizer()
    model = task.profile("default").model.build(len(tok), tok, seed=0)
    if source != "scratch":
        load_warm_start(model, assets_root(None, "default", 0, "chain") / source)
    eval_set = task.problems(64, seed=1, split="eval")
    wrong_chars: collections.Counter[int] = collections.Counter()

    @torch.no_grad()
    def teacher_forced() -> dict[str, float]:
        model.eval()
        logp, bad_lines, lines, first = [], 0, 0, 0
        wrong_chars.clear()
        for p in eval_set:
            response = task.solution(p)
            prompt_ids = tok(p.prompt)["input_ids"]
            target = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            logits = model(input_ids=torch.tensor([prompt_ids + target])).logits[0, len(prompt_ids) - 1 : -1]
            logprobs = logits.log_softmax(-1)  # (R, V)
            t = torch.tensor(target)  # (R,)
            logp.append(float(logprobs.gather(1, t[:, None])[:, 0].sum()))
            ok = logprobs.argmax(-1) == t  # (R,)
            width = p.line_chars()
            for i in range(p.n):
                lines += 1
                bad_lines += int(not ok[i * width : (i + 1) * width].all())
                wrong_chars.update(j for j in range(width) if not ok[i * width + j])
            first += int(ok[:width].all())
        model.train()
        return {"pT1": sum(math.exp(x) for x in logp) / len(logp), "line_err": bad_lines / lines,
                "first": first / len(eval_set)}

    sys.stdout.write(json.dumps({"step": 0, **teacher_forced()}) + "\n")
    schedule = SFTSchedule(steps=steps, batch_size=16, lr=lr, warmup=warmup, noise_line_rate=noise)
    task = dataclasses.replace(task, noise_line_rate=noise)
    start, t0, optimizer = 0, time.time(), None
    for check in checks:
        optimizer, losses = train_sft(model, tok, schedule, seed=0, start_step=start, stop_step=check, task=task,
                                      optimizer=optimizer)
        record = {"step": check, "loss": sum(losses[-10:]) / 10, "s_per_step": (time.time() - t0) / (check - start)}
        sys.stdout.write(json.dumps(record | teacher_forced()) + "\n")
        sys.stdout.flush()
        start, t0 = check, time.time()
    sys.stdout.write(json.dumps({"wrong_chars_by_index": dict(sorted(wrong_chars.items()))}) + "\n")


if __name__ == "__main__":
    main()
