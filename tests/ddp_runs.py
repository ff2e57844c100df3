"""Helpers of the data-parallel tests: the tiny run's config as a YAML file, `adwin train --nproc 2` in a subprocess
and what its run folder holds, and the 2-rank gloo workers that ``torch.multiprocessing.spawn`` starts (they must
live in an importable module, not in a test file)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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


ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of an ``adwin`` subprocess: this one's, with the checkout first on ``PYTHONPATH`` and what was
    there kept after it, made absolute (CI puts another transformers release there; the child, started in another
    folder, must import the same one)."""
    kept = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([str(ROOT), *kept])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def two_ranks(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``adwin train --nproc 2 ARGS`` run in ``tmp``; fails the test with its stderr when it fails."""
    done = subprocess.run([sys.executable, "-m", "adwin", "train", "--nproc", "2", *args], cwd=tmp, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def metrics_rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_decisions(history: list[dict[str, Any]], rows: list[dict[str, Any]], cos_abs: float) -> None:
    """A data-parallel run's metrics ``rows`` took the one-process run's windows and audits step by step, its
    audits reading the same micro-batch cosines (within ``cos_abs``), with at least two audits to compare."""
    import pytest

    assert [h["window/current"] for h in history] == [r["window/current"] for r in rows]
    assert sum("audit/id" in h for h in history) >= 2
    for h, r in zip(history, rows, strict=True):
        assert ("audit/id" in h) == ("audit/id" in r)
        for key in (k for k in h if k.startswith("audit/micro_cos_")):
            assert r[key] == pytest.approx(h[key], abs=cos_abs), key


def cut_copy(run: Path, dest: Path, last: int, exported: str) -> Path:
    """A copy of the finished ``run`` at ``dest`` as if it had crashed before its ``checkpoint-<last>`` and its
    final export (the folder ``exported``) were written."""
    shutil.copytree(run, dest)
    shutil.rmtree(dest / f"checkpoint-{last}")
    shutil.rmtree(dest / exported)
    return dest


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

    from adwin.decode.engine import HFEngine

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
    """One rank, for a fully fine-tuned student (``full``) and a LoRA one (``lora``): a tiny Llama trained two
    AdamW steps in one process (``ref``), the same weights and optimizer state sharded over the ranks (FSDP2),
    and the audit of one probe batch on both, for each method and metric; plus the gradient norm of one
    backward (the whole batch on ``ref``, this rank's rows on the shards), and (``lora``) compiled decoding on
    the gathered weights against the eager tokens of ``ref``. Rank 0 writes everything to ``out`` as JSON."""
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from adwin.loop.distributed import init_distributed

    dist, _ = init_distributed("cpu")
    try:
        res = {variant: _sharded_audits(dist, rank, variant) for variant in ("full", "lora")}
        if dist.is_main:
            Path(out).write_text(json.dumps(res))
    finally:
        dist.close()


def _sharded_audits(dist: Any, rank: int, variant: str) -> dict[str, Any]:
    """What ``sharded_audit_worker`` measures for one student ``variant``."""
    import copy
    from types import SimpleNamespace

    import torch
    from tiny_models import make_tiny_llama
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from adwin.audit.alignment import ProbeBatch
    from adwin.audit.job import AuditJob, AuditSettings, run_audit_job
    from adwin.config import load_config
    from adwin.student.fsdp import full_tensor, shard_student
    from adwin.student.lora import apply_lora, trainable_parameters
    from adwin.student.optimizer import build_optimizer

    lora = variant == "lora"
    cfg = load_config(None, {"model.sharding": "fsdp", **({"optim.lr": 1e-2} if lora else {})})
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (4, 24), generator=g)  # (B, T) training rows

    def loss(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        logp = model(input_ids=rows).logits.float().log_softmax(-1)[:, :-1]  # (b, T-1, V)
        return -logp.gather(-1, rows[:, 1:, None]).sum()

    ref = make_tiny_llama(num_layers=3)
    if lora:
        ref = apply_lora(ref, SimpleNamespace(r=4, alpha=8.0, dropout=0.0, target_modules="all-linear"))
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
    if lora:
        res["compiled"] = _compiled_decode_on_gathered_weights(ref, shard)
    ref.zero_grad()
    loss(ref, ids).backward()
    shard.zero_grad()
    loss(shard, ids[dist.shard(4)]).backward()  # FSDP sums the ranks' gradients into the shards
    res["grad_norm"] = [
        float(torch.nn.utils.clip_grad_norm_(trainable_parameters(ref), float("inf"))),
        float(full_tensor(torch.nn.utils.clip_grad_norm_(trainable_parameters(shard), float("inf"))))]
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
                                           for s in shard_opt.state.values()) and len(shard_opt.state) > 0,
                    "moments": len(shard_opt.state), "trainable": len(trainable_parameters(shard)),
                    "parameters": sum(1 for _ in shard.parameters())}
    return res


def _compiled_decode_on_gathered_weights(ref: Any, shard: Any) -> bool:
    """Whether the sharded student, decoding compiled (``rollout.compile: true``) on its gathered weights, draws
    the tokens ``ref`` draws eagerly (per-sample seeds)."""
    from adwin.decode.generate import generate
    from adwin.sampling.seeding import row_seed
    from adwin.student.fsdp import full_weights

    contexts, budgets = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8]], [12, 5, 12]
    kw = {"eos": {2}, "pad_id": 0, "temperature": 0.9, "row_seeds": [row_seed(1, "rollout", 0, i) for i in range(3)]}
    eager = generate(ref, contexts, budgets, **kw).response_ids
    with full_weights(shard):
        compiled = generate(shard, contexts, budgets, compile=True, **kw).response_ids
    return compiled == eager
