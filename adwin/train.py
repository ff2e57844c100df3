"""Distill a student with adaptive prefix windows.

With no flags, trains on the built-in task on CPU with the embedded controller (its HTTP API and
dashboard are served on 127.0.0.1; the URL is printed), shows a progress bar and ends with a summary
table. Every run writes runs/<name>/ (config.json, config_source.txt, metrics.jsonl, summary.json,
checkpoints).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported inside the functions at run time: `adwin train --help` stays fast
    from adwin.config import ConfigSource, TrainConfig

log = logging.getLogger(__name__)

CONFIG_SOURCE_FILE = "config_source.txt"  # in the run folder: which YAML the run's config.json came from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PRESET|YAML",
                        help="a shipped preset by name (default, fixed, full, linear, qwen3-4b-math, ...: the files "
                             "of configs/) or a path to a YAML file; default: the 'default' preset, from any folder")
    parser.add_argument("--window-policy", metavar="SPEC",
                        help="window policy: adwin | full | fixed:W | linear:START:STEP | surprise (teacher-surprise horizon, no gradients; overrides window.*)")
    parser.add_argument("--threshold", type=float, metavar="TAU",
                        help="ADWIN cosine threshold in (0, 1]: the shortest window whose prefix-full cosine reaches it wins")
    parser.add_argument("--steps", type=int, help="optimizer steps to run")
    parser.add_argument("--seed", type=int, help="seed for sampling, data order and probe selection")
    parser.add_argument("--out", metavar="DIR", help="folder for run outputs (default: runs/); the run goes to DIR/<name>")
    parser.add_argument("--name", help="run name (folder under --out)")
    parser.add_argument("--controller-url", metavar="URL",
                        help="use a running `adwin controller serve` instead of the embedded controller")
    parser.add_argument("--wandb", choices=["off", "offline", "online"],
                        help="also log to Weights & Biases (offline works without network)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any config field as a dotted override, e.g. --set rollout.max_response_len=64 (repeatable)")
    parser.add_argument("--profile", choices=["default", "tiny"], default="default",
                        help="size of the built-in task's models when the config says 'builtin' (tiny: for smoke tests)")
    parser.add_argument("--log-stdout", action="store_true", help="print one metrics line per step")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-serve", action="store_true", help="do not serve the embedded controller over HTTP")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue RUN_DIR from its latest checkpoint (config from RUN_DIR/config.json; "
                             "flags still override, e.g. --steps to extend)")
    parser.add_argument("--probe-backend", choices=["auto", "inline", "thread", "ray", "rollout"],
                        help="where probe rounds run: auto (default: rollout on CUDA, thread elsewhere), thread (a "
                             "background thread with its own student replica), inline (in the step; seeded runs "
                             "reproduce exactly), ray (Ray actors, separate processes: fastest on CPU with small "
                             "models; local cluster unless --ray-address) or rollout (rows of the next step's "
                             "rollout call, within its window)")
    parser.add_argument("--ray-address", metavar="ADDR", help="Ray cluster for --probe-backend ray (default: start a local one)")
    parser.add_argument("--scheduler", choices=["sync", "asyncopd"],
                        help="sync: the prefix-window trainer; asyncopd: streaming rollout/teacher/learner pipeline "
                             "(AsyncOPD; loss.name reverse_kl_mc or reverse_kl_pg)")
    parser.add_argument("--nproc", type=int, metavar="N",
                        help="data-parallel training on N processes of this machine: relaunches this command "
                             "under torchrun (gloo on CPU, NCCL on CUDA, one GPU per rank); the same as "
                             "`torchrun --nproc_per_node N -m adwin train ...`")
    parser.add_argument("--asyncopd-workers", choices=["thread", "ray"],
                        help="where AsyncOPD rollout workers' engines run (ray: one Ray actor per worker)")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from adwin.config import apply_policy_spec, parse_set

    ov = parse_set(args.set)
    if args.window_policy:
        apply_policy_spec(ov, args.window_policy)
    simple = {"window.threshold": args.threshold, "steps": args.steps, "seed": args.seed, "out_dir": args.out,
              "name": args.name, "controller.url": args.controller_url, "logging.wandb": args.wandb,
              "probes.backend": args.probe_backend, "probes.ray_address": args.ray_address,
              "scheduler": args.scheduler, "asyncopd.workers": args.asyncopd_workers}
    ov.update({k: v for k, v in simple.items() if v is not None})
    if args.log_stdout:
        ov["logging.stdout"] = True
    if args.no_progress:
        ov["logging.progress"] = False
    if args.no_serve:
        ov["controller.serve"] = False
    return ov


def config_error(e: Exception) -> str:
    """One line per invalid field: ``field.path: message (got value)``."""
    from pydantic import ValidationError

    if not isinstance(e, ValidationError):
        return str(e)
    parts = []
    for err in e.errors():
        # a key that is not a plain name (e.g. "\\n" from a hand-written YAML) is quoted, so the message stays one line
        loc = ".".join(str(x) if isinstance(x, int) or str(x).isidentifier() else repr(x) for x in err["loc"]) or "config"
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
        parts.append(f"{loc}: {' '.join(str(err['msg']).split())}{got}")
    return "invalid config: " + "; ".join(parts)


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from adwin.config import ConfigSource, load_config, load_source
    from adwin.loop.distributed import launched_world
    from adwin.policies.base import WindowConfigError

    resume = Path(args.resume) if getattr(args, "resume", None) else None
    nproc = getattr(args, "nproc", None)
    try:
        if nproc is not None and nproc < 1:
            raise ValueError(f"--nproc must be at least 1, got {nproc}")
        world = nproc or launched_world()
        overrides = _overrides(args)
        if resume is not None:  # the run's own resolved config; it lives where it already is
            path = resume / "config.json"
            if not path.is_file():
                raise ValueError(f"--resume {resume}: not a run folder (no config.json)")
            overrides.update({"out_dir": str(resume.parent), "name": resume.name})
            cfg, source = load_config(path, overrides, world=world), ConfigSource(path.resolve())
            log.info("config: %s", source.describe())
        else:
            cfg, source = load_source(args.config, overrides, world=world)
    except (ValidationError, WindowConfigError, ValueError) as e:
        sys.stderr.write(f"adwin train: {config_error(e)}\n")
        return 2
    from adwin.backends import BackendUnavailable, check_backends
    from adwin.loop.sharding import check_data_parallel
    from adwin.student.lora import require_peft

    try:
        check_backends(cfg)
        check_data_parallel(cfg, world)
        if cfg.model.lora is not None:
            require_peft()  # LoraUnavailable names model.lora
    except (BackendUnavailable, ValueError) as e:
        sys.stderr.write(f"adwin train: {e}\n")
        return 2
    if nproc is not None and nproc > 1 and launched_world() == 1:
        # the ranks get the backend chosen here by name: they neither choose nor log it again
        named = ["--probe-backend", "inline"] if args.probe_backend is None and cfg.probes.backend == "inline" else []
        return launch(nproc, [*(getattr(args, "argv", None) or sys.argv[1:]), *named])
    return run(cfg, profile=args.profile, resume=resume, source=None if resume is not None else source)


def launch(nproc: int, argv: list[str] | None) -> int:
    """Run this command again under torchrun with ``nproc`` ranks on this machine (rendezvous on 127.0.0.1)."""
    import subprocess

    from adwin.loop.distributed import free_port

    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    skip = False
    for a in argv:  # the same command without --nproc: each rank is one process of the group
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "adwin", *rest]
    return subprocess.run(cmd, check=False).returncode


def open_controller(cfg: TrainConfig, checkpoint: Path | None = None) -> tuple[Any, Any, str | None]:
    """The controller the run talks to, a stop callback for its HTTP server, and its dashboard URL.

    A remote controller is wrapped in degraded mode (``adwin.runtime.resilient_controller``); an embedded one
    resuming from ``checkpoint`` reopens the checkpoint's database snapshot (``adwin.runtime.resume``).
    """
    from adwin import controller as ctl
    from adwin.runtime.resilient_controller import ResilientController
    from adwin.runtime.resume import open_resumed_controller

    if cfg.controller.url:
        remote = ctl.RemoteController(cfg.controller.url, token=cfg.controller.token)
        return ResilientController(remote), None, cfg.controller.url
    controller = open_resumed_controller(checkpoint) if checkpoint is not None else ctl.Controller()
    if not cfg.controller.serve:
        return controller, None, None
    try:
        url, stop = ctl.serve_in_thread(controller, port=cfg.controller.port, token=cfg.controller.token)
    except (RuntimeError, OSError):  # port taken: any free port is as good for a local dashboard
        url, stop = ctl.serve_in_thread(controller, port=0, token=cfg.controller.token)
    return controller, stop, url


def run(cfg: TrainConfig, profile: str = "default", resume: Path | None = None,
        source: ConfigSource | None = None) -> int:
    """One process of the run: the whole run, or one rank of a data-parallel run started by torchrun
    (rank 0 alone opens the controller, serves the dashboard, shows progress and writes the summary).
    ``source`` is written to the run folder as ``config_source.txt``; a resumed run keeps
    the one its first start wrote."""
    from transformers.utils import logging as hf_logging

    from adwin.loop.distributed import init_distributed

    hf_logging.disable_progress_bar()  # weight loading/saving bars would drown the training bar
    dist, device = init_distributed(cfg.model.device)
    try:
        if device != cfg.model.device:  # cuda: each rank on its own GPU
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"device": device})})
        if source is not None and dist.is_main:
            run_dir = Path(cfg.out_dir) / cfg.name
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / CONFIG_SOURCE_FILE).write_text(source.describe() + "\n")
        code = _run(cfg, profile, resume, dist)
        # rank 0 hosts the rendezvous store: no rank tears the group down while another still uses it
        dist.barrier()
        return code
    finally:
        dist.close()


def _run(cfg: TrainConfig, profile: str, resume: Path | None, dist: Any) -> int:
    import torch
    from rich.console import Console

    from adwin.loop.parts import limit_threads
    from adwin.loop.trainer import load_parts, train
    from adwin.runtime.summary import render, summarize

    console = Console(stderr=False)
    # The built-in models are known to be tiny, so their thread limit applies before loading (preparing
    # them is compute too); any other student is measured once loaded. ``main`` checked the backends.
    builtin_cpu = cfg.model.device == "cpu" and cfg.model.student == "builtin"
    if builtin_cpu:
        torch.set_num_threads(1)  # the rule of limit_threads, decided without the model
    checkpoint = None
    if resume is not None:
        from adwin.runtime.checkpoint import latest_checkpoint
        from adwin.runtime.rank_state import check_resumable
        from adwin.runtime.resume import check_extension

        checkpoint = latest_checkpoint(resume)
        if checkpoint is None:
            raise ValueError(f"--resume {resume}: no complete checkpoint-<step> folder to resume from")
        check_extension(checkpoint, cfg.steps, cfg.optim.schedule)
        check_resumable(checkpoint, dist.world, cfg.model.sharding, cfg.rollout.seeding)
    parts = load_parts(cfg, profile)  # loads and checks models, tokenizers and prompts before any training compute
    if not builtin_cpu:
        limit_threads(parts.student, cfg.model.device)
    controller, stop, url = open_controller(cfg, checkpoint) if dist.is_main else (None, None, None)
    if url:
        console.print(f"controller + dashboard: [bold]{url}[/bold]")
    bar = _progress(cfg) if dist.is_main else None
    try:
        if cfg.scheduler == "asyncopd":
            from adwin.trainer_adapters.asyncopd.train import train_asyncopd

            result = train_asyncopd(cfg, controller, parts, on_step=bar.update if bar else None, resume=checkpoint)
        else:
            result = train(cfg, controller, parts, on_step=bar.update if bar else None, resume=checkpoint, dist=dist)
    finally:
        if bar:
            bar.close()
        if stop is not None:
            stop()
    if not dist.is_main:
        return 0
    summary = summarize(result.history, result.initial_eval, result.final_eval, result.totals)
    summary["run_id"] = result.run_id
    summary["models"] = parts.models
    student_dir = result.student_dir  # the run shell's export, whichever schedule trained
    if student_dir is not None:
        summary["student_dir"] = str(student_dir)
    if getattr(result, "asyncopd", None):
        summary["asyncopd"] = result.asyncopd
        summary["throughput_tokens_per_s"] = result.asyncopd.get("throughput_tokens_per_s")
        summary["pipeline_overlap"] = result.asyncopd.get("overlap", {}).get("pipeline/overlap")
    (result.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    render(summary, console)
    console.print(f"run folder: {result.run_dir}")
    if student_dir is not None:
        console.print(f"student (transformers folder, from_pretrained loads it): {student_dir}")
    return 0


class _Bar:
    """tqdm bar showing step, window, loss and the latest accuracy."""

    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="train", unit="step", dynamic_ncols=True)
        self.acc: float | None = None

    def update(self, step: int, m: dict[str, Any]) -> None:
        if "eval/accuracy" in m:
            self.acc = float(m["eval/accuracy"])
        post = {"W": int(m.get("window/current", 0)), "loss": f"{m.get('loss/total', float('nan')):.3f}"}
        if self.acc is not None:
            post["acc"] = f"{self.acc:.3f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _progress(cfg: TrainConfig) -> _Bar | None:
    return _Bar(cfg.steps) if cfg.logging.progress else None
