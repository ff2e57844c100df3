"""What `adwin prepare` spends outside the SFT steps, the current code against the way it was done before,
side by side in one process (docs/benchmarks.md, "adwin prepare").

* data: the SFT batches of 32,000 `chain` examples (what the 2,000 steps x 16 consume), written and
  tokenized one example at a time with a tensor per row (before) and by `adwin.tasks.sft.make_batches`
  (now); the batches must be equal, element for element.
* evaluation: greedy and T = 1 accuracy of a prepared student and teacher on the prepare's 256 held-out
  problems, sampled by transformers' `generate` in batches of one prompt length (before) and by
  `adwin.tasks.sft.evaluate_accuracy` (now: the compacting sampler). Greedy accuracies must be equal;
  T = 1 accuracies are two draws.

    python docs/scripts/prepare_cost.py [--home ~/.cache/adwin] [--task chain]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from adwin.tasks.chain import check_answer
from adwin.tasks.sft import evaluate_accuracy, make_batches
from adwin.tasks.suite import get_task
from adwin.tasks.tokenizer import build_tokenizer


def batches_one_by_one(tok, problems, batch_size, seed, rate, task):  # the encoding before this change
    noise = random.Random(f"adwin-noise:{seed}")
    encoded = []
    for p in problems:
        prompt = tok(p.prompt)["input_ids"]
        text, trained = task.write(p, noise, rate, False)
        response = tok(text, add_special_tokens=False)["input_ids"]
        eos_ok = trained[len(text)] if len(trained) > len(text) else trained[-1]
        labels = [-100] * len(prompt) + [t if ok else -100 for t, ok in zip(response, trained[: len(text)], strict=True)]
        encoded.append((prompt + response + [tok.eos_token_id], labels + [tok.eos_token_id if eos_ok else -100]))
    rng, chunk, out = random.Random(seed), batch_size * 8, []
    for start in range(0, len(encoded), chunk):
        group = sorted(encoded[start : start + chunk], key=lambda e: len(e[0]))
        for b in range(0, len(group), batch_size):
            part = group[b : b + batch_size]
            width = max(len(ids) for ids, _ in part)
            ids_t = torch.full((len(part), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(part), width), dtype=torch.long)
            labels_t = torch.full((len(part), width), -100, dtype=torch.long)
            for i, (ids, lab) in enumerate(part):
                ids_t[i, : len(ids)], mask[i, : len(ids)], labels_t[i, : len(ids)] = (
                    torch.tensor(ids), 1, torch.tensor(lab))
            out.append((ids_t, mask, labels_t))
    rng.shuffle(out)
    return out


@torch.no_grad()
def accuracy_with_generate(model, tok, problems, temperature, seed, task):  # the sampler before this change
    torch.manual_seed(seed)
    encoded = [tok(p.prompt)["input_ids"] for p in problems]
    order = sorted(range(len(problems)), key=lambda i: len(encoded[i]))
    texts, i = [""] * len(problems), 0
    while i < len(order):
        idx = [j for j in order[i : i + 256] if len(encoded[j]) == len(encoded[order[i]])]
        ids = torch.tensor([encoded[j] for j in idx])
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=320,
                             do_sample=temperature > 0, temperature=temperature or None,
                             top_k=0 if temperature > 0 else None, top_p=None,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        for row, j in enumerate(idx):
            texts[j] = tok.decode(gen[row, ids.shape[1] :], skip_special_tokens=True)
        i += len(idx)
    return sum(check_answer(t, task.answer(p)) for t, p in zip(texts, problems, strict=True)) / len(problems)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", default=str(Path.home() / ".cache/adwin"))
    ap.add_argument("--task", default="chain")
    args = ap.parse_args()
    torch.set_num_threads(2)
    task, tok = get_task(args.task), build_tokenizer()
    folder = Path(args.home) / "builtin" / ("default-seed0" if args.task == "chain" else f"{args.task}-default-seed0")
    result: dict[str, float] = {}

    problems = task.problems(32_000, seed=0)
    t = time.perf_counter()
    before = batches_one_by_one(tok, problems, 16, 0, 0.05, task)
    result["data_before_s"] = time.perf_counter() - t
    t = time.perf_counter()
    now = make_batches(tok, problems, 16, seed=0, noise_line_rate=0.05, task=task)
    result["data_now_s"] = time.perf_counter() - t
    result["data_equal"] = float(len(before) == len(now) and all(
        torch.equal(a, b) for x, y in zip(before, now, strict=True) for a, b in zip(x, y, strict=True)))

    saved_tok = PreTrainedTokenizerFast.from_pretrained(str(folder / "tokenizer"))
    evalset = task.problems(256, seed=1, split="eval")
    for who in ("student", "teacher"):
        model = LlamaForCausalLM.from_pretrained(str(folder / who)).eval()
        for temp, tag in ((0.0, "greedy"), (1.0, "t1")):
            t = time.perf_counter()
            result[f"{who}_{tag}_before"] = accuracy_with_generate(model, saved_tok, evalset, temp, 0, task)
            result["eval_before_s"] = result.get("eval_before_s", 0.0) + time.perf_counter() - t
            t = time.perf_counter()
            result[f"{who}_{tag}_now"] = evaluate_accuracy(model, saved_tok, evalset, 320, temp, 0, task)["accuracy"]
            result["eval_now_s"] = result.get("eval_now_s", 0.0) + time.perf_counter() - t
    sys.stdout.write(json.dumps({k: round(v, 4) for k, v in result.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
