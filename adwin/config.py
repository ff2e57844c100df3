"""Typed run configuration. YAML presets in ``configs/`` map onto ``TrainConfig`` one to one.

Its layer sits above the math (objectives, audit, policies, sampling) and below the controller
(``LAYERS`` in tests/test_packaging.py): it imports the window policies to validate them. Every invalid value
fails at load time with a pydantic ``ValidationError`` naming the field and its allowed range.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, field_validator, model_validator

from adwin.config_common import (  # noqa: F401  (re-exported: part of the config API)
    ISHighField,
    ISLowField,
    ISMethodField,
    _Strict,
    check_is_bounds,
)
from adwin.config_engines import DEFAULT_VLLM_GPU_MEMORY, MAX_VLLM_GPU_MEMORY, check_engines
from adwin.config_loss import BEHAVIOR_LOSSES, LossConfig  # noqa: F401  (re-exported)
from adwin.config_oapl import OAPLSection, check_oapl, lag_of  # noqa: F401  (lag_of: part of the config API)
from adwin.policies.base import WindowConfigError
from adwin.policies.registry import PolicyName, build_policy, is_audited, parse_policy_spec
from adwin.tasks.suite import DEFAULT_TASK, TASK_NAMES


class ModelConfig(_Strict):
    """Student and teacher checkpoints. ``builtin`` means the built-in task's cached tiny models."""

    student: str = "builtin"
    # routing key -> teacher path; a single teacher uses the key "default".
    teachers: dict[str, str] = Field(default_factory=lambda: {"default": "builtin"})
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    # Which prepared built-in models to use; independent of the run seed, so `--seed 1` trains the same
    # student and teacher (a new value prepares a new set, which takes minutes).
    builtin_seed: int = Field(0, ge=0)
    teacher_backend: Literal["hf", "vllm"] = Field(
        "hf", description="teacher scoring: transformers forwards, or vLLM prompt logprobs (realized tokens only: "
        "loss.name reverse_kl_pg; docs/decisions.md 'Rollout engines')")
    vllm_gpu_memory: float = Field(DEFAULT_VLLM_GPU_MEMORY, gt=0.0, le=MAX_VLLM_GPU_MEMORY, description="fraction of the GPU each vLLM engine "
                                   "reserves (the rollout engine; one per teacher checkpoint with teacher_backend vllm)")
    # memory options of the student's training forward (docs/design.md, "Memory options")
    gradient_checkpointing: bool = Field(False, description="recompute decoder-layer activations in the backward "
                                         "(HF activation checkpointing): less activation memory, one more forward of the layers")
    autocast: Literal["off", "bf16"] = Field("off", description="bf16 autocast of the student's training and "
                                             "audit forwards over float32 weights (cuda or cpu)")

    @model_validator(mode="after")
    def _autocast_over_float32(self) -> ModelConfig:
        if self.autocast != "off" and self.dtype != "float32":
            raise ValueError(f"model.autocast: {self.autocast} autocast computes in bf16 over float32 weights; with "
                             f"model.dtype={self.dtype!r} the weights already set the precision: set "
                             "model.autocast: off (or model.dtype: float32)")
        if self.autocast != "off" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"model.autocast: bf16 autocast runs on cuda or cpu, got model.device={self.device!r}; "
                             "set model.autocast: off")
        return self


class DataConfig(_Strict):
    task: Literal["builtin", "jsonl"] = "builtin"
    # which built-in task (adwin.tasks.suite, docs/task.md); each has its own prepared models
    builtin_task: str = DEFAULT_TASK
    path: str | None = None  # JSONL with "prompt", optional "answer", optional routing key
    eval_path: str | None = None
    route_key: str = "teacher"
    n_eval: int = Field(64, ge=1, le=100_000)
    max_prompt_len: int = Field(128, ge=1, le=131_072)

    @field_validator("builtin_task")
    @classmethod
    def _known_task(cls, name: str) -> str:
        if name not in TASK_NAMES:
            raise ValueError(f"unknown built-in task {name!r}; expected one of {', '.join(TASK_NAMES)}")
        return name

    @model_validator(mode="after")
    def _jsonl_needs_path(self) -> DataConfig:
        if self.task == "jsonl" and not self.path:
            raise ValueError("data.path is required when data.task is 'jsonl'")
        if self.task == "jsonl" and self.builtin_task != DEFAULT_TASK:
            raise ValueError("data.builtin_task is read only when data.task is 'builtin'; drop it for a JSONL task")
        return self


class RolloutConfig(_Strict):
    backend: Literal["hf", "vllm"] = "hf"
    prompts_per_step: int = Field(16, ge=1, le=65_536)
    samples_per_prompt: int = Field(2, ge=1, le=1024)
    max_response_len: int = Field(320, ge=1, le=1_048_576)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seeding: Literal["batch", "per_sample"] = Field(
        "batch", description="batch: HF generate draws a batch's sampling noise from the global RNG; per_sample: "
        "each row from its own generator (run seed, step, row), so a row's tokens do not depend on its batch "
        "(data-parallel runs then match the 1-process run; adwin.sampling.seeding)")


class SurpriseSection(_Strict):
    """``surprise`` policy: teacher-surprise horizon (``adwin.policies.surprise`` measures, the policy smooths)."""

    threshold: float = Field(-9.2, lt=0.0, description="a token is lost when the teacher's logprob of it is below")
    rank: int = Field(8, ge=1, le=1_000_000, description="per sample: the position of the rank-th lost token")
    quantile: float = Field(0.9, ge=0.0, le=1.0, description="quantile of those positions over the batch")
    scale: float = Field(1.25, gt=0.0, le=100.0, description="proposal = scale x quantile")
    ema: float = Field(0.3, gt=0.0, le=1.0, description="weight of the newest proposal in the EMA")
    min: int | None = Field(None, ge=1, description="None: the smallest candidate")
    max: int | None = Field(None, ge=1, description="None: rollout.max_response_len")


class WindowSection(_Strict):
    """Window policy: ``adwin`` (default), ``full``, ``fixed`` (``window``), ``linear`` (``start``, ``step``),
    ``surprise`` (``surprise.*``)."""

    policy: PolicyName = "adwin"
    candidates: list[int] = Field(default_factory=lambda: [32, 64, 128, 192, 256])
    threshold: float = Field(0.7, gt=0.0, le=1.0)
    initial: int | None = Field(None, ge=1)
    window: int | None = Field(None, ge=1)
    start: int | None = Field(None, ge=1)
    step: int | None = Field(None, ge=0)
    surprise: SurpriseSection = Field(default_factory=SurpriseSection)
    confidence: bool = Field(False, description="audited policies: change the window only when a candidate's "
                             "cosine interval (audit.ci_level) is clear of the threshold, never on one that "
                             "straddles it")

    def policy_options(self) -> dict[str, float]:
        """Policy-specific numbers for ``build_policy(options=...)``: the sub-section named after the policy
        (only ``surprise`` has one), else none; ``confidence`` when set."""
        section = getattr(self, self.policy, None)
        opts = {k: float(v) for k, v in section.model_dump().items() if v is not None} \
            if isinstance(section, BaseModel) else {}
        return opts | ({"confidence": 1.0} if self.confidence else {})


class ProbeConfig(_Strict):
    batch_size: int = Field(8, ge=1, le=65_536, description="P: completed probes per audit")
    staleness_limit: int = Field(5, ge=1, le=10_000, description="S: optimizer steps before forced completion")
    offers_per_step: int = Field(4, ge=0, le=65_536, description="unfinished prefixes the controller may take per step")
    max_active: int = Field(32, ge=1, le=1_000_000)
    backend: Literal["inline", "thread", "ray"] = "thread"
    selection: Literal["uniform", "stratified"] = "uniform"
    offer_finished: Literal["at_horizon", "always"] = Field(
        "at_horizon", description="offer rollouts that finished inside the window as already complete probes: "
        "only at the full horizon (the paper: probes are unfinished prefixes) or always (the audit batch then "
        "samples all rollouts, and a window most rollouts fit into still gets audited)")
    lookahead: int = Field(4, ge=0, le=65_536, description="windowed-FIFO look-ahead over completed probes")
    is_method: ISMethodField = "none"
    is_low: ISLowField = 0.5
    is_high: ISHighField = 2.0
    is_level: Literal["token", "prefix"] = Field(
        "token", description="probe IS weight per token: its own ratio (token) or the running product (prefix)")
    ray_address: str | None = None
    ray_num_cpus: int = Field(2, ge=1, le=4096, description="CPUs of the local Ray cluster when no ray_address")
    workers: int = Field(1, ge=1, le=1024, description="probe workers (threads or Ray actors), one round each in flight")
    fault_policy: Literal["reissue", "drop"] = Field("reissue", description="probes of a failed worker round")
    max_reissues: int = Field(2, ge=0, le=1000, description="re-issues per probe before it is dropped as lost")

    @model_validator(mode="after")
    def _is_bounds(self) -> ProbeConfig:
        check_is_bounds("probes", self.is_method, self.is_low, self.is_high)
        return self


class AuditConfig(_Strict):
    """How the alignment audit runs (``adwin.audit``); cost and agreement of each option in docs/benchmarks.md."""

    method: Literal["fast", "reference", "sketch"] = "fast"
    metric: Literal["identity", "adam"] = "identity"
    sketch_dim: int = Field(16_384, ge=1, le=1 << 24)
    params: str = Field("all", description="'all' or 'top:N': gradients of the last N transformer blocks and "
                        "the head only (the backward stops early)")
    estimator: Literal["batch", "debiased"] = Field(
        "batch", description="batch cosine, or without the same-sample Gram terms (needs per-sample gradients)")
    macro: bool = Field(False, description="also per-sample (macro) cosines: telemetry only, ~2.7x the audit's cost")
    ci_level: float | None = Field(None, gt=0.0, lt=1.0, description="bootstrap interval per candidate cosine; "
                                   "None = no interval (window.confidence needs one)")
    ci_samples: int = Field(200, ge=10, le=100_000, description="bootstrap resamples of the probe batch")
    every: int = Field(1, ge=1, le=1_000_000, description="audit one ready probe batch in this many (the others "
                       "are consumed unaudited and the window stays)")
    skip_margin: float = Field(0.0, ge=0.0, lt=1.0, description="skip audits while the last skip_history audits "
                               "had every cosine this far from the threshold; 0 = off")
    skip_history: int = Field(2, ge=1, le=1000)
    max_skips: int = Field(4, ge=0, le=1_000_000, description="consecutive skips before an audit is forced")
    @model_validator(mode="before")
    @classmethod
    def _retired_loss(cls, data: Any) -> Any:
        # run folders written before audit.loss was removed carry its one value; --resume must still load them
        if isinstance(data, dict) and data.get("loss") == "reverse_kl_pg":
            data = {k: v for k, v in data.items() if k != "loss"}
        return data

    @model_validator(mode="after")
    def _check_params(self) -> AuditConfig:
        from adwin.audit.params import parse_audit_params

        parse_audit_params(self.params)  # raises naming audit.params
        return self


class OptimConfig(_Strict):
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    grad_clip: float = Field(1.0, ge=0.0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    max_bad_steps: int = Field(3, ge=1, le=1_000_000,
                               description="consecutive non-finite (skipped) steps before the run stops")
    micro_batch_size: int | None = Field(None, ge=1, le=1_000_000, description="rows per forward/backward inside "
                                         "a step (gradient accumulation, the same update as the whole batch; the "
                                         "audit's too); None = the whole step batch at once")


class EvalConfig(_Strict):
    every: int = Field(10, ge=0, le=1_000_000, description="0 = only at start and end")
    n_problems: int = Field(64, ge=1, le=1_000_000)
    k: int = Field(1, ge=1, le=1024, description="mean@k samples per problem")
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    batch_size: int = Field(64, ge=1, le=65_536, description="rows generated and scored together")
    # rows that stopped leave the batch at once (adwin/sampling/compact.py): the same samples' distribution at
    # a fraction of the cost when lengths vary; False = transformers' generate, run until a batch's longest row
    # stops. With rollout.backend: vllm evaluation samples on vLLM either way (it never computes stopped rows)
    compact: bool = True


class ControllerSection(_Strict):
    url: str | None = None  # None = embedded controller in-process
    serve: bool = True  # serve the embedded controller's API + dashboard on 127.0.0.1
    port: int = Field(8470, ge=0, le=65_535)
    token: str | None = None


class LoggingConfig(_Strict):
    wandb: Literal["off", "offline", "online"] = "off"
    stdout: bool = False
    progress: bool = True


class AsyncOPDSection(_Strict):
    """``scheduler: asyncopd`` knobs (AsyncOPD Appendix G); the one source of them (``build_asyncopd`` reads
    this section). A sync run refuses values other than the defaults: it would ignore them."""

    queue_depth: int = Field(4, ge=0, le=4096, description="tau: the feeder holds at most (tau + 1) * B permits")
    rollout_workers: int = Field(1, ge=1, le=1024)
    workers: Literal["thread", "ray"] = "thread"  # where rollout workers' engines run
    worker_batch: int = Field(16, ge=1, le=65_536, description="active requests per rollout worker")
    teacher_batch: int = Field(16, ge=1, le=65_536)
    pad_to_horizon: bool = True  # learner tensors padded to max prompt + max response length
    throughput_warmup: int = Field(5, ge=1, le=1_000_000, description="learner updates left out of throughput")
    wait_timeout_s: float = Field(600.0, gt=0.0, description="no pipeline progress for this long: fail")
    ray_address: str | None = None  # None: start a local Ray instance
    sync_every: int = Field(1, ge=1, le=1_000_000, description="push the learner's weights to the rollout workers "
                            "every this many updates (keep-mode; 1: AsyncOPD's sync after every update)")


ASYNCOPD_LOSSES = ("reverse_kl_mc", "reverse_kl_pg", "oapl")


class TrainConfig(_Strict):
    name: str = "adwin-builtin"
    seed: int = Field(0, ge=0)
    steps: int = Field(40, ge=1, le=10_000_000)
    out_dir: str = "runs"
    checkpoint_every: int = Field(0, ge=0, description="0 = only at the end")
    scheduler: Literal["sync", "asyncopd"] = "sync"
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

    @model_validator(mode="after")
    def _window_fits_horizon(self) -> TrainConfig:
        w = self.window
        try:
            build_policy(
                w.policy,
                max_len=self.rollout.max_response_len,
                candidates=w.candidates,
                threshold=w.threshold,
                initial=w.initial,
                window=w.window,
                start=w.start,
                step=w.step,
                options=w.policy_options(),
            )
        except WindowConfigError as e:
            raise ValueError(f"window: {e} (rollout.max_response_len={self.rollout.max_response_len})") from e
        if w.confidence and not is_audited(w.policy):
            raise ValueError(f"window.confidence: policy {w.policy!r} does not decide from audits; unset it")
        if w.confidence and self.audit.ci_level is None:
            raise ValueError("window.confidence needs audit.ci_level (e.g. 0.9): the interval it decides on")
        if self.scheduler == "asyncopd" and self.loss.name not in ASYNCOPD_LOSSES:
            raise ValueError(f"loss.name: scheduler 'asyncopd' trains with {ASYNCOPD_LOSSES} (old-to-current IS "
                             f"on cached behavior logprobs, or OAPL), got {self.loss.name!r}")
        _asyncopd_needs_its_scheduler(self)
        _asyncopd_has_no_probe_workers(self)
        _per_sample_scope(self)
        _memory_options_need_sync(self)
        check_oapl(self)
        check_engines(self)
        return self


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


def _asyncopd_has_no_probe_workers(cfg: TrainConfig) -> None:
    """AsyncOPD probes are full-length pipeline requests audited on the learner: the probe workers' knobs (the sync
    trainer's extension rounds) have nothing to run there. Every other probe, audit and window setting applies."""
    if cfg.scheduler != "asyncopd":
        return
    default = ProbeConfig()
    for name in ("backend", "workers", "ray_address", "ray_num_cpus", "fault_policy", "max_reissues"):
        if getattr(cfg.probes, name) != getattr(default, name):
            raise ValueError(f"probes.{name}: scheduler 'asyncopd' generates probes in its own pipeline and audits "
                             f"them on the learner, it runs no probe workers (got {getattr(cfg.probes, name)!r}); "
                             f"drop it, or train with scheduler: sync")


def _per_sample_scope(cfg: TrainConfig) -> None:
    """``rollout.seeding: per_sample`` seeds what the synchronous trainer samples with HF ``generate``."""
    if cfg.rollout.seeding != "per_sample":
        return
    if cfg.scheduler != "sync" or cfg.rollout.backend != "hf":
        raise ValueError("rollout.seeding: per_sample seeds HF generate in the sync scheduler; set scheduler: sync "
                         "and rollout.backend: hf, or rollout.seeding: batch")
    probing = is_audited(cfg.window.policy) and cfg.probes.offers_per_step > 0
    if probing and cfg.probes.backend != "inline":
        raise ValueError(f"rollout.seeding: per_sample seeds probe rounds on the inline backend only (probe workers "
                         f"sample with their replica's RNG); set probes.backend: inline, got {cfg.probes.backend!r}")


def _memory_options_need_sync(cfg: TrainConfig) -> None:
    """The AsyncOPD learner trains on whole update batches in full precision: refuse what it would ignore."""
    if cfg.scheduler != "asyncopd":
        return
    for field, value, default in (("optim.micro_batch_size", cfg.optim.micro_batch_size, None),
                                  ("model.gradient_checkpointing", cfg.model.gradient_checkpointing, False),
                                  ("model.autocast", cfg.model.autocast, "off")):
        if value != default:
            raise ValueError(f"{field}: the AsyncOPD learner (scheduler 'asyncopd') does not apply it (got "
                             f"{value!r}); drop it, or train with scheduler: sync")


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Load a YAML preset (or defaults) and apply dotted overrides like ``{"window.threshold": 0.8}``."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:  # one line naming the file and line, not the parser's multi-line dump
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            raise ValueError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', None) or e})") from e
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: top level must be a mapping of config sections")
        data = loaded or {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):  # e.g. ``rollout: 5`` and then ``rollout.top_p``
                raise ValueError(f"{dotted}: {'.'.join(parents[: i + 1])} is not a config section (got {node!r})")
        node[leaf] = value
    return TrainConfig.model_validate(data)


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as dotted overrides, each value parsed as YAML.

    New ``window.candidates`` without a ``window.initial`` also reset the preset's initial window to
    ``None`` (the largest new candidate): the preset's initial window belongs to the preset's candidates.
    """
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    if "window.candidates" in overrides:
        overrides.setdefault("window.initial", None)
    return overrides


def policy_overrides(name: str, **fields: Any) -> dict[str, Any]:
    """Dotted overrides that switch the window policy to ``name`` with its ``fields``. A policy that does not
    audit also unsets ``window.confidence``: a preset that turns it on for ADWIN (configs/default.yaml) must not
    block a switch to ``full`` or ``fixed`` (setting both by hand is still refused, naming the field)."""
    out: dict[str, Any] = {"window.policy": name} | {f"window.{k}": v for k, v in fields.items()}
    if not is_audited(name):
        out["window.confidence"] = False
    return out


def apply_policy_spec(overrides: dict[str, Any], spec: str) -> dict[str, Any]:
    """Turn ``--window-policy fixed:64`` into dotted overrides for the window section."""
    fields = parse_policy_spec(spec)
    overrides |= policy_overrides(fields.pop("name"), **fields)
    return overrides


def default_config_path() -> Path | None:
    """``configs/default.yaml`` in the working folder, if present (the README's commands run from the repo root)."""
    path = Path("configs/default.yaml")
    return path if path.is_file() else None
