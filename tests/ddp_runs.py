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


AUDIT_CANDIDATES = [4, 8, 16, 32]


def _generate_with_an_empty_rank(model: Any, rank: int, wait_s: float = 120.0) -> int:
    """Rank 0 decodes a row on the rollout engine, rank 1 none (a probe round smaller than the world): both must
    return. Rows decoded on this rank; raises instead of hanging when a rank is left waiting."""
    import threading

    from adwin.loop.engine import HFEngine

    rows = [[5, 6, 7]] if rank == 0 else []
    out: list[int] = []
    worker = threading.Thread(target=lambda: out.append(len(HFEngine(model, {2}, 0).generate(
        rows, [4] * len(rows), temperature=1.0, top_p=1.0, with_logprobs=False).response_ids)), daemon=True)
    worker.start()
    worker.join(wait_s)
    if not out:
        raise RuntimeError(f"rank {rank}: generate did not return: a rank without rows left another waiting")
    return out[0]


def sharded_audit_worker(rank: int, world: int, port: int, out: str) -> None:
    """One rank: a tiny Llama trained two AdamW steps in one process (``ref``), the same weights and optimizer
    state sharded over the ranks (FSDP2), and the audit of one probe batch on both, for each method and metric;
    plus the gradient norm of one backward (the whole batch on ``ref``, this rank's rows on the shards). Rank 0
    writes everything to ``out`` as JSON."""
    import copy

    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from tiny_models import make_tiny_llama

    from adwin.audit.alignment import ProbeBatch
    from adwin.audit.job import AuditJob, AuditSettings, run_audit_job
    from adwin.backends.fsdp import full_tensor
    from adwin.config import load_config
    from adwin.loop.distributed import init_distributed
    from adwin.loop.fsdp import shard_student
    from adwin.loop.parts import build_optimizer

    dist, _ = init_distributed("cpu")
    try:
        cfg = load_config(None, {"model.sharding": "fsdp"})
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, 64, (4, 24), generator=g)  # (B, T) training rows

        def loss(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
            logp = model(input_ids=rows).logits.float().log_softmax(-1)[:, :-1]  # (b, T-1, V)
            return -logp.gather(-1, rows[:, 1:, None]).sum()

        ref = make_tiny_llama(num_layers=3)
        ref_opt, _ = build_optimizer(cfg, ref)
        for _ in range(2):
            ref_opt.zero_grad()
            loss(ref, ids).backward()
            ref_opt.step()
        shard = shard_student(copy.deepcopy(ref), cfg, dist)
        shard_opt, _ = build_optimizer(cfg, shard)
        set_optimizer_state_dict(shard, shard_opt, get_optimizer_state_dict(ref, ref_opt),
                                 options=StateDictOptions(full_state_dict=True))
        res: dict[str, Any] = {"generated": _generate_with_an_empty_rank(shard, rank)}
        ref.zero_grad()
        loss(ref, ids).backward()
        shard.zero_grad()
        loss(shard, ids[dist.shard(4)]).backward()  # FSDP sums the ranks' gradients into the shards
        res["grad_norm"] = [float(torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf"))),
                            float(full_tensor(torch.nn.utils.clip_grad_norm_(shard.parameters(), float("inf"))))]
        ref.zero_grad(set_to_none=True)
        shard.zero_grad(set_to_none=True)
        lens = [(5, 40), (9, 20), (3, 55), (12, 30), (4, 3)]
        width = max(p + r for p, r in lens) + 3
        pids = torch.randint(3, 64, (len(lens), width), generator=g)
        am, rm = torch.zeros_like(pids), torch.zeros_like(pids)
        for b, (p, r) in enumerate(lens):
            am[b, : p + r], rm[b, p : p + r] = 1, 1
        batch = ProbeBatch(pids * am, am, rm, -torch.rand(pids.shape, generator=g) * 4 * rm)
        for method in ("fast", "sketch"):
            for metric in ("identity", "adam"):
                settings = {"candidates": AUDIT_CANDIDATES, "method": method, "metric": metric, "sketch_dim": 512,
                            "seed": 3}
                one = run_audit_job(ref, AuditJob(0, 2, batch, AuditSettings(**settings)), ref_opt).result
                many = run_audit_job(shard, AuditJob(0, 2, batch, AuditSettings(**settings, extra={"combine": dist})),
                                     shard_opt).result
                res[f"{method}-{metric}"] = {name: {"cos": {str(c): r.cosines[c] for c in AUDIT_CANDIDATES},
                                                    "gram": r.gram.tolist()} for name, r in (("one", one), ("many", many))}
        res["after"] = {"dtensor_params": all(type(p).__name__ == "DTensor" for p in shard.parameters()),
                        "grads": sum(p.grad is not None for p in shard.parameters()),
                        "sharded_moments": all(type(s["exp_avg_sq"]).__name__ == "DTensor"
                                               for s in shard_opt.state.values()) and len(shard_opt.state) > 0}
        if dist.is_main:
            Path(out).write_text(json.dumps(res))
    finally:
        dist.close()
