"""Helpers of the data-parallel tests: the tiny run's config as a YAML file, and a 2-rank gloo worker that
``torch.multiprocessing.spawn`` starts (it must live in an importable module, not in a test file)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer_fixtures import tiny_overrides, write_config


def ddp_config(tmp: Path, **extra: Any) -> Path:
    """A 3-step tiny run (tests/trainer_fixtures.py) with 4 prompts x 2 samples per step, per-sample seeding,
    inline probes (P=2, S=2: probes and audits every step, so no decision budget: on tiny models whose teacher is
    as large as the student it thins the audits out) as ``tmp/cfg.yaml``."""
    ov = tiny_overrides(tmp, **{"probes.backend": "inline", "rollout.seeding": "per_sample", "audit.budget": None,
                                "rollout.prompts_per_step": 4, "eval.every": 0, "optim.schedule": "constant",
                                "name": "run", **extra})
    return write_config(tmp / "cfg.yaml", ov)


class Crash(RuntimeError):
    pass


def resume_worker(rank: int, world: int, port: int, cfg_path: str, crash_after: int, out: str) -> None:
    """One rank: an uninterrupted run ``straight``, then run ``split`` crashing after step ``crash_after``
    and resumed from its latest checkpoint in the same process group. Rank 0 writes the windows to ``out``."""
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from adwin.config import load_config
    from adwin.controller import Controller
    from adwin.loop.distributed import init_distributed
    from adwin.loop.parts import load_parts
    from adwin.loop.trainer import train
    from adwin.runtime.checkpoint import latest_checkpoint
    from adwin.runtime.resume import open_resumed_controller

    dist, _ = init_distributed("cpu")
    try:
        straight = train(load_config(cfg_path, {"name": "straight"}), Controller() if dist.is_main else None,
                         dist=dist)
        cfg = load_config(cfg_path, {"name": "split"})
        first: list[dict[str, Any]] = []

        def on_step(t: int, m: dict[str, Any]) -> None:
            first.append(m)
            if t == crash_after:
                raise Crash(f"simulated crash after step {t}")

        try:
            train(cfg, Controller() if dist.is_main else None, on_step=on_step, dist=dist)
        except Crash:
            pass
        ck = latest_checkpoint(Path(cfg.out_dir) / cfg.name)
        assert ck is not None
        controller = open_resumed_controller(ck) if dist.is_main else None
        resumed = train(cfg, controller, load_parts(cfg), resume=ck, dist=dist)
        if dist.is_main:
            done = int(ck.name.split("-")[1])
            Path(out).write_text(json.dumps({
                "checkpoint": ck.name,
                "straight": [h["window/current"] for h in straight.history],
                "resumed": [m["window/current"] for m in first[:done]] + [h["window/current"] for h in resumed.history],
                "audits": sum("audit/id" in h for h in straight.history)}))
    finally:
        dist.close()
