"""TRL ``AsyncDistillationTrainer`` with adwin's rollout worker: a fixed full-length window against the adwin
policy, with and without the decision budget (tiny model, CPU).

    .venv/bin/python docs/scripts/trl_async_steps_per_s.py --steps 20 --repeats 3 --max-len 16

Each repeat trains a fresh tiny Llama student (saved, TRL loads it by path) and teacher (saved, served) with the same seed, prompts and ``AsyncDistillationConfig`` (4 rollouts a step, one per
micro-batch, ``max_staleness=1``), ``AdwinRolloutWorker`` sending TRL's requests to a stand-in of the student's
vLLM server and to a teacher server (``adwin teacher serve``), both on 127.0.0.1 in this process: once at a fixed window of ``max_len`` with no
probes, once under the adwin policy (candidates max_len/4 and max_len/2, ``probe_count=4``) with the callback's
default decision budget, once with ``AuditConfig(budget=None)`` (every ready batch audited). Prints one JSON line
per run: TRL's ``train_steps_per_second`` and ``train_runtime``, the seconds the callback spent deciding on the
learner (probe reports, audits, window reads: ``driver.decide_s``) and their share of the run, ``decision/*``, the
audits and the windows used. One torch thread; a 2-step warm-up run first, not reported.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch
from transformers import PrinterCallback

from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.trainer_adapters.trl import AdwinCallback
from adwin.trainer_adapters.trl_async import AdwinRolloutWorker

ROOT = Path(__file__).resolve().parents[2]
# after adwin is imported: tests/ has a folder named adwin that would otherwise shadow the package
sys.path += [str(ROOT / "tests"), str(ROOT / "tests" / "trainer_adapters")]

from trl_fixtures import async_servers, make_async_trainer, rows  # noqa: E402


def one(steps: int, max_len: int, mode: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp, async_servers(Path(tmp)) as servers:
        worker = AdwinRolloutWorker()
        trainer = make_async_trainer(Path(tmp), steps, servers, worker, max_len=max_len, max_staleness=1)
        trainer.remove_callback(PrinterCallback)  # one JSON line per run on stdout, not TRL's rows
        if mode == "fixed":
            run = RunIn(run_id="fixed", policy=PolicyIn(name="fixed", window=max_len, max_len=max_len),
                        probe_batch_size=1, offers_per_step=0)
            cb = AdwinCallback(Controller(), run, probe_count=0).attach(trainer)
        else:
            audit = AuditConfig() if mode == "adwin" else AuditConfig(budget=None)
            cb = AdwinCallback(Controller(), "bench", candidates=[max_len // 4, max_len // 2], probe_count=4,
                               audit=audit).attach(trainer)
        out = trainer.train()
        worker.stop()
    last = rows(trainer)[-1]
    runtime = out.metrics["train_runtime"]
    assert cb.driver is not None
    return {"mode": mode, "steps": steps, "max_len": max_len, "wall_s": round(runtime, 3),
            "steps_per_s": round(out.metrics["train_steps_per_second"], 3),
            "decide_s": round(cb.driver.decide_s, 3), "decide_share": round(cb.driver.decide_s / runtime, 4),
            "audits": last.get("probe/audits", 0.0), "windows": sorted(set(cb.windows.values()))} | {
        k: round(v, 4) for k, v in last.items() if k in ("decision/learner_share", "decision/flops_share")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=16)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # as the test suite: the machine's cores are shared
    one(2, a.max_len, "adwin")  # warm-up (imports, first generate), not reported
    for _ in range(a.repeats):
        for mode in ("fixed", "adwin", "every-batch"):
            sys.stdout.write(json.dumps(one(a.steps, a.max_len, mode)) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
