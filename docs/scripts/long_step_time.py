"""The step time of full-rollout OPD on a long task at the suite's long sizing, beside the machine's reference figure
(the SFT step of `adwin prepare`, default profile, 2 threads: the machine reference of docs/benchmarks.md), and against the suite's
cost model (`adwin.bench.compare.plan.rollout_s`), in one process, one after the other, with the load average.

    python docs/scripts/long_step_time.py [--task chain-long] [--steps 3] [--sft-steps 30]

Full-rollout steps run on one thread, as the suite's runs do; the first SFT steps and the first OPD step are
warm-up and left out of the medians. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch


def sft_step_s(steps: int) -> float:
    """The median SFT step of `chain`'s default recipe from a fresh model, on 2 threads (after 5 warm-up steps)."""
    from adwin.tasks.profiles import PREPARE_THREADS
    from adwin.tasks.sft import train_sft
    from adwin.tasks.suite import get_task
    from adwin.tasks.tokenizer import build_tokenizer

    torch.set_num_threads(PREPARE_THREADS)
    spec = get_task("chain").profile("default")
    tokenizer = build_tokenizer()
    model = spec.model.build(len(tokenizer), tokenizer, seed=0)
    stamps: list[float] = []
    train_sft(model, tokenizer, spec.schedule, seed=0, stop_step=steps, on_step=lambda *_: stamps.append(
        time.perf_counter()))
    return statistics.median(b - a for a, b in zip(stamps[5:], stamps[6:], strict=False))


def opd_steps(task: str, steps: int) -> list[dict[str, float]]:
    """Seconds of each full-rollout step (rollout, teacher, train) at the suite's long sizing, on one thread; no
    start-of-run evaluation, 2 problems at the end."""
    from adwin.bench.compare.command import load_run_parts
    from adwin.bench.compare.curve import TRAIN_PHASES, curve_config
    from adwin.controller import Controller
    from adwin.loop.trainer import train

    args = argparse.Namespace(task=task, profile="default", config=None, set=["eval.n_problems=2"], seed=0,
                              assets_seed=0, max_steps=steps, eval_every=steps, confirm=1, budget_min=60.0)
    out_dir = tempfile.mkdtemp(prefix="adwin-step-time-")  # the runs are timed, not kept
    cfg = curve_config(args).model_copy(update={"name": "step-time", "out_dir": out_dir})
    parts = load_run_parts(cfg, "default", 0)  # one thread
    out: list[dict[str, float]] = []
    controller = Controller()
    try:
        train(cfg, controller, parts, initial_eval={},
              on_step=lambda t, m: out.append({p: float(m.get(f"time/{p}", 0.0)) for p in TRAIN_PHASES}
                                              | {"tokens": float(m.get("rollout/sync_tokens", 0.0))}))
    finally:
        controller.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--task", default="chain-long")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sft-steps", type=int, default=30)
    a = p.parse_args()
    from adwin.bench.compare.plan import SIZING, rollout_s

    load_before = os.getloadavg()
    sft = sft_step_s(a.sft_steps)
    steps = opd_steps(a.task, a.steps)
    step_s = [sum(s[k] for k in ("rollout", "teacher", "train")) for s in steps]
    size = SIZING["default"]["long"]
    rollouts = (size.prompts_per_step or 32) * 4
    model_s = rollouts * rollout_s(2048, "long")
    measured = statistics.median(step_s[1:] or step_s)
    sys.stdout.write(json.dumps({"task": a.task, "sft_step_s": sft, "opd_step_s": step_s, "opd_phases": steps,
                      "opd_step_median_s": measured, "cost_model_step_s": model_s,
                      "measured_over_model": measured / model_s, "loadavg_before": load_before,
                      "loadavg_after": os.getloadavg(), "cpus": os.cpu_count()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
