"""``run_asyncopd``: one AsyncOPD-scheduled distillation run from a ``TrainConfig`` and a controller.

What it wires (everything else is reused from the synchronous trainer: parts loading, run spec,
optimizer, loggers): a prompt source over ``parts.train_prompts``; ``rollout_workers`` snapshots of the
student (``HFRolloutEngine``); the teacher stage; the learner on the live student (the IS reverse-KL
learner, or with ``loss.name: oapl`` the OAPL learner on whole prompt groups, the scheduler syncing the
workers every ``loss.oapl.lag`` updates and discarding what an older inference policy generated); and
``ControllerWindowHooks`` so that windows and probes come from the ADWIN controller (probes only under
the ``adwin`` policy). B = ``rollout.prompts_per_step * rollout.samples_per_prompt`` samples per update,
m = ``loss.mc_samples`` cached actions per position.

Scheduler options are the config's ``asyncopd`` section (``AsyncOPDSection``; defaults: the paper's queue
depth tau = 4), or the ``options`` argument when given (another ``AsyncOPDSection``). ``asyncopd.workers: ray`` runs each rollout worker's
engine in a Ray actor (``ray_engine``); the scheduler's worker threads stay on the driver.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adwin.config import ASYNCOPD_LOSSES, AsyncOPDSection, TrainConfig, lag_of
from adwin.controller.api import ControllerAPI
from adwin.decode.static_cache import LEDGER as COMPILES
from adwin.decode.static_cache import without_compiled
from adwin.loop.accounting import TokenLedger
from adwin.loop.learner import FaultCounter
from adwin.loop.parts import Parts, load_parts, run_spec
from adwin.probes.client import InlineAuditor
from adwin.probes.settings import configure_audits
from adwin.runtime.checkpoint import save_checkpoint, seed_everything
from adwin.runtime.metrics_log import open_loggers
from adwin.runtime.resilient_controller import controller_metrics, drain_controller
from adwin.runtime.resume import (
    CONTROLLER_DB,
    read_state,
    resume_from,
    run_state,
    snapshot_controller,
    truncate_metrics,
)
from adwin.sampling.rollout import encode_prompts, eos_ids, pad_id_of
from adwin.student.optimizer import build_optimizer
from adwin.student.structure import is_lora
from adwin.trainer_adapters.asyncopd.hf import (
    HFLearner,
    HFRolloutEngine,
    HFTeacherScorer,
)
from adwin.trainer_adapters.asyncopd.items import PromptSpec
from adwin.trainer_adapters.asyncopd.oapl import OAPLLearner
from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler, SchedulerConfig
from adwin.trainer_adapters.hooks import ControllerWindowHooks

log = logging.getLogger(__name__)


def prompt_source(parts: Parts, max_prompt_len: int) -> Callable[[], PromptSpec]:
    lock = threading.Lock()  # PromptStream is not thread-safe; the feeder is its only caller, but be safe

    def nxt() -> PromptSpec:
        with lock:
            p = parts.train_prompts.next_batch(1)[0]
        ids = encode_prompts(parts.tokenizer, [p.prompt], max_prompt_len)[0]
        return PromptSpec(p.id, ids, p.route, p.answer)

    return nxt


@dataclass
class AsyncOPDRun:
    """Everything ``build_asyncopd`` wired, before it runs; ``start``: the updates a resumed checkpoint had done."""

    scheduler: AsyncOPDScheduler
    hooks: ControllerWindowHooks
    learner: HFLearner | OAPLLearner
    engines: list[Any]
    options: AsyncOPDSection
    run_id: str
    run_dir: Path
    lr_scheduler: Any
    optimizer: Any = None
    close: Callable[[], None] | None = None  # releases worker resources (Ray actors)
    tokenizer: Any = None
    controller: Any = None  # the one passed in: an embedded controller's database goes into checkpoints
    prompts: Any = None  # the training prompt stream (its position is run state)
    ledger: TokenLedger = field(default_factory=lambda: TokenLedger(1))
    faults: FaultCounter = field(default_factory=lambda: FaultCounter(3))
    initial_eval: dict[str, float] = field(default_factory=dict)
    start: int = 0

    def checkpoint(self, step: int) -> Path:
        """``<run_dir>/checkpoint-<step>`` in the synchronous trainer's layout with its run state
        (``adwin.runtime.resume``) and the request stream's (``requests.RequestStream``), taken between two
        updates with the feeder paused, so the prompt position, the requests to replay and the controller's
        database are one consistent cut (docs/decisions.md, "Resuming AsyncOPD")."""
        client = self.hooks.client
        with self.scheduler.paused():
            policy = self.hooks.controller.get_run(self.run_id).policy_state  # cached in an outage
            extra = run_state(client.pool, self.ledger, self.prompts, self.faults, client.schedule, client.budget)
            extra["asyncopd"] = self.scheduler.requests.state_dict()
            return save_checkpoint(
                self.run_dir, step, self.learner.student, self.tokenizer, self.optimizer, self.lr_scheduler, policy,
                extra=extra, meta={"run_id": self.run_id, "initial_eval": self.initial_eval, "world_size": 1,
                                   "sharding": "ddp"},
                write_files=lambda d: snapshot_controller(self.controller, d / CONTROLLER_DB))

    def resume(self, checkpoint: Path) -> None:
        """Load ``checkpoint`` back in place (``adwin.runtime.resume.resume_from``, RNG streams last) and set
        ``start``; the in-flight probes it lists are reported dropped."""
        client, extra = self.hooks.client, {}
        self.initial_eval, self.start = resume_from(
            checkpoint, self.learner.student, self.optimizer, self.lr_scheduler, client.pool, self.ledger,
            self.prompts, self.faults, client.schedule, client.budget, lora=is_lora(self.learner.student),
            on_extra=extra.update)
        requests = extra["asyncopd"]
        self.scheduler.requests.load_state_dict(requests)
        dropped = client.drop_probes(requests["dropped_probes"], self.start)
        log.info("asyncopd resumes at update %d: %d request(s) to generate again, %d in-flight probe(s) dropped",
                 self.start, len(requests["replay"]), dropped)


def build_asyncopd(cfg: TrainConfig, controller: ControllerAPI, *, parts: Parts | None = None,
                   options: AsyncOPDSection | None = None, profile: str = "default",
                   engine_cls: type[HFRolloutEngine] = HFRolloutEngine, resume: Path | None = None) -> AsyncOPDRun:
    """Register the run and build the stages; ``engine_cls`` is the seam for another rollout engine.
    ``resume``: a checkpoint of this run (its controller reopened on the checkpoint's database,
    ``adwin.runtime.resume.open_resumed_controller``): the run keeps its id and continues that state
    (``AsyncOPDRun.resume``); rollout engines draw from seeds of the resumed update, not the start's again."""
    if cfg.loss.name not in ASYNCOPD_LOSSES:  # the config refuses it too; a hand-built config may not
        raise ValueError(f"--scheduler asyncopd trains with {ASYNCOPD_LOSSES} (old-to-current IS on cached "
                         f"behavior logprobs, or OAPL), not loss.name={cfg.loss.name!r}")
    opts = options or cfg.asyncopd
    parts = parts or load_parts(cfg, profile)
    seed_everything(cfg.seed)
    state = read_state(resume) if resume is not None else None
    run_id = state["run_id"] if state else controller.register_run(run_spec(cfg)).run_id
    seed = cfg.seed + 1_000_003 * (int(state["step"]) if state else 0)  # per worker: + 1000 * i
    optimizer, lr_scheduler = build_optimizer(cfg, parts.student)
    eos = eos_ids(parts.student, parts.tokenizer)
    pad = pad_id_of(parts.tokenizer, eos)
    r = cfg.rollout
    width = cfg.data.max_prompt_len + r.max_response_len if opts.pad_to_horizon else None
    m = cfg.loss.mc_samples if cfg.loss.name == "reverse_kl_mc" else 0
    engine_kw = {"eos": eos, "pad_id": pad, "temperature": r.temperature, "top_p": r.top_p, "mc_samples": m,
                 "compile": r.compile, "max_len": cfg.data.max_prompt_len + r.max_response_len}
    close: Callable[[], None] | None = None
    if r.backend == "vllm":  # untested on hardware: see adwin.backends
        from adwin.trainer_adapters.asyncopd.vllm import vllm_engines

        engines = vllm_engines(str(parts.student.name_or_path), opts.rollout_workers, eos=set(eos),
                               temperature=r.temperature, top_p=r.top_p, mc_samples=m, seed=seed,
                               dtype=cfg.model.dtype, gpu_memory_utilization=cfg.model.vllm_gpu_memory)
    elif opts.workers == "ray":
        from adwin.trainer_adapters.asyncopd.ray_engine import ray_engines

        engines, close = ray_engines(parts.student, opts.rollout_workers, engine_kw, seed=seed,
                                     address=opts.ray_address, engine_cls=engine_cls)
    else:  # "thread" (AsyncOPDSection.workers admits nothing else)
        engines = [engine_cls(without_compiled(copy.deepcopy(parts.student)), **engine_kw, seed=seed + 1000 * i)
                   for i in range(opts.rollout_workers)]
    oapl = cfg.loss.name == "oapl"
    learner: HFLearner | OAPLLearner
    if oapl:
        tok = parts.tokenizer
        learner = OAPLLearner(parts.student, optimizer, lr_scheduler, cfg, pad_id=pad, width=width,
                              checker=parts.checker, decode=lambda ids: tok.decode(ids, skip_special_tokens=True))
    else:
        learner = HFLearner(parts.student, optimizer, lr_scheduler, cfg, pad_id=pad, width=width)
    probing = cfg.probing
    hooks = ControllerWindowHooks(controller, run_id, max_len=r.max_response_len, probing=probing,
                                  report_steps=False, offer_finished=cfg.probes.offer_finished)
    if probing:  # the sync trainer's audit: settings, schedule, drift; on the learner's weights between updates
        configure_audits(hooks.client, cfg, parts.teachers, pad_id=pad, student=parts.student)
        hooks.client.auditor = InlineAuditor(parts.student, optimizer)
    scfg = SchedulerConfig(batch_size=r.prompts_per_step * r.samples_per_prompt, queue_depth=opts.queue_depth,
                           samples_per_prompt=r.samples_per_prompt, max_response_len=r.max_response_len,
                           worker_batch=opts.worker_batch, teacher_batch=opts.teacher_batch,
                           wait_timeout_s=opts.wait_timeout_s, throughput_warmup=opts.throughput_warmup,
                           sync_every=lag_of(cfg), groups=oapl)
    sched = AsyncOPDScheduler(scfg, prompt_source(parts, cfg.data.max_prompt_len), engines,
                              HFTeacherScorer(parts.teachers, pad), learner, hooks)
    built = AsyncOPDRun(sched, hooks, learner, engines, opts, run_id, Path(cfg.out_dir) / cfg.name, lr_scheduler,
                        optimizer, close, parts.tokenizer, controller, parts.train_prompts,
                        TokenLedger(r.max_response_len), FaultCounter(cfg.optim.max_bad_steps))
    if resume is not None:
        built.resume(resume)  # last: it restores the RNG streams
    return built


def run_asyncopd(cfg: TrainConfig, controller: ControllerAPI, *, parts: Parts | None = None,
                 options: AsyncOPDSection | None = None, profile: str = "default",
                 on_step: Callable[[int, dict[str, Any]], None] | None = None,
                 built: AsyncOPDRun | None = None,
                 enrich: Callable[[int, dict[str, float]], dict[str, float]] | None = None) -> dict[str, Any]:
    """Distill for ``cfg.steps`` learner updates under the AsyncOPD scheduler; returns the summary dict.

    The summary (also written to ``<out_dir>/<name>/summary.json``) holds the run id, the throughput
    (response tokens/s after ``throughput_warmup`` updates), the pipeline overlap, the staleness
    distribution, the permit bound as observed, probe/audit counts and the per-update history.
    ``built``: run what ``build_asyncopd`` returned (tests inspect the stages afterwards). ``enrich(step, m)``
    returns extra metrics merged into the step's row before it is logged (evaluation, token ledger).
    ``"logged"`` holds the per-update rows as logged. ``optim.max_bad_steps`` skipped (non-finite) updates in a
    row stop the run with ``NumericalFault`` after a checkpoint of the last good state, as in the synchronous
    trainer.
    """
    b = built or build_asyncopd(cfg, controller, parts=parts, options=options, profile=profile)
    ctl = b.hooks.controller  # the hooks' degraded-mode wrapper: telemetry survives an outage too
    if b.start:
        truncate_metrics(b.run_dir, b.start)  # rows the stopped run logged after its checkpoint come again
    sinks = open_loggers(cfg, b.run_dir, ctl, b.run_id)  # JSONL + the controller's step telemetry
    faults = b.faults
    started = time.perf_counter()

    def log_step(step: int, m: dict[str, float]) -> None:
        m = {**m, "optim/lr": b.lr_scheduler.get_last_lr()[0]} | faults.record(bool(m["optim/skipped"]))
        if faults.exhausted:  # skipped updates never touched the weights: this checkpoint is the last good state
            sinks.log(step, m | controller_metrics(ctl))
            raise faults.fault(step, b.checkpoint(step + 1))
        if enrich is not None:
            m |= enrich(step, m)
        m["time/wall"] = time.perf_counter() - started
        m |= controller_metrics(ctl)  # controller/* gauges (degraded mode)
        m |= COMPILES.step_metrics()  # rollout.compile in this process (Ray workers compile in theirs)
        sinks.log(step, m)
        if (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) or step == cfg.steps - 1:
            b.checkpoint(step + 1)  # after logging, so the controller snapshot holds this update's telemetry
        if on_step is not None:
            on_step(step, m)

    try:
        out = b.scheduler.run(cfg.steps, on_step=log_step, start=b.start)
    finally:
        sinks.close()
        if b.close is not None:
            b.close()
        drain_controller(ctl)  # deliver the writes buffered during an outage (bounded wait)
    out |= {"run_id": b.run_id, "run_dir": str(b.run_dir), "scheduler": "asyncopd", "options": b.options.model_dump(),
            "batch_size": b.scheduler.cfg.batch_size, "loss": cfg.loss.name,
            "mc_samples": cfg.loss.mc_samples if cfg.loss.name == "reverse_kl_mc" else 0,
            "oapl": cfg.loss.oapl.model_dump() if cfg.loss.name == "oapl" else None,
            "probes": dict(b.hooks.counts), "learner_shapes": sorted(set(b.learner.shapes)),
            "wall_s": time.perf_counter() - started, "logged": list(sinks.history)}
    b.run_dir.mkdir(parents=True, exist_ok=True)
    (b.run_dir / "summary.json").write_text(json.dumps({k: v for k, v in out.items() if k not in ("history", "logged")},
                                                       indent=2, default=str))
    log.info("asyncopd run %s: %d updates, throughput %s tok/s, overlap %.2f", b.run_id, out["updates"],
             out["throughput_tokens_per_s"], out["overlap"].get("pipeline/overlap", 0.0))
    return out
