"""Time and peak memory of the alignment audit methods (reference, fast, sketch), as ratios to one
plain forward+backward of the same loss on the same probe batch.

The model is a Llama built in code (random weights, nothing from a hub); the probe batch is
``--batch`` samples of ``--prompt-len`` prompt + ``--response-len`` response tokens. Each method runs
once to warm up, then ``--repeats`` timed times; the table shows medians.

Peak memory on CPU is the resident-set high-water mark (VmHWM in /proc/self/status) minus the
resident set just before the method runs (first, or after ``--warm-runs`` runs), measured by default in a
fresh process per method (``--isolation subprocess``), so one method's allocator leftovers cannot hide
another's peak.
tracemalloc cannot see torch's allocations; VmHWM sees everything the process touched (including
allocator slack), so it is an honest upper bound. ``--isolation inprocess`` runs every method in
this process and resets the mark between methods through /proc/self/clear_refs (quicker, less
clean). On CUDA the peak is ``torch.cuda.max_memory_allocated`` minus the allocation before the
method.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from typing import Any

log = logging.getLogger(__name__)

LORA = "lora-"  # a method of this prefix runs on a LoRA copy of the model (--lora-r): the adapters are audited
METHODS = ("plain", "reference", "fast", "sketch", "fast-macro", "lora-plain", "lora-fast", "lora-sketch")
DEFAULT_METHODS = "plain,reference,fast,sketch"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hidden", type=int, default=320, help="model width")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=5)
    p.add_argument("--intermediate", type=int, default=864)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8, help="probe samples")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per sample")
    p.add_argument("--response-len", type=int, default=512, help="response tokens per sample")
    p.add_argument(
        "--candidates",
        default="8,16,32,64,128",
        help="comma-separated candidate windows (default: the paper's ratios 1/64..1/4 of 512)",
    )
    p.add_argument(
        "--methods", default=DEFAULT_METHODS, help=f"comma-separated subset of {', '.join(METHODS)}"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method (after one warm-up run)")
    p.add_argument("--sketch-dim", type=int, default=16384)
    p.add_argument("--lora-r", type=int, default=16, help="adapter rank of the lora-* methods (model.lora defaults "
                   "otherwise: alpha 32, the attention and MLP projections; peft's initialisation, B = 0)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--isolation", choices=("subprocess", "inprocess"), default="subprocess")
    p.add_argument("--warm-runs", type=int, default=0, help="runs of a method before its peak memory is measured "
                   "(0: the cold first run, allocator growth included; 1: the steady state of a training loop)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and batch (smoke test)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: run one method, print JSON


def main(args: argparse.Namespace) -> int:
    if args.tiny:
        args.hidden, args.layers, args.heads, args.intermediate, args.vocab = 32, 2, 4, 64, 64
        args.batch, args.prompt_len, args.response_len = 2, 4, 24
        args.candidates, args.sketch_dim = "4,8,16", 512
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; choose from {METHODS}")
    cands = [int(c) for c in args.candidates.split(",") if c.strip()]
    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if args.warm_runs < 0:
        raise ValueError("--warm-runs must be >= 0")
    if args.worker is not None:
        sys.stdout.write(json.dumps(_measure_memory(args, args.worker, cands)) + "\n")
        return 0
    if "plain" not in methods:
        methods.insert(0, "plain")  # every ratio is against it
    memory: dict[str, dict[str, Any]] = {}
    for m in methods:
        log.info("bench audit: peak memory of %s (%s)", m, args.isolation)
        memory[m] = _spawn(args, m) if args.isolation == "subprocess" else _measure_memory(args, m, cands)
    timing = _time_methods(args, methods, cands)
    report = _report(args, cands, memory, timing)
    sys.stdout.write(report["table"] + "\n")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def _spawn(args: argparse.Namespace, method: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "adwin.cli", "bench", "audit", "--worker", method]
    for key in ("hidden", "layers", "heads", "intermediate", "vocab", "batch", "prompt_len", "response_len"):
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    argv += ["--candidates", args.candidates, "--sketch-dim", str(args.sketch_dim), "--lora-r", str(args.lora_r)]
    argv += ["--device", args.device, "--seed", str(args.seed), "--warm-runs", str(args.warm_runs)]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    out = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    """Reset VmHWM to the current resident set (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _build(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from adwin.audit.alignment import ProbeBatch

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.prompt_len + args.response_len + 8,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).to(args.device).eval()
    g = torch.Generator().manual_seed(args.seed)
    n, p, r = args.batch, args.prompt_len, args.response_len
    length = p + r
    ids = torch.randint(3, args.vocab, (n, length), generator=g)
    am = torch.ones(n, length, dtype=torch.long)
    rm = torch.zeros(n, length, dtype=torch.long)
    rm[:, p:] = 1
    teacher = -torch.rand(n, length, generator=g) * 4 * rm  # log q of each realized token
    batch = ProbeBatch(ids.to(args.device), am.to(args.device), rm.to(args.device), teacher.to(args.device))
    return model, batch


def _lora(args: argparse.Namespace, model: Any) -> Any:
    """``model`` wrapped with adapters of rank ``--lora-r`` (in place: pass a copy to keep the plain model)."""
    from adwin.config import LoraSection
    from adwin.student.lora import apply_lora

    return apply_lora(model, LoraSection(r=args.lora_r))




def _runner(args: argparse.Namespace, method: str, cands: list[int], model: Any, batch: Any) -> Any:
    """A no-argument callable running ``method`` once; returns its cosines ({} for the plain pass)."""
    from adwin.audit.alignment import audit
    from adwin.objectives.losses import reverse_kl_pg, token_logprobs

    def plain() -> dict[int, float]:
        # one training step's forward+backward of the same loss on the same batch, into .grad
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logp = token_logprobs(logits, batch.input_ids)  # (B, L)
        reverse_kl_pg(logp, batch.teacher_logprobs, batch.response_mask.float()).sum().backward()
        del logits, logp
        model.zero_grad(set_to_none=True)
        return {}

    def run() -> dict[int, float]:
        name = method.removeprefix(LORA)
        if name == "plain":
            return plain()
        name = "fast" if name == "fast-macro" else name
        res = audit(
            model,
            batch,
            cands,
            method=name,
            macro=method == "fast-macro",
            sketch_dim=args.sketch_dim,
            seed=args.seed,
        )
        return res.cosines

    return run


def _sync(args: argparse.Namespace) -> None:
    import torch

    if str(args.device).startswith("cuda"):
        torch.cuda.synchronize()


def _measure_memory(args: argparse.Namespace, method: str, cands: list[int]) -> dict[str, Any]:
    """Peak memory of one run of ``method`` above what the process held just before it."""
    import gc

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model, batch = _build(args)
    if method.startswith(LORA):
        model = _lora(args, model)
    run = _runner(args, method, cands, model, batch)
    cuda = str(args.device).startswith("cuda")
    for _ in range(args.warm_runs):
        run()
    gc.collect()
    reset_ok = True
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = (_proc_status_kib("VmRSS") or 0) * 1024
        reset_ok = _reset_hwm()
    cosines = run()
    _sync(args)
    peak_abs = torch.cuda.max_memory_allocated() if cuda else (_proc_status_kib("VmHWM") or 0) * 1024
    return {
        "method": method,
        "peak_bytes": max(0, peak_abs - base),
        "peak_abs_bytes": peak_abs,
        "base_bytes": base,
        "hwm_reset": reset_ok,
        "cosines": {str(k): v for k, v in cosines.items()},
        "params": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "pid": os.getpid(),
    }


def _time_methods(
    args: argparse.Namespace, methods: list[str], cands: list[int]
) -> dict[str, dict[str, Any]]:
    """Wall and CPU time of every method, interleaved round-robin (one warm-up round), so a change in
    machine load during the run hits all methods alike."""
    import torch
    from tqdm import tqdm

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model, batch = _build(args)
    lora = _lora(args, copy.deepcopy(model)) if any(m.startswith(LORA) for m in methods) else None
    runs = {m: _runner(args, m, cands, lora if m.startswith(LORA) else model, batch) for m in methods}
    out: dict[str, dict[str, Any]] = {m: {"wall_s": [], "cpu_s": [], "cosines": {}} for m in methods}
    for i in tqdm(range(args.repeats + 1), desc="audit bench rounds", file=sys.stderr):
        for m in methods:
            w0, c0 = time.perf_counter(), time.process_time()
            cosines = runs[m]()
            _sync(args)
            w1, c1 = time.perf_counter(), time.process_time()
            if i > 0:
                out[m]["wall_s"].append(w1 - w0)
                out[m]["cpu_s"].append(c1 - c0)
            out[m]["cosines"] = {str(k): v for k, v in cosines.items()}
    for r in out.values():
        r["median_wall_s"] = statistics.median(r["wall_s"])
        r["median_cpu_s"] = statistics.median(r["cpu_s"])
    out["_threads"] = {"threads": torch.get_num_threads()}
    return out


def _report(
    args: argparse.Namespace,
    cands: list[int],
    memory: dict[str, dict[str, Any]],
    timing: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    threads = timing.pop("_threads")["threads"]
    mib = 1024 * 1024
    pt, pm = timing["plain"], memory["plain"]
    ref = timing.get("reference", {}).get("cosines")

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else float("nan")

    header = (
        f"{'method':<11} {'wall s':>8} {'x plain':>8} {'cpu s':>8} {'x plain':>8} "
        f"{'peak MiB':>9} {'x plain':>8} {'abs MiB':>8} {'max|dcos|':>10}"
    )
    lines = [header, "-" * len(header)]
    rows = []
    for m, t in timing.items():
        mem = memory[m]
        dcos = None
        if ref and t["cosines"] and m != "reference":
            dcos = max(abs(t["cosines"][k] - ref[k]) for k in ref)
        row = {
            "method": m,
            **t,
            **{k: v for k, v in mem.items() if k not in ("method", "cosines")},
            "wall_ratio": ratio(t["median_wall_s"], pt["median_wall_s"]),
            "cpu_ratio": ratio(t["median_cpu_s"], pt["median_cpu_s"]),
            "mem_ratio": ratio(mem["peak_bytes"], pm["peak_bytes"]),
            "max_abs_dcos_vs_reference": dcos,
        }
        rows.append(row)
        lines.append(
            f"{m:<11} {t['median_wall_s']:>8.3f} {row['wall_ratio']:>8.2f} {t['median_cpu_s']:>8.3f} "
            f"{row['cpu_ratio']:>8.2f} {mem['peak_bytes'] / mib:>9.1f} {row['mem_ratio']:>8.2f} "
            f"{mem['peak_abs_bytes'] / mib:>8.1f} {'' if dcos is None else f'{dcos:.2e}':>10}"
        )
    setup = (
        f"model: Llama {pm['params'] / 1e6:.1f}M params (hidden {args.hidden}, {args.layers} layers, vocab "
        f"{args.vocab}); batch {args.batch} x ({args.prompt_len} prompt + {args.response_len} response); "
        f"candidates {cands}; sketch_dim {args.sketch_dim}; device {args.device}; threads {threads}; "
        f"times: median of {args.repeats} interleaved rounds (+1 warm-up); memory: {args.isolation}, after "
        f"{args.warm_runs} warm-up run(s)"
    )
    return {"setup": setup, "rows": rows, "table": setup + "\n" + "\n".join(lines)}
