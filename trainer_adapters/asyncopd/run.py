"""``run_asyncopd``: one AsyncOPD-scheduled distillation run from a ``TrainConfig`` and a controller.

The run around the updates is the synchronous trainer's run shell (``adwin.loop.shell``: registration, optimizer,
seeds, loggers, evaluation cadence, checkpoints and resume, the export, the token ledger, the fault counter); the
pipeline reports each update to it. What this module wires besides: a prompt source over ``parts.train_prompts``; ``rollout_workers`` snapshots of the
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
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adwin.config import ASYNCOPD_LOSSES, AsyncOPDSection, TrainConfig, lag_of
from adwin.controller.api import ControllerAPI
from adwin.decode.static_cache import without_compiled
from adwin.loop.parts import Parts, load_parts
from adwin.loop.shell import RunShell, open_shell
from adwin.probes.client import InlineAuditor, ProbeClient
from adwin.probes.settings import configure_audits
from adwin.runtime.resume import read_state
from adwin.sampling.rollout import encode_prompts, eos_ids, pad_id_of
from adwin.trainer_adapters.asyncopd.hf import (
    HFLearner,
    HFRolloutEngine,
    HFTeacherScorer,
)
from adwin.trainer_adapters.asyncopd.items import PromptSpec
from adwin.trainer_adapters.asyncopd.oapl import OAPLLearner
from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler, SchedulerConfig, UpdateDelta
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
class RequestState:
    """The request stream as the run shell checkpoints it (``adwin.loop.shell.Pipeline``): taken with the feeder
    paused between two submissions, so the prompt position, the requests to replay and the controller's database
    are one consistent cut; on resume the in-flight probes it lists are reported dropped (docs/decisions.md,
    "Resuming AsyncOPD")."""

    scheduler: AsyncOPDScheduler
    client: ProbeClient
    key: str = "asyncopd"

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self.scheduler.paused():
            yield

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.requests.state_dict()

    def load_state_dict(self, state: dict[str, Any], start: int) -> None:
        self.scheduler.requests.load_state_dict(state)
        dropped = self.client.drop_probes(state["dropped_probes"], start)
        log.info("asyncopd resumes at update %d: %d request(s) to generate again, %d in-flight probe(s) dropped",
                 start, len(state["replay"]), dropped)


@dataclass
class AsyncOPDRun:
    """Everything ``build_asyncopd`` wired, before it runs; ``shell``: the run around the updates."""

    scheduler: AsyncOPDScheduler
    hooks: ControllerWindowHooks
    learner: HFLearner | OAPLLearner
    engines: list[Any]
    options: AsyncOPDSection
    shell: RunShell

    @property
    def run_id(self) -> str:
        return self.shell.run_id

    @property
    def run_dir(self) -> Path:
        return self.shell.run_dir


class UpdateReport:
    """What the pipeline tells the shell after each update (on the dispatcher thread): the token ledger's row
    (this update's items, the probes completed since the previous one), each stage's busy seconds since the
    previous row, and the probes' fate so far (``hooks``' counts: audited or expired past ``S``)."""

    def __init__(self, shell: RunShell, scheduler: AsyncOPDScheduler, hooks: ControllerWindowHooks) -> None:
        self.shell, self.scheduler, self.hooks = shell, scheduler, hooks
        self._busy: dict[str, float] = {}

    def __call__(self, step: int, m: dict[str, float]) -> dict[str, float]:
        delta: UpdateDelta | None = self.scheduler.last_update  # OAPL's items may be fewer than B: probes
        assert delta is not None and delta.step == step
        for it in delta.probes:  # a fresh probe's length is a full rollout's
            self.shell.probe_generated(it.response_len)
        batch = delta.items
        view = SimpleNamespace(response_ids=[it.tokens for it in batch],
                               finished=[it.finish_reason != "window" for it in batch])
        out = self.shell.record_rollouts(view, int(m.get("window/current", self.shell.cfg.rollout.max_response_len)),
                                         windows=[it.window for it in batch])
        out["rollout/prompt_tokens"] = float(sum(len(it.prompt_ids) for it in batch))  # FLOPs estimates read it
        for stage in ("rollout", "teacher", "train"):  # they overlap: their sum may exceed the wall time
            total = m.get(f"pipeline/busy_{stage}_s", 0.0)
            out[f"time/{stage}"] = total - self._busy.get(stage, 0.0)
            self._busy[stage] = total
        if self.hooks.probing:
            counts = self.hooks.counts
            out |= {"probe/audited": float(counts["audited"]), "probe/expired": float(counts["expired"])}
        return out


def build_asyncopd(cfg: TrainConfig, controller: ControllerAPI, *, parts: Parts | None = None,
                   options: AsyncOPDSection | None = None, profile: str = "default",
                   engine_cls: type[HFRolloutEngine] = HFRolloutEngine, resume: Path | None = None) -> AsyncOPDRun:
    """Open the run shell and build the stages; ``engine_cls`` is the seam for another rollout engine.
    ``resume``: a checkpoint of this run (its controller reopened on the checkpoint's database,
    ``adwin.runtime.resume.open_resumed_controller``): the run keeps its id and continues that state, the
    request stream's included (``RequestState``); rollout engines draw from seeds of the resumed update, not the
    start's again."""
    if cfg.loss.name not in ASYNCOPD_LOSSES:  # the config refuses it too; a hand-built config may not
        raise ValueError(f"--scheduler asyncopd trains with {ASYNCOPD_LOSSES} (old-to-current IS on cached "
                         f"behavior logprobs, or OAPL), not loss.name={cfg.loss.name!r}")
    opts = options or cfg.asyncopd
    parts = parts or load_parts(cfg, profile)
    shell = open_shell(cfg, controller, parts, resume=resume, sampler="eval")  # evaluations on the learner's weights
    optimizer, lr_scheduler = shell.optimizer, shell.lr_scheduler
    seed = cfg.seed + 1_000_003 * (int(read_state(resume)["step"]) if resume else 0)  # per worker: + 1000 * i
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
    hooks = ControllerWindowHooks(controller, shell.run_id, max_len=r.max_response_len, probing=probing,
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
    if close is not None:
        shell.closers.append(close)
    # the shell restores a checkpoint last: it restores the RNG streams
    shell.start(hooks.client, pipeline=RequestState(sched, hooks.client), telemetry=hooks.controller)
    return AsyncOPDRun(sched, hooks, learner, engines, opts, shell)


def run_asyncopd(cfg: TrainConfig, controller: ControllerAPI, *, parts: Parts | None = None,
                 options: AsyncOPDSection | None = None, profile: str = "default",
                 on_step: Callable[[int, dict[str, Any]], None] | None = None,
                 built: AsyncOPDRun | None = None, evaluate: bool = False,
                 initial_eval: dict[str, float] | None = None) -> dict[str, Any]:
    """Distill for ``cfg.steps`` learner updates under the AsyncOPD scheduler; returns the summary dict.

    The summary (``adwin train`` writes it into ``summary.json``) holds the run id, the throughput
    (response tokens/s after ``throughput_warmup`` updates), the pipeline overlap, the staleness
    distribution, the permit bound as observed, probe/audit counts and the per-update history.
    ``built``: run what ``build_asyncopd`` returned (tests inspect the stages afterwards). Each update is reported
    to the run shell (``adwin.loop.shell``): the fault count (``optim.max_bad_steps`` skipped updates in a row stop
    the run with ``NumericalFault`` after a checkpoint of the last good state), the token ledger, the run's gauges,
    the periodic checkpoint; with ``evaluate``, the evaluation cadence too (``initial_eval``: the start-of-run
    evaluation, already computed on the same student, problems and seed). ``"logged"`` holds the per-update rows as
    logged, ``"student_dir"`` the exported student.
    """
    b = built or build_asyncopd(cfg, controller, parts=parts, options=options, profile=profile)
    shell = b.shell
    if evaluate:  # on the dispatcher thread, before the pipeline starts
        shell.initial_evaluation(initial_eval)
    report = UpdateReport(shell, b.scheduler, b.hooks)
    started = time.perf_counter()

    def log_step(step: int, m: dict[str, float]) -> None:
        m = m | shell.count_faults(step, m)  # skipped updates never touched the weights
        m |= report(step, m)
        if evaluate and shell.eval_due(step):  # rollout workers keep generating with their snapshots meanwhile
            m |= shell.evaluate()
        m = shell.log(step, m)
        if on_step is not None:
            on_step(step, m)

    try:
        out = b.scheduler.run(cfg.steps, on_step=log_step, start=shell.start_step)
    except BaseException:
        shell.close()
        raise
    student = shell.finish()
    out |= {"run_id": b.run_id, "run_dir": str(b.run_dir), "scheduler": "asyncopd", "options": b.options.model_dump(),
            "batch_size": b.scheduler.cfg.batch_size, "loss": cfg.loss.name,
            "mc_samples": cfg.loss.mc_samples if cfg.loss.name == "reverse_kl_mc" else 0,
            "oapl": cfg.loss.oapl.model_dump() if cfg.loss.name == "oapl" else None,
            "probes": dict(b.hooks.counts), "learner_shapes": sorted(set(b.learner.shapes)),
            "wall_s": time.perf_counter() - started, "logged": list(shell.sinks.history), "student_dir": str(student)}
    log.info("asyncopd run %s: %d updates, throughput %s tok/s, overlap %.2f", b.run_id, out["updates"],
             out["throughput_tokens_per_s"], out["overlap"].get("pipeline/overlap", 0.0))
    return out
