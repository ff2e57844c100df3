"""Peak memory per rank of each way to hold the student (``adwin bench memory``), and the largest student each
fits on one GPU.

Measured: every mode (``MODES``: ``ddp`` replicates the student, ``fsdp`` shards it, ``model.sharding``; ``lora``
and ``lora+fsdp`` do the same with LoRA adapters on a frozen base, ``model.lora``: the run's, else the defaults) runs
on ``--nproc`` ranks of this machine (gloo on CPU; NCCL with ``--set model.device=cuda``, one GPU per rank)
the trainer's own pieces on one model: the student loaded and prepared as ``adwin train`` prepares it
(``adwin.student.lora.apply_lora``, ``adwin.student.fsdp.shard_student``), AdamW (``build_optimizer``), ``--steps`` optimizer steps on random
rows (``adwin.loop.step.optimize``), then one rollout call on the rollout engine (``HFEngine``: a sharded
student is gathered for it) and, for a sharded student, the same call with FSDP's per-layer all-gathers on
every decode step instead (transformers ``generate(synced_gpus=True)``). Per phase and rank: on CPU the
process's peak resident set (``VmHWM``, reset between phases through ``/proc/self/clear_refs``) minus its
resident set before the model was loaded: weights, gradients, optimizer state, activations, the gathered
weights, allocator caches and freed-but-kept heap all count; on CUDA ``torch.cuda.max_memory_allocated``
(tensors only). The model is the run's student, or a random Llama of ``--llama HIDDEN LAYERS`` (the
student's vocabulary) built in code, large enough for the states to show above the allocator's noise.

Estimated: the largest student (parameters ``P``) each mode fits on a ``--gpu-gb`` GPU with ``N`` ranks,
from bytes per parameter and an activation allowance (``estimate``'s docstring has the formula).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Each mode: the config overrides that select it (the rest of the run's config is shared). ``ADAPTERS`` stands for
# the run's model.lora section (the defaults when it has none). A new way to hold the student adds a row here and
# is measured and estimated like these.
ADAPTERS: dict[str, Any] = {}
MODES: dict[str, dict[str, Any]] = {
    "ddp": {"model.sharding": "ddp", "model.lora": None},
    "fsdp": {"model.sharding": "fsdp", "model.lora": None},
    "lora": {"model.sharding": "ddp", "model.lora": ADAPTERS},
    "lora+fsdp": {"model.sharding": "fsdp", "model.lora": ADAPTERS},
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAPTER_BYTES = 4.0  # peft keeps adapters in float32, over a bfloat16 base too (autocast_adapter_dtype)
# adapters per base parameter in the estimate: r=16 on the 7 projections of Qwen3-4B (33.0M of 4.02B)
LORA_FRACTION = 0.0082


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="preset name or YAML path (default: the 'default' preset)")
    p.add_argument("--profile", choices=["default", "tiny"], default="default", help="built-in task model size")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides (repeatable)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--nproc", type=int, default=2, help="ranks each mode runs on")
    p.add_argument("--llama", type=int, nargs=2, metavar=("HIDDEN", "LAYERS"),
                   help="measure a random Llama of this width and depth instead of the run's student")
    p.add_argument("--rows", type=int, default=4, help="rows per rank in the training step and the rollout call")
    p.add_argument("--seq", type=int, default=64, help="response tokens per row in the training step")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens each rollout row generates")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps measured")
    p.add_argument("--gpu-gb", type=float, default=80.0, help="GPU memory of the estimate")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per rank per micro-batch in the estimate")
    p.add_argument("--act-mb-per-token", type=float, default=2.4,
                   help="activation memory per token in the estimate (default: Qwen3-4B shapes with activation "
                        "checkpointing and float32 logits)")
    p.add_argument("--lora-fraction", type=float, default=LORA_FRACTION,
                   help="a LoRA student's adapter parameters per base parameter in the estimate (default: r=16 on "
                        "every projection of Qwen3-4B)")
    p.add_argument("--teacher-b", type=float, default=0.0,
                   help="teacher parameters (billions) in the estimate, held whole on every rank")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


@dataclass(frozen=True)
class Setup:
    """What every rank of one mode's measurement needs (picklable: it crosses ``mp.spawn``)."""

    config: str | None
    overrides: dict[str, Any]
    profile: str
    llama: tuple[int, int] | None
    rows: int
    seq: int
    new_tokens: int
    steps: int


class PeakMeter:
    """Peak memory of a phase, in MiB above the baseline taken at construction (module docstring)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.base = self._now()

    def _now(self) -> float:
        if self.cuda:
            import torch

            return torch.cuda.memory_allocated() / 2**20
        return _status_mb("VmRSS")

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
        except OSError:  # not Linux: the peak then runs from the process start
            log.warning("cannot reset the peak resident set: phase peaks include earlier phases")

    def peak(self) -> float:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated() / 2**20 - self.base
        return _status_mb("VmHWM") - self.base


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1]) / 1024  # kB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: the process peak (kB)


def _student_builder(setup: Setup, cfg: Any, device: str) -> Callable[[str], Any]:
    """``build(device)``: the measured student on ``device`` (``meta``: no memory, only its code imported)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from adwin.loop.parts import builtin_assets, student_paths
    from adwin.teacher.checkpoints import DTYPES, load_model

    assets = builtin_assets(cfg, setup.profile) if cfg.model.student == "builtin" else None
    path, _ = student_paths(cfg, assets)
    config = AutoConfig.from_pretrained(path)
    if setup.llama is not None:
        hidden, layers = setup.llama
        config = LlamaConfig(vocab_size=int(config.vocab_size), hidden_size=hidden, intermediate_size=4 * hidden,
                             num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                             num_key_value_heads=max(1, hidden // 64), tie_word_embeddings=False, pad_token_id=0,
                             bos_token_id=1, eos_token_id=2)

    def build(where: str) -> Any:
        if where == "meta":
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(config)
        if setup.llama is None:
            return load_model(path, cfg.model.dtype, where)
        torch.manual_seed(0)  # every rank builds the same weights
        return AutoModelForCausalLM.from_config(config).to(device=where, dtype=DTYPES[cfg.model.dtype]).eval()

    return build


def _random_step_inputs(setup: Setup, vocab: int, pad: int, rank: int) -> tuple[Any, Any]:
    """A rank's rows of random tokens (a 4-token prompt each) and random teacher logprobs."""
    import torch

    from adwin.loop.step import TeacherSignal
    from adwin.sampling.batch import Batch
    from adwin.sampling.data import Prompt
    from adwin.sampling.rollout import layout

    g = torch.Generator().manual_seed(1000 + rank)
    prompts = [torch.randint(3, vocab, (4,), generator=g).tolist() for _ in range(setup.rows)]
    responses = [torch.randint(3, vocab, (setup.seq,), generator=g).tolist() for _ in range(setup.rows)]
    rows = layout(prompts, responses, pad)
    batch = Batch([Prompt(str(i), "") for i in range(setup.rows)], prompts, responses, [False] * setup.rows, rows)
    teacher = -torch.rand(rows.input_ids.shape, generator=g) * rows.response_mask  # (B, L)
    return batch, TeacherSignal(teacher)


def _phase(meter: PeakMeter, fn: Callable[[], Any]) -> tuple[float, float]:
    """(peak MiB above the baseline, seconds) of ``fn``."""
    meter.reset()
    t0 = time.perf_counter()
    fn()
    return meter.peak(), time.perf_counter() - t0


def _rank(rank: int, world: int, port: int, setup: Setup, out: str) -> None:
    """One rank of one mode: load, prepare, train, generate; rank 0 writes every rank's numbers to ``out``."""
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from adwin.config import load_config
    from adwin.decode.engine import HFEngine
    from adwin.decode.generate import generate
    from adwin.loop.distributed import LocalDist, init_distributed
    from adwin.loop.step import optimize
    from adwin.student.fsdp import shard_student
    from adwin.student.lora import apply_lora, require_peft, trainable_parameters
    from adwin.student.optimizer import build_optimizer

    cfg = load_config(setup.config, setup.overrides, world=world)
    dist, device = init_distributed(cfg.model.device) if world > 1 else (LocalDist(), cfg.model.device)
    try:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"device": device})})
        build = _student_builder(setup, cfg, device)
        build("meta")  # the model's code imported before the baseline: only its tensors are measured
        if cfg.model.lora is not None:
            require_peft()  # likewise peft's
        meter = PeakMeter(device)
        state: dict[str, Any] = {}

        def prepare() -> None:
            model = build(device)
            model = model if cfg.model.lora is None else apply_lora(model, cfg.model.lora, seed=cfg.seed)
            state["model"] = shard_student(model, cfg, dist)
            state["opt"] = build_optimizer(cfg, state["model"])

        res: dict[str, float] = {}
        res["load_mb"], res["load_s"] = _phase(meter, prepare)
        model, (optimizer, scheduler) = state["model"], state["opt"]
        n_params = sum(p.numel() for p in model.parameters())
        vocab = int(model.config.vocab_size)
        batch, teacher = _random_step_inputs(setup, vocab, 0, rank)
        reducer = dist if world > 1 else None

        def train() -> None:
            for _ in range(setup.steps):
                optimize(model, optimizer, scheduler, batch, teacher, cfg, setup.seq, reducer=reducer)

        res["train_mb"], res["train_s"] = _phase(meter, train)
        engine = HFEngine(model, {2}, 0)
        contexts, budgets = batch.prompt_ids, [setup.new_tokens] * setup.rows
        res["generate_mb"], res["generate_s"] = _phase(meter, lambda: engine.generate(
            contexts, budgets, temperature=1.0, top_p=1.0, with_logprobs=False))
        if cfg.model.sharding == "fsdp" and world > 1:  # FSDP's own path: one all-gather per layer per decode step
            res["generate_per_layer_mb"], res["generate_per_layer_s"] = _phase(meter, lambda: generate(
                model, contexts, budgets, eos={2}, pad_id=0, sampling={"do_sample": True, "top_k": 0,
                                                                        "synced_gpus": True}))
        res["params"] = float(n_params)
        res["trainable"] = float(sum(p.numel() for p in trainable_parameters(model)))
        every = dist.all_gather_object(res)
        if dist.is_main:
            Path(out).write_text(json.dumps(every))
    finally:
        dist.close()


def measure(setup: Setup, nproc: int) -> list[dict[str, float]]:
    """Every rank's numbers for one mode (``setup.overrides`` selects it), on ``nproc`` fresh processes."""
    import torch.multiprocessing as mp

    from adwin.loop.distributed import free_port

    # glibc keeps freed heap resident and, after the first frees, serves large blocks from it: with a fixed mmap
    # threshold every tensor is its own mapping, returned when freed, so the resident set follows live tensors
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 16))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ranks.json"
        mp.spawn(_rank, args=(nproc, free_port(), setup, str(out)), nprocs=nproc, join=True)
        return json.loads(out.read_text())


def bytes_per_param(mode: str, world: int, dtype: str, autocast: str, metric: str,
                    lora_fraction: float = LORA_FRACTION) -> dict[str, float]:
    """Bytes per (base) parameter of the student on one rank: ``resident`` (weights, gradients and AdamW's two
    moments of what trains, the frozen weights of what does not; sharded ``1/N`` by fsdp) and ``gathered``
    (fsdp: the whole weights gathered for generation and the audit, in bf16 under ``model.autocast: bf16``, the
    audit's gradient of what trains, likewise, and the Adam metric's gathered second moments).

    What trains: every parameter, in the weights' dtype; a LoRA student (``lora`` modes): its adapters,
    ``lora_fraction`` as many parameters as the base, in float32 (``ADAPTER_BYTES``), the base frozen in the
    weights' dtype. A replica's audit differentiates it in place: one gradient of what trains, in ``gathered``."""
    w = float(DTYPE_BYTES[dtype])
    lora = MODES[mode]["model.lora"] is not None
    trains = lora_fraction if lora else 1.0  # trained parameters per base parameter
    t = ADAPTER_BYTES if lora else w  # bytes of one trained weight, gradient or moment
    resident = (w if lora else 0.0) + 4 * t * trains
    if MODES[mode]["model.sharding"] == "ddp" or world == 1:
        return {"resident": resident, "gathered": t * trains}
    g = 2.0 if autocast == "bf16" else w
    weights = g * (1.0 + trains) if lora else g
    return {"resident": resident / world, "gathered": weights + g * trains + (t * trains if metric == "adam" else 0.0)}


def estimate(per_param: dict[str, float], gpu_gb: float, tokens: int, act_mb_per_token: float,
             teacher_b: float, teacher_bytes: int) -> float:
    """Largest student (billions of parameters) on one rank: ``P = (GPU - T a - teacher) / (resident + gathered)``
    with ``T`` tokens per micro-batch at ``a`` bytes each (activations and logits) and the teacher's weights."""
    free = gpu_gb * 1e9 - tokens * act_mb_per_token * 2**20 - teacher_b * 1e9 * teacher_bytes
    return max(0.0, free / (per_param["resident"] + per_param["gathered"]) / 1e9)


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from adwin.config import load_config, parse_set, resolve_config

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"--modes: unknown {unknown or modes}; choose from {', '.join(MODES)}")
    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {args.nproc}")
    if not 0.0 < args.lora_fraction <= 1.0:
        raise ValueError(f"--lora-fraction must be in (0, 1] (adapter parameters per base parameter), got "
                         f"{args.lora_fraction}")
    path = str(resolve_config(args.config).path)
    base = parse_set(args.set) | {"probes.backend": "inline"}
    cfg = load_config(path, base, world=args.nproc)
    adapters = cfg.model.lora.model_dump() if cfg.model.lora is not None else {}  # the lora modes' section
    base = {k: v for k, v in base.items() if not k.startswith("model.lora")}
    measured: dict[str, Any] = {}
    for mode in modes:
        overrides = {k: adapters if v is ADAPTERS else v for k, v in MODES[mode].items()}
        setup = Setup(path, base | overrides, args.profile, tuple(args.llama) if args.llama else None,
                      args.rows, args.seq, args.new_tokens, args.steps)
        measured[mode] = measure(setup, args.nproc)
    estimates = {mode: {n: estimate(bytes_per_param(mode, n, cfg.model.dtype, cfg.model.autocast, cfg.audit.metric,
                                                    args.lora_fraction),
                                    args.gpu_gb, args.tokens, args.act_mb_per_token, args.teacher_b,
                                    DTYPE_BYTES[cfg.model.dtype]) for n in (1, 2, 4, 8)} for mode in MODES}
    console = Console(width=200)
    unit = "GPU MiB allocated" if cfg.model.device.startswith("cuda") else "MiB RSS"
    n_params = int(next(iter(measured.values()))[0]["params"])
    table = Table(title=f"adwin bench memory: {n_params:,} parameters, {args.nproc} ranks, peak {unit} per rank "
                        f"(max over ranks) above the pre-load baseline")
    for col in ("mode", "trained", "load", "train", "generate", "generate s", "per-layer generate", "per-layer s"):
        table.add_column(col, justify="right")
    for mode, ranks in measured.items():
        top = {k: max(r.get(k, float("nan")) for r in ranks) for k in ranks[0]}
        layer = "generate_per_layer_mb" in top
        table.add_row(mode, f"{top['trainable']:,.0f}", f"{top['load_mb']:.1f}", f"{top['train_mb']:.1f}",
                      f"{top['generate_mb']:.1f}",
                      f"{top['generate_s']:.2f}", f"{top['generate_per_layer_mb']:.1f}" if layer else "-",
                      f"{top['generate_per_layer_s']:.2f}" if layer else "-")
    console.print(table)
    est = Table(title=f"largest student on a {args.gpu_gb:g} GB GPU (billions of parameters; estimate: "
                      f"{cfg.model.dtype} weights, autocast {cfg.model.autocast}, audit metric {cfg.audit.metric}, "
                      f"LoRA adapters {args.lora_fraction:g} of the base, "
                      f"{args.tokens} tokens x {args.act_mb_per_token:g} MiB activations, teacher {args.teacher_b:g}B)")
    est.add_column("mode")
    for n in (1, 2, 4, 8):
        est.add_column(f"{n} ranks", justify="right")
    for mode, row in estimates.items():
        est.add_row(mode, *(f"{row[n]:.1f}" for n in (1, 2, 4, 8)))
    console.print(est)
    load = os.getloadavg()
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "meta": {"nproc": args.nproc, "params": n_params, "unit": unit, "loadavg": list(load),
                     "llama": args.llama, "rows": args.rows, "seq": args.seq, "new_tokens": args.new_tokens},
            "measured": measured, "estimate_b": estimates,
            "estimate_inputs": {"gpu_gb": args.gpu_gb, "tokens": args.tokens, "act_mb_per_token": args.act_mb_per_token,
                                "teacher_b": args.teacher_b, "lora_fraction": args.lora_fraction}}, indent=2))
    return 0
