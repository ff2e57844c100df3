"""``TrainConfig``, the whole run, and the rules across its sections: combinations no loop can honour are
refused at load time, naming the field, the value and the fix (docs/decisions.md, "Rollout engines",
"OAPL"); settings a loop would read nothing of are refused the same way.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field, model_validator

from adwin.audit.budget import pool_limit
from adwin.config.base import _Strict
from adwin.config.loss import LossConfig
from adwin.config.sections import (
    DEFAULT_VLLM_GPU_MEMORY,
    IN_STEP_BACKENDS,
    MAX_VLLM_GPU_MEMORY,
    AsyncOPDSection,
    AuditConfig,
    ControllerSection,
    DataConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ProbeConfig,
    RolloutConfig,
    WindowSection,
)
from adwin.config.teacher_server import check_served_teacher
from adwin.objectives.loss_table import ASYNCOPD_LOSSES, LOSSES
from adwin.policies.base import WindowConfigError
from adwin.policies.registry import build_policy, is_audited, trains_whole_response

log = logging.getLogger(__name__)


class TrainConfig(_Strict):
    name: str = Field("adwin-builtin", description="run name: its folder under out_dir")
    seed: int = Field(0, ge=0, description="seed of sampling, data order and probe selection")
    steps: int = Field(40, ge=1, le=10_000_000, description="optimizer steps (learner updates)")
    out_dir: str = Field("runs", description="folder of run folders")
    checkpoint_every: int = Field(0, ge=0, description="0 = only at the end")
    scheduler: Literal["sync", "asyncopd"] = Field("sync", description="sync: the prefix-window trainer; "
                                                   "asyncopd: the streaming rollout/teacher/learner pipeline")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    window: WindowSection = Field(default_factory=WindowSection)
    probes: ProbeConfig = Field(default_factory=ProbeConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    controller: ControllerSection = Field(default_factory=ControllerSection)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    asyncopd: AsyncOPDSection = Field(default_factory=AsyncOPDSection)

    @property
    def probing(self) -> bool:
        """Whether this run offers probes and audits them: its window policy decides from audits and the
        controller may take offers. Every loop and rule asks this, never the two fields."""
        return is_audited(self.window.policy) and self.probes.offers_per_step > 0

    @property
    def lag(self) -> int:
        """Learner updates between two syncs of the rollout workers' weights (1 = every update)."""
        return self.loss.oapl.lag if self.loss.name == "oapl" else self.asyncopd.sync_every

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.scheduler == "sync" and self.probes.backend == "auto":
            self.probes.backend = auto_probe_backend(self)
        _window_fits_horizon(self)
        _loss_fits_scheduler(self)
        _asyncopd_needs_its_scheduler(self)
        _per_sample_scope(self)
        _sync_only_fields(self)
        check_oapl(self)
        check_engines(self)
        m = self.model
        check_served_teacher(m.teacher_backend, m.teachers, m.teacher_server, self.loss.name)
        check_read_settings(self)
        _round_fits_active(self)
        return self


def auto_probe_backend(cfg: TrainConfig) -> str:
    """What ``probes.backend: auto`` runs in the sync trainer (docs/decisions.md, "Default probe backend"): on CUDA
    ``rollout`` (its rows ride the rollout call within its window: no decode steps of their own), elsewhere
    ``thread``; but ``rollout`` with ``rollout.backend: vllm`` (its requests go into the engine's call), the
    in-step backend of the device under ``rollout.seeding: per_sample`` (the only ones it seeds; ``inline`` off
    CUDA), and ``thread`` with ``probes.workers`` > 1 (the in-step backends have no workers)."""
    cuda = cfg.model.device.split(":")[0] == "cuda"
    if cfg.rollout.backend == "vllm":
        return "rollout"
    if cfg.rollout.seeding == "per_sample":
        return "rollout" if cuda else "inline"
    if cfg.probes.workers > 1:
        return "thread"
    return "rollout" if cuda else "thread"


def lag_of(cfg: TrainConfig) -> int:
    """``cfg.lag`` (kept for callers that take a function)."""
    return cfg.lag


def _window_fits_horizon(cfg: TrainConfig) -> None:
    w = cfg.window
    try:
        build_policy(w.policy, max_len=cfg.rollout.max_response_len, options=w.policy_options(), **w.knobs())
    except WindowConfigError as e:
        raise ValueError(f"window: {e} (rollout.max_response_len={cfg.rollout.max_response_len})") from e
    if w.confidence and not is_audited(w.policy):
        raise ValueError(f"window.confidence: policy {w.policy!r} does not decide from audits; unset it")
    if w.confidence and cfg.audit.ci_level is None:
        raise ValueError("window.confidence needs audit.ci_level (e.g. 0.9): the interval it decides on")
    _unresolved_is_judged(cfg)
    if not w.confidence:
        for name, default in (("noise_hold", False), ("grow_to", "sure")):
            if getattr(w, name) != default:
                raise ValueError(f"window.{name} refines window.confidence's rule: set window.confidence: true, "
                                 f"or leave window.{name} at {default!r}")


def _unresolved_is_judged(cfg: TrainConfig) -> None:
    """A fallback that moves the window (``horizon``, ``noise_rule``) needs audits that measure their resolution
    (per-sample vectors), and the noise rule the batch estimator's pure-noise readings (the debiased estimator's
    are 0). ``hold``, the default, is allowed without them: such audits are not judged, and the rule decides."""
    w, a = cfg.window, cfg.audit
    if w.unresolved in ("hold", "decide") or not is_audited(w.policy):
        return
    if a.ci_level is None and a.estimator == "batch":
        raise ValueError(f"window.unresolved: {w.unresolved!r} judges audits on their signal z and noise scale, which "
                         "only per-sample vectors measure: set audit.ci_level (e.g. 0.9) or audit.estimator: "
                         "debiased, or window.unresolved: decide")
    if w.unresolved == "noise_rule" and a.estimator != "batch":
        raise ValueError("window.unresolved: 'noise_rule' reads the batch estimator's pure-noise readings; with "
                         f"audit.estimator: {a.estimator!r} use hold, horizon or decide")


def _round_fits_active(cfg: TrainConfig) -> None:
    """A budgeted offer round of ``pool_limit · P`` probes must fit in ``probes.max_active`` (docs/decisions.md,
    "Decision budget"), or the controller would refuse its last batches and the pooled decision never form."""
    if cfg.audit.budget is None or not cfg.probing:
        return
    p = cfg.probes
    k = pool_limit(cfg.audit.pool_max, p.offers_per_step, p.staleness_limit, p.batch_size)
    if p.max_active < k * p.batch_size:
        raise ValueError(f"probes.max_active: audit.budget pools up to {k} batches of probes.batch_size={p.batch_size} "
                         f"(audit.pool_max={cfg.audit.pool_max}, probes.offers_per_step={p.offers_per_step}, "
                         f"probes.staleness_limit={p.staleness_limit}), so it must be >= {k * p.batch_size}, got "
                         f"{p.max_active}; raise it, lower audit.pool_max, or set audit.budget: null")


def _loss_fits_scheduler(cfg: TrainConfig) -> None:
    if cfg.scheduler == "asyncopd" and not LOSSES[cfg.loss.name].asyncopd:
        raise ValueError(f"loss.name: scheduler 'asyncopd' trains with {ASYNCOPD_LOSSES} (old-to-current IS "
                         f"on cached behavior logprobs, or OAPL), got {cfg.loss.name!r}")


def _asyncopd_needs_its_scheduler(cfg: TrainConfig) -> None:
    if cfg.scheduler == "asyncopd":
        return
    if cfg.loss.name == "reverse_kl_mc":  # the sync step has no cached MC actions: it would fail at step 0
        raise ValueError("loss.name: 'reverse_kl_mc' trains on the MC actions the AsyncOPD rollout engines "
                         "cache; set scheduler: asyncopd (--scheduler asyncopd) or pick another loss")
    default = AsyncOPDSection()
    changed = [k for k in AsyncOPDSection.model_fields if getattr(cfg.asyncopd, k) != getattr(default, k)]
    if changed:
        raise ValueError(f"asyncopd.{changed[0]}: read only by scheduler 'asyncopd' (got scheduler "
                         f"{cfg.scheduler!r}); drop it or set scheduler: asyncopd (--scheduler asyncopd)")


def _per_sample_scope(cfg: TrainConfig) -> None:
    """``rollout.seeding: per_sample`` seeds what the synchronous trainer samples with HF ``generate``."""
    if cfg.rollout.seeding != "per_sample":
        return
    if cfg.scheduler != "sync" or cfg.rollout.backend != "hf":
        raise ValueError("rollout.seeding: per_sample seeds HF generate in the sync scheduler; set scheduler: sync "
                         "and rollout.backend: hf, or rollout.seeding: batch")
    if cfg.probing and cfg.probes.backend not in IN_STEP_BACKENDS:
        raise ValueError(f"rollout.seeding: per_sample seeds probe rounds on the inline and rollout backends only "
                         f"(probe workers sample with their replica's RNG); set probes.backend: inline or rollout, "
                         f"got {cfg.probes.backend!r}")


# Fields only the synchronous schedule reads, with their defaults. Both schedulers train through one learner step
# (adwin.loop.learner: micro-batches, activation checkpointing, autocast, LoRA, the non-finite skip) inside one run
# shell (adwin.loop.shell: checkpoints in the model.sharding format, resume, export, evaluation cadence), so what
# stays here is the synchronous schedule's own: its probes are prefixes continued by probe workers (thread, Ray)
# or riding its rollout call, which may fail and be reissued. AsyncOPD's probes are fresh requests of its own
# pipeline, audited on the learner: no workers to place, size or reissue. (More than one rank is a scheduler
# rule of its own: adwin.loop.sharding.check_data_parallel.) Any other value is refused. The config reference
# (adwin.config.reference) reads its "read by" column from here.
SYNC_ONLY: dict[str, object] = {
    "probes.backend": "auto",
    "probes.workers": 1,
    "probes.ray_address": None,
    "probes.ray_num_cpus": 2,
    "probes.fault_policy": "reissue",
    "probes.max_reissues": 2,
}


def _sync_only_fields(cfg: TrainConfig) -> None:
    """What only the synchronous schedule reads (``SYNC_ONLY``) is refused under AsyncOPD, which would ignore it."""
    if cfg.scheduler != "asyncopd":
        return
    for field, default in SYNC_ONLY.items():
        section, name = field.split(".")
        value = getattr(getattr(cfg, section), name)
        if value != default:
            raise ValueError(f"{field}: scheduler 'asyncopd' does not apply it (got {value!r}; it generates "
                             "probes in its own pipeline, audited on the learner: no probe workers); drop it, or "
                             "train with scheduler: sync")


def check_oapl(cfg: TrainConfig) -> None:
    """What ``loss.name: oapl`` needs from the rest of the run, and the lag's bound on audits
    (docs/decisions.md, "OAPL")."""
    lag, knob = cfg.lag, "loss.oapl.lag" if cfg.loss.name == "oapl" else "asyncopd.sync_every"
    if lag > cfg.probes.staleness_limit and cfg.probing:
        raise ValueError(f"{knob}: probes come from weights up to {lag - 1} updates old, and probes older than "
                         f"probes.staleness_limit ({cfg.probes.staleness_limit}) never reach an audit; use {knob} "
                         f"<= {cfg.probes.staleness_limit} or a window policy that does not audit (full, fixed, linear)")
    if cfg.loss.name != "oapl":
        return
    if cfg.scheduler != "asyncopd":
        raise ValueError("loss.name: 'oapl' trains against a lagged inference policy, and the sync trainer samples "
                         "from the weights it trains at every step (no lag, no buffer to clear); set scheduler: "
                         "asyncopd (--scheduler asyncopd), where loss.oapl.lag: 1 is the on-policy case")
    if cfg.rollout.samples_per_prompt < 2:
        raise ValueError("rollout.samples_per_prompt: oapl estimates a prompt's value from its group of rollouts; "
                         "a group of 1 has advantage 0 (use >= 2; the paper uses 8)")
    if cfg.rollout.temperature != 1.0:
        raise ValueError("rollout.temperature: oapl's ln pi(y) and the sampler's ln pi_inf(y) are one distribution "
                         "only at temperature 1.0")
    if cfg.asyncopd.sync_every != 1:
        raise ValueError("asyncopd.sync_every: with loss.name oapl the lag is loss.oapl.lag; drop sync_every")
    o = cfg.loss.oapl
    if (o.reward == "task" or (o.reward == "weighted" and o.task_weight > 0)) and not trains_whole_response(
            cfg.window.policy):
        raise ValueError(f"loss.oapl.reward: the task reward checks a complete answer, which window.policy "
                         f"{cfg.window.policy!r} cuts off; use window.policy: full, or reward: teacher")


def check_engines(cfg: TrainConfig) -> None:
    """The inference engines a run starts (``rollout.backend``, ``model.teacher_backend``,
    ``model.vllm_gpu_memory``) must fit together, and with the student (``model.lora``) (docs/decisions.md,
    "Rollout engines")."""
    m, r = cfg.model, cfg.rollout
    if m.teacher_backend == "vllm":
        if cfg.scheduler != "sync":
            raise ValueError("model.teacher_backend: 'vllm' is wired into the synchronous trainer only (the "
                             "AsyncOPD teacher stage scores with full logits); set model.teacher_backend: hf or "
                             "scheduler: sync")
        if cfg.loss.name != "reverse_kl_pg":
            raise ValueError(f"model.teacher_backend: 'vllm' scores the realized tokens only (prompt logprobs); "
                             f"loss.name={cfg.loss.name!r} needs the teacher's full logits: set "
                             "model.teacher_backend: hf or loss.name: reverse_kl_pg")
    if r.backend == "vllm" and cfg.scheduler == "sync" and cfg.probing and cfg.probes.backend not in IN_STEP_BACKENDS:
        raise ValueError(f"probes.backend: {cfg.probes.backend!r} extends probes on transformers replicas of the "
                         "student, not on the vLLM engine of rollout.backend: vllm; set probes.backend: inline "
                         "(probes extended by the rollout engine after each step), rollout (probe requests in the "
                         "rollout call) or rollout.backend: hf")
    if r.backend == "vllm" and r.compile is True:
        raise ValueError("rollout.compile: true compiles transformers' decode step, and rollout.backend: vllm "
                         "decodes on vLLM (which compiles and captures its own graphs); set rollout.compile: auto "
                         "or false, or rollout.backend: hf")
    if m.lora is not None and r.backend == "vllm":
        raise ValueError("model.lora: rollout.backend 'vllm' samples from weights synced by their checkpoint names; "
                         "a LoRA student's adapters are not synced into vLLM (docs/limitations.md): set "
                         "rollout.backend: hf or drop model.lora")
    engines = vllm_engine_count(cfg)
    if engines == 0 and m.vllm_gpu_memory != DEFAULT_VLLM_GPU_MEMORY:
        raise ValueError("model.vllm_gpu_memory: read only when rollout.backend or model.teacher_backend is "
                         "'vllm'; drop it")
    if engines * m.vllm_gpu_memory > MAX_VLLM_GPU_MEMORY:
        raise ValueError(f"model.vllm_gpu_memory: {engines} vLLM engines x {m.vllm_gpu_memory} = "
                         f"{engines * m.vllm_gpu_memory:.2f} of the GPU, above {MAX_VLLM_GPU_MEMORY}; lower it to "
                         f"at most {MAX_VLLM_GPU_MEMORY / engines:.2f}")


def vllm_engine_count(cfg: TrainConfig) -> int:
    """vLLM engines the run starts on one GPU: the rollout engine, and one per distinct teacher checkpoint."""
    n = int(cfg.rollout.backend == "vllm")
    if cfg.model.teacher_backend == "vllm":
        paths = set(cfg.model.teachers.values())
        if "builtin" in paths:  # "builtin" stands for every route's prepared teacher
            from adwin import tasks

            paths = (paths - {"builtin"}) | {f"builtin:{route}" for route in tasks.ROUTES}
        n += len(paths)
    return n


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def check_read_settings(cfg: TrainConfig) -> None:
    """Refuse a setting the run's loops would read nothing of, naming it, its value and the fix."""
    p, defaults = cfg.probes, ProbeConfig()
    if p.backend != "ray":
        for field in ("ray_address", "ray_num_cpus"):
            if getattr(p, field) != getattr(defaults, field):
                raise ValueError(f"probes.{field}: read only by probes.backend: ray (got {getattr(p, field)!r} "
                                 f"with probes.backend {p.backend!r}); drop it or set probes.backend: ray "
                                 "(--probe-backend ray)")
    if p.backend in IN_STEP_BACKENDS and p.workers != defaults.workers:
        raise ValueError(f"probes.workers: the {p.backend} backend extends probes in the training step itself, no "
                         f"workers (got probes.workers={p.workers}); drop it or set probes.backend: thread or ray")
    if cfg.rollout.backend == "vllm" and not cfg.eval.compact:
        raise ValueError("eval.compact: false asks for transformers' generate, but with rollout.backend: vllm "
                         "evaluation samples on the vLLM engine (which never computes stopped rows); drop "
                         "eval.compact or set rollout.backend: hf")
    _held_out_eval(cfg)
    _horizon_fits_task(cfg)


def _horizon_fits_task(cfg: TrainConfig) -> None:
    """A built-in task's responses run to its horizon: a shorter ``rollout.max_response_len`` cuts every long one,
    which smoke runs do on purpose, so it is said rather than refused."""
    if cfg.data.task != "builtin":
        return
    from adwin.tasks.suite import get_task

    task = get_task(cfg.data.builtin_task)
    if cfg.rollout.max_response_len < task.horizon:
        _warn_once(f"rollout.max_response_len={cfg.rollout.max_response_len} is below the horizon of task "
                   f"{task.name!r} ({task.horizon} tokens): its longer responses are cut and never reach their "
                   f"answer; set rollout.max_response_len: {task.horizon} and window.candidates: "
                   f"{list(task.candidates)} (the preset configs/long.yaml does for the long tasks)")


def _held_out_eval(cfg: TrainConfig) -> None:
    """``data.n_eval`` sizes the evaluation set held out of ``data.path``, which ``eval.n_problems`` then
    evaluates: it is read only for a JSONL task without ``data.eval_path``, and never above n_problems."""
    d = cfg.data
    if d.n_eval is None:
        return
    if d.task != "jsonl" or d.eval_path:
        # a warning, not a refusal: run folders written when n_eval defaulted to 64 carry it, and --resume
        # must still load them
        source = "data.eval_path" if d.eval_path else "the built-in task's own evaluation problems"
        _warn_once(f"data.n_eval: read only for data.task: jsonl without data.eval_path (this run evaluates "
                   f"{source}; their number is eval.n_problems); data.n_eval={d.n_eval} is ignored: drop it")
        return
    if d.n_eval > cfg.eval.n_problems:
        raise ValueError(f"data.n_eval: {d.n_eval} held-out prompts but eval.n_problems={cfg.eval.n_problems} "
                         f"evaluates only that many (the rest would be neither trained on nor evaluated); set "
                         f"data.n_eval <= {cfg.eval.n_problems} or raise eval.n_problems")

