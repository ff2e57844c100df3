"""TRL ``DistillationTrainer`` steps/s with and without ``AdwinCallback`` on the same run (tiny model, CPU).

    .venv/bin/python docs/scripts/trl_steps_per_s.py --steps 10 --repeats 3 --batch 8 --max-len 16

Each repeat trains a fresh tiny Llama student/teacher pair (built in code, tests/tiny_models.py) with the
same seed, prompts and ``DistillationConfig``: once plain, once with the callback (embedded controller,
adwin policy, candidates max_len/4 and max_len/2, ``probe_count`` = batch, the callback's default decision
budget unless ``--budget none`` or a share is given). Prints one JSON line per run: steps/s from TRL's own
``train_steps_per_second``, and for the callback the audit count, seconds, the window it ended at and
``decision/*``. One torch thread; a 2-step warm-up run first, not reported.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch

from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.trainer_adapters.trl import AdwinCallback

ROOT = Path(__file__).resolve().parents[2]
# after adwin is imported: tests/ has a folder named adwin that would otherwise shadow the package
sys.path += [str(ROOT / "tests"), str(ROOT / "tests" / "trainer_adapters")]

from trl_fixtures import make_trainer  # noqa: E402


def one(steps: int, batch: int, max_len: int, callback: bool, probe_every: int = 1,
        audit: AuditConfig | None = None) -> dict[str, float | int | bool]:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(Path(tmp), steps, batch=batch, max_len=max_len)
        cb = None
        if callback:
            cb = AdwinCallback(Controller(), "bench", candidates=[max_len // 4, max_len // 2],
                               probe_count=batch, probe_every=probe_every, audit=audit).attach(trainer)
        out = trainer.train()
    row: dict[str, float | int | bool] = {"callback": callback, "steps": steps, "batch": batch, "max_len": max_len,
                                          "wall_s": round(out.metrics["train_runtime"], 3),
                                          "steps_per_s": round(out.metrics["train_steps_per_second"], 3)}
    if cb is not None and cb.client is not None:
        budget = cb.client.probe_client.budget
        row |= {"probe_every": probe_every, "audits": cb.client.stats.audits, "audit_s": round(cb.client.stats.audit_s, 3),
                "budget": budget.budget if budget is not None else None,
                "windows": sorted(set(cb.windows.values()))}
        row |= {k: round(v, 4) for k, v in cb.client.metrics().items() if k.startswith("decision/")}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=16)
    ap.add_argument("--probe-every", type=int, default=1)
    ap.add_argument("--budget", default="default", help="the callback's decision budget: default (AuditConfig's), "
                    "none (every ready batch audited) or a share in (0, 1)")
    a = ap.parse_args()
    audit = None if a.budget == "default" else AuditConfig(budget=None if a.budget == "none" else float(a.budget))
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # as the test suite: the machine's cores are shared
    one(2, a.batch, a.max_len, True)  # warm-up (imports, first generate), not reported
    for _ in range(a.repeats):
        for callback in (False, True):
            sys.stdout.write(json.dumps(one(a.steps, a.batch, a.max_len, callback, a.probe_every, audit)) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
