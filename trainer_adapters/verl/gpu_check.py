"""The GPU check of adwin inside verl: ``python -m adwin.trainer_adapters.verl.gpu_check --workdir DIR``.

Six checks, in this order, one ``PASS`` / ``FAIL`` / ``SKIP`` line each (exit status 1 when one fails):

1. ``devices``: Ray workers that import adwin's actor module (as verl's do) each see one GPU, the one Ray gave them,
   and no two see the same.
2. ``one_step``: one step of adwin's main on tiny models built here: training rows at most the window long, probe
   copies at the horizon, no copy in ``update_actor``'s batch, teacher logprobs and ``uid`` on every trained row.
3. ``first_audit``: the first audit on a sharded actor (verl's ``apply_fsdp2``, one rank per GPU, verl's
   ``cpu:gloo,cuda:nccl`` backend): it returns within the timeout; its seconds, peak memory and the device its
   data-parallel sum ran on.
4. ``update_and_sync``: verl's ``update_actor`` and the weight sync to the rollout after it ran for every step of
   the run, and the audits came after updates.
5. ``ranks_agree``: the audit's cosines on N ranks equal one rank's to 1e-4.
6. ``step_time``: seconds per step (and in generation) with a probe step every step and with probe copies on the
   first step only.

2, 4 and 6 run verl end to end with the trainer ``--trainer`` names (``v1``, verl's default: its v1 trainer in the
synchronous mode; ``legacy``: the DataProto trainer) and need two GPUs (the teacher has its own resource pool); 5 needs two; with one GPU
they are skipped, and 3 runs on one rank. The models are random-initialised Qwen2 models and a word-level tokenizer
written to ``--workdir`` (nothing is downloaded). Not yet run on a GPU: docs/adapters.md ("verl") says what has.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CHECKS = ("devices", "one_step", "first_audit", "update_and_sync", "ranks_agree", "step_time")
VERL_RUNS = {"one_step", "update_and_sync", "step_time"}  # read the recorded verl run(s)
HORIZON, PROMPT_LEN, VOCAB = 64, 32, 128
TRAINERS = {"v1": ["trainer.use_v1=true", "trainer.v1.trainer_mode=sync"], "legacy": ["trainer.use_v1=false"]}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One check's result: ``passed`` None when it was skipped (``detail`` says why)."""

    name: str
    passed: bool | None
    detail: str

    def line(self, index: int) -> str:
        word = "SKIP" if self.passed is None else "PASS" if self.passed else "FAIL"
        return f"{word} {index}. {self.name}: {self.detail}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m adwin.trainer_adapters.verl.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--workdir", type=Path, required=True, help="models, data, recordings and logs go here")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: every visible one)")
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    p.add_argument("--steps", type=int, default=3, help="steps of each verl run (at least 3: step 1 probes in "
                   "both step-time runs, and a step's seconds are known when the next one starts)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each verl run or audit may take")
    p.add_argument("--trainer", choices=TRAINERS, default="v1", help="verl's trainer for checks 2, 4 and 6 (v1: "
                   "verl's default, the v1 trainer's sync mode; legacy: the DataProto trainer)")
    args = p.parse_args(argv)
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = sorted(set(args.only) - set(CHECKS))
    if unknown:
        p.error(f"--only: unknown checks {unknown}; known: {list(CHECKS)}")
    if args.steps < 3:
        p.error("--steps must be at least 3 (see --help)")
    if args.gpus is not None and args.gpus < 1:
        p.error("--gpus must be at least 1")
    return args


def needs(name: str, gpus: int) -> str | None:
    """Why check ``name`` cannot run on ``gpus`` GPUs (None: it can)."""
    if gpus < 1:
        return "no CUDA device"
    if name in VERL_RUNS and gpus < 2:
        return "verl's distillation run needs 2 GPUs (the teacher has its own resource pool)"
    if name == "ranks_agree" and gpus < 2:
        return "needs 2 GPUs (NCCL cannot put two ranks on one)"
    return None


# --- assets -----------------------------------------------------------------------------------------------------


def build_assets(workdir: Path) -> dict[str, Path]:
    """A word-level tokenizer, a tiny Qwen2 student and teacher (random weights) and a parquet of prompts."""
    import pandas as pd
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = {"student": workdir / "student", "teacher": workdir / "teacher", "data": workdir / "data"}
    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    for name, seed, layers in (("student", 0, 2), ("teacher", 1, 4)):
        torch.manual_seed(seed)
        cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
        Qwen2ForCausalLM(cfg).save_pretrained(out[name])
        tokenizer.save_pretrained(out[name])
    out["data"].mkdir(parents=True, exist_ok=True)
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"w{4 + i} w{20 + i} w{40 + i}"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"},
             "extra_info": {"index": i}} for i in range(64)]
    for split in ("train", "test"):
        pd.DataFrame(rows).to_parquet(out["data"] / f"{split}.parquet")
    return out


# --- checks that run without verl's trainer -----------------------------------------------------------------------


def check_devices(args: argparse.Namespace) -> Outcome:
    import ray

    @ray.remote(num_gpus=1)
    def where() -> dict[str, Any]:
        import torch

        import adwin.trainer_adapters.verl.actor  # noqa: F401  (imports verl's device helpers, as verl's workers do)

        return {"ray": [str(g) for g in ray.get_gpu_ids()], "count": torch.cuda.device_count(),
                "uuid": str(torch.cuda.get_device_properties(0).uuid)}

    ray.init(num_gpus=args.gpus, include_dashboard=False, ignore_reinit_error=True)
    try:
        seen = ray.get([where.remote() for _ in range(args.gpus)], timeout=args.timeout)
    finally:
        ray.shutdown()
    uuids = [s["uuid"] for s in seen]
    ok = len(set(uuids)) == len(uuids) and all(s["count"] == 1 and len(s["ray"]) == 1 for s in seen)
    return Outcome("devices", ok, f"{len(seen)} workers, devices {sorted(set(uuids))}, "
                                  f"visible per worker {[s['count'] for s in seen]}")


def audit_rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank of verl's FSDP2 actor on GPU ``rank``: the audit of a fixed probe batch under verl's k1 loss, its
    data-parallel sum over the actor group; rank 0 writes cosines, seconds, peak memory and the sum's device."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM
    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.workers.config import DistillationConfig, DistillationLossConfig

    from adwin.audit.job import AuditJob, AuditSettings
    from adwin.trainer_adapters.verl.actor import audit_in_actor, collective_device, dp_combiner

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=world)  # verl's actor backend
    try:
        model = AutoModelForCausalLM.from_pretrained(os.environ["ADWIN_GPU_CHECK_STUDENT"]).cuda()
        apply_fsdp2(model, {"mesh": init_device_mesh("cuda", (world,)), "reshard_after_forward": True}, {})
        loss = DistillationLossConfig(loss_mode="k1", use_policy_gradient=True, use_task_rewards=False)
        job = AuditJob(0, 0, probe_batch("cuda"), AuditSettings([16, 32]))
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        res = audit_in_actor(model, job, DistillationConfig(enabled=False, distillation_loss=loss),
                             combine=dp_combiner(rank, world, dist.group.WORLD)).result
        torch.cuda.synchronize()
        if rank == 0:
            Path(out).write_text(json.dumps({
                "cos": res.cosines, "seconds": time.perf_counter() - start,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                "sum_device": str(collective_device(str(dist.get_backend(dist.group.WORLD))))}))
    finally:
        dist.destroy_process_group()


def probe_batch(device: str) -> Any:
    """Eight probe rows at or under the horizon, fixed by a seed, teacher log-probabilities on the responses."""
    import torch

    from adwin.audit.alignment import ProbeBatch

    g = torch.Generator().manual_seed(0)
    lengths, prompt = [HORIZON, HORIZON, 48, 40, HORIZON, 24, HORIZON, 56], 8
    width = prompt + HORIZON
    ids = torch.randint(4, VOCAB, (len(lengths), width), generator=g)
    am = torch.zeros(len(lengths), width, dtype=torch.long)
    rm = torch.zeros_like(am)
    for i, n in enumerate(lengths):
        am[i, : prompt + n] = 1
        rm[i, prompt : prompt + n] = 1
    teacher = -torch.rand(len(lengths), width, generator=g).mul(3.0) * rm
    return ProbeBatch((ids * am).to(device), am.to(device), rm.to(device), teacher.to(device))


def run_audit(args: argparse.Namespace, world: int, assets: dict[str, Path]) -> dict[str, Any]:
    """``audit_rank`` on ``world`` GPUs in fresh processes; its rank 0's record."""
    from adwin.loop.distributed import free_port

    out = args.workdir / f"audit-{world}.json"
    out.unlink(missing_ok=True)
    code = ("import sys, torch.multiprocessing as mp; from adwin.trainer_adapters.verl.gpu_check import audit_rank; "
            f"mp.spawn(audit_rank, args=({world}, {free_port()}, {str(out)!r}), nprocs={world}, join=True)")
    env = os.environ | {"ADWIN_GPU_CHECK_STUDENT": str(assets["student"])}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=args.timeout)
    return json.loads(out.read_text())


def check_first_audit(args: argparse.Namespace, assets: dict[str, Path]) -> Outcome:
    try:
        got = run_audit(args, args.gpus, assets)
    except subprocess.TimeoutExpired:
        return Outcome("first_audit", False, f"no answer within {args.timeout:.0f} s on {args.gpus} ranks (a hang)")
    ok = got["sum_device"].startswith("cuda") or args.gpus == 1
    return Outcome("first_audit", ok, f"{args.gpus} ranks, {got['seconds']:.2f} s, peak {got['peak_gib']:.2f} GiB "
                                      f"on rank 0, data-parallel sum on {got['sum_device']}")


def check_ranks_agree(args: argparse.Namespace, assets: dict[str, Path]) -> Outcome:
    many, one = run_audit(args, args.gpus, assets), run_audit(args, 1, assets)
    gap = max(abs(many["cos"][c] - one["cos"][c]) for c in one["cos"])
    return Outcome("ranks_agree", gap <= 1e-4, f"largest cosine gap {gap:.2e} between {args.gpus} ranks and 1 "
                                               f"(cosines {one['cos']})")


# --- checks that read a recorded verl run --------------------------------------------------------------------------


def verl_overrides(assets: dict[str, Path], gpus: int, steps: int, record: Path, probe_every: int,
                   trainer: str = "v1") -> list[str]:
    """The recipe's overrides (trainer_adapters/verl/gpu_recipe.sh) at a tiny size: half the GPUs each side."""
    half = max(1, gpus // 2)
    return [
        *TRAINERS[trainer], "algorithm.adv_estimator=grpo", "critic.enable=false",
        f"data.train_files={assets['data'] / 'train.parquet'}", f"data.val_files={assets['data'] / 'test.parquet'}",
        "data.train_batch_size=8", f"data.max_prompt_length={PROMPT_LEN}", f"data.max_response_length={HORIZON}",
        f"actor_rollout_ref.model.path={assets['student']}", "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2", f"actor_rollout_ref.rollout.response_length={HORIZON}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.agent.default_agent_loop=adwin", "distillation.enabled=true",
        f"distillation.n_gpus_per_node={half}", "distillation.nnodes=1",
        f"distillation.teacher_models.teacher_model.model_path={assets['teacher']}",
        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=1",
        "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=true",
        "distillation.distillation_loss.use_task_rewards=false",
        "+adwin.candidates=[16,32]", "+adwin.threshold=0.7", "+adwin.probe_batch_size=8", "+adwin.offers_per_step=8",
        f"+adwin.probe_every={probe_every}", f"+gpu_check.record={record}",
        f"trainer.n_gpus_per_node={half}", "trainer.nnodes=1", f"trainer.total_training_steps={steps}",
        "trainer.logger=[console]", "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
    ]


def run_verl(args: argparse.Namespace, assets: dict[str, Path], name: str, probe_every: int) -> list[dict[str, Any]]:
    """adwin's main with the recording TaskRunner (``gpu_check_runner``) in a fresh process; the recorded events."""
    record = args.workdir / f"{name}.jsonl"
    record.unlink(missing_ok=True)
    code = ("import sys; from adwin.trainer_adapters.verl import gpu_check_runner as r; r.main()")
    argv = verl_overrides(assets, args.gpus, args.steps, record, probe_every, args.trainer)
    argv += [f"hydra.run.dir={args.workdir / name}"]
    with open(args.workdir / f"{name}.log", "w") as log:
        subprocess.run([sys.executable, "-c", code, *argv], stdout=log, stderr=subprocess.STDOUT, check=True,
                       timeout=args.timeout)
    return [json.loads(line) for line in record.read_text().splitlines()]


def check_one_step(events: list[dict[str, Any]]) -> Outcome:
    step = next(e for e in events if e["event"] == "update" and e["step"] == 1)
    gen = next(e for e in events if e["event"] == "generate" and e["step"] == 1)
    problems = []
    if max(step["response_lengths"]) > gen["window"]:
        problems.append(f"a trained row of {max(step['response_lengths'])} tokens > window {gen['window']}")
    if step["probe_rows"]:
        problems.append(f"{step['probe_rows']} probe copies in update_actor's batch")
    short = [n for n, eos in zip(gen["copy_lengths"], gen["copy_ended_eos"], strict=True) if n < HORIZON and not eos]
    if not gen["copy_lengths"] or set(gen["copy_caps"]) != {HORIZON} or short:
        problems.append(f"probe copies capped at {gen['copy_caps']}, {short} cut before the horizon {HORIZON}")
    if not step["teacher_logprobs"] or not step["uid"]:
        problems.append(f"teacher logprobs {step['teacher_logprobs']}, uid {step['uid']} in update_actor's batch")
    return Outcome("one_step", not problems, "; ".join(problems) or
                   f"{len(step['response_lengths'])} rows <= window {gen['window']}, {len(gen['copy_lengths'])} "
                   f"copies capped at the horizon {HORIZON} (lengths {gen['copy_lengths']}: the shorter ended at "
                   f"EOS), none trained, teacher logprobs and uid present")


def check_update_and_sync(events: list[dict[str, Any]], steps: int) -> Outcome:
    updates = [e["step"] for e in events if e["event"] == "update"]
    syncs = [e["step"] for e in events if e["event"] == "sync" and e["step"] >= 1]  # not the one before step 1
    audits = [e for e in events if e["event"] == "audit"]
    ok = updates == list(range(1, steps + 1)) and syncs == updates and all(a["after_update"] for a in audits)
    return Outcome("update_and_sync", ok and bool(audits), f"updates at steps {updates}, weight syncs after "
                                                           f"{syncs}, {len(audits)} audits after their step's update")


def check_step_time(probing: list[dict[str, Any]], quiet: list[dict[str, Any]]) -> Outcome:
    def mean(events: list[dict[str, Any]], key: str) -> float:
        vals = [e[key] for e in events if e["event"] == "metrics" and e["of_step"] >= 2]  # step 1 probes in both
        return sum(vals) / max(1, len(vals))

    a, b = mean(probing, "step_s"), mean(quiet, "step_s")
    ga, gb = mean(probing, "gen_s"), mean(quiet, "gen_s")
    return Outcome("step_time", a > 0 and b > 0, f"probe step every step: {a:.2f} s/step ({ga:.2f} s generating); "
                                                 f"probes on step 1 only: {b:.2f} s/step ({gb:.2f} s generating)")


def run_checks(args: argparse.Namespace, emit: Callable[[str], None] = print) -> list[Outcome]:
    """Every asked check in order, each line emitted as it ends; a check that raises is a FAIL naming the error."""
    outcomes: list[Outcome] = []
    assets: dict[str, Path] | None = None
    runs: dict[str, list[dict[str, Any]]] = {}
    for index, name in enumerate(CHECKS, start=1):
        if name not in args.only:
            continue
        why = needs(name, args.gpus)
        if why is not None:
            outcome = Outcome(name, None, why)
        else:
            try:
                if assets is None and name != "devices":
                    assets = build_assets(args.workdir)
                if name in VERL_RUNS and "probing" not in runs:
                    runs["probing"] = run_verl(args, assets, "probing", probe_every=1)  # type: ignore[arg-type]
                outcome = _one(name, args, assets, runs)
            except Exception as e:  # noqa: BLE001  (a check's failure is its FAIL line, the next check still runs)
                outcome = Outcome(name, False, f"{type(e).__name__}: {e}")
        outcomes.append(outcome)
        emit(outcome.line(index))
    return outcomes


def _one(name: str, args: argparse.Namespace, assets: Any, runs: dict[str, list[dict[str, Any]]]) -> Outcome:
    if name == "devices":
        return check_devices(args)
    if name == "first_audit":
        return check_first_audit(args, assets)
    if name == "ranks_agree":
        return check_ranks_agree(args, assets)
    if name == "one_step":
        return check_one_step(runs["probing"])
    if name == "update_and_sync":
        return check_update_and_sync(runs["probing"], args.steps)
    quiet = run_verl(args, assets, "quiet", probe_every=10**6)  # step 1 (version 0) is a probe step, no other
    return check_step_time(runs["probing"], quiet)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gpus is None:
        import torch

        args.gpus = torch.cuda.device_count()
    args.workdir.mkdir(parents=True, exist_ok=True)
    outcomes = run_checks(args)
    return 1 if any(o.passed is False for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
