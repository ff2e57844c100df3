"""The sections of a run's configuration (``model``, ``data``, ``rollout``, ``window``, ``probes``, ...), each
validated on its own; the rules across sections are ``adwin.config.run``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from adwin.config.base import ISHighField, ISLowField, ISMethodField, OffWord, _Strict, check_is_bounds
from adwin.config.teacher_server import TeacherServerConfig
from adwin.decode.static_cache import CompileSetting
from adwin.policies.fields import DEFAULT_CANDIDATES, Candidates, PolicyKnobs
from adwin.policies.registry import PolicyName, is_audited
from adwin.policies.resolution import UNRESOLVED
from adwin.tasks.suite import DEFAULT_TASK, TASK_NAMES

DEFAULT_VLLM_GPU_MEMORY = 0.3  # ModelConfig.vllm_gpu_memory's default
MAX_VLLM_GPU_MEMORY = 0.95  # what all engines together may reserve: the learner needs the rest


LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSection(_Strict):
    """LoRA adapters on the student through peft (``adwin.student.lora``): the base weights stay frozen and
    only the adapters train, are audited and are saved (docs/decisions.md, "LoRA students")."""

    r: int = Field(16, ge=1, le=65_536, description="adapter rank")
    alpha: float = Field(32.0, gt=0.0, le=1e6, description="adapter scale numerator: the update is (alpha / r) B A")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input in the training "
                           "forward only (rollouts, probes, audits and evaluation run without it)")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: list(LLAMA_PROJECTIONS), description="module names (or name suffixes) that get "
        "adapters; default: the attention and MLP projections of Llama/Qwen/Mistral models; all-linear: every "
        "linear layer but the LM head. A name that matches no module fails at load")

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list) and (not v or any(not n.strip() for n in v) or len(set(v)) != len(v)):
            raise ValueError(f"model.lora.target_modules must be distinct non-empty module names, got {v!r}")
        return v


class ModelConfig(_Strict):
    """Student and teacher checkpoints. ``builtin`` means the built-in task's cached tiny models."""

    student: str = Field("builtin", description="student checkpoint: a transformers folder or hub-style path "
                         "already on disk; builtin = the built-in task's prepared student")
    teachers: dict[str, str] = Field(default_factory=lambda: {"default": "builtin"}, description="routing key -> "
                                     "teacher checkpoint, or server URL with teacher_backend server; one teacher "
                                     "uses the key 'default', several are chosen per prompt by data.route_key")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights' dtype of student "
                                                             "and teachers")
    device: str = Field("cpu", description="torch device of the learner (cpu, cuda, cuda:1, ...)")
    # independent of the run seed, so `--seed 1` trains the same student and teacher
    builtin_seed: int = Field(0, ge=0, description="which prepared built-in models to use (0 ships with adwin; "
                              "another value prepares a new set on this machine, which takes minutes)")
    builtin_source: Literal["shipped", "prepared"] = Field(
        "shipped", description="built-in models: shipped = the ones that ship with adwin, the same on every "
        "machine (where none ship for the task, profile and seed: this machine's own build); prepared = this "
        "machine's own build from the recipe (adwin prepare), prepared on first use")
    teacher_backend: Literal["hf", "vllm", "server"] = Field(
        "hf", description="teacher scoring: transformers forwards, vLLM prompt logprobs (realized tokens only: "
        "loss.name reverse_kl_pg; docs/decisions.md 'Rollout engines'), or servers at the URLs of model.teachers "
        "(realized tokens and top-k; docs/teacher-server.md)")
    vllm_gpu_memory: float = Field(DEFAULT_VLLM_GPU_MEMORY, gt=0.0, le=MAX_VLLM_GPU_MEMORY, description="fraction of the GPU each vLLM engine "
                                   "reserves (the rollout engine; one per teacher checkpoint with teacher_backend vllm)")
    # memory options of the student's training forward (docs/design.md, "Memory options")
    gradient_checkpointing: bool = Field(False, description="recompute decoder-layer activations in the backward "
                                         "(HF activation checkpointing): less activation memory, one more forward of the layers")
    autocast: Annotated[Literal["off", "bf16"], OffWord] = Field("off", description="bf16 autocast of the student's training and "
                                             "audit forwards over float32 weights (cuda or cpu)")
    teacher_server: TeacherServerConfig = Field(default_factory=TeacherServerConfig)
    lora: LoraSection | None = Field(None, description="LoRA adapters on the student (needs adwin[lora]); None = "
                                     "every parameter trains")
    sharding: Literal["ddp", "fsdp"] = Field("ddp", description="how the ranks of --nproc N hold the student: ddp "
                                             "= a whole replica each; fsdp = FSDP2 shards of weights, gradients "
                                             "and Adam moments (1/N each), gathered for generation and the audit; "
                                             "checkpoints in torch.distributed.checkpoint format")

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
    task: Literal["builtin", "jsonl"] = Field("builtin", description="prompts from a built-in task or a JSONL file")
    builtin_task: str = Field(DEFAULT_TASK, description="which built-in task (docs/task.md); each has its own "
                              "prepared models")
    path: str | None = Field(None, description="JSONL of training prompts: 'prompt', optional 'answer', optional "
                             "routing key")
    eval_path: str | None = Field(None, description="JSONL of evaluation prompts; None = held out from data.path")
    route_key: str = Field("teacher", description="JSONL field naming the teacher (model.teachers key) of a prompt")
    n_eval: int | None = Field(None, ge=1, le=100_000, description="JSONL without eval_path: prompts held out "
                               "from the end of data.path for evaluation; None = eval.n_problems (at most a fifth "
                               "of the file either way)")
    max_prompt_len: int = Field(128, ge=1, le=131_072, description="prompt tokens kept (longer prompts are cut)")

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
            raise ValueError(f"data.builtin_task is read only when data.task is 'builtin'; drop it for a JSONL task "
                             f"(from the command line: --set data.builtin_task={DEFAULT_TASK}, its default)")
        if self.task == "builtin":  # the built-in task makes its own prompts: a file given here would go unread
            given = next((k for k in ("path", "eval_path") if getattr(self, k) is not None), None)
            if given is not None:
                raise ValueError(f"data.{given} is read only when data.task is 'jsonl' (data.task: builtin makes its "
                                 "own prompts); set data.task: jsonl to train on the file")
        return self


class RolloutConfig(_Strict):
    backend: Literal["hf", "vllm"] = Field("hf", description="rollout engine: transformers generate, or vLLM (GPU)")
    prompts_per_step: int = Field(16, ge=1, le=65_536, description="prompts per optimizer step")
    samples_per_prompt: int = Field(2, ge=1, le=1024, description="rollouts per prompt")
    max_response_len: int = Field(320, ge=1, le=1_048_576, description="the horizon: response tokens of a full "
                                  "rollout (probes run to it)")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="sampling temperature of rollouts and probes")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling of rollouts and probes; 1 = off")
    seeding: Literal["batch", "per_sample"] = Field(
        "batch", description="batch: a batch's sampling noise comes from the global RNG, row by row in batch order; per_sample: "
        "each row from its own generator (run seed, step, row), so a row's tokens do not depend on its batch "
        "(data-parallel runs then match the 1-process run; adwin.sampling.seeding)")
    compile: CompileSetting = Field(
        "auto", description="decode the student on a static KV cache with transformers' compiled step (rollouts, "
        "probe rounds, evaluation, the AsyncOPD engine; adwin.decode.static_cache): auto = on when the "
        "student is on CUDA; a run compiles one shape per batch and cache bucket (docs/decisions.md 'Compiled "
        "decoding'); the vLLM backend refuses true. Uncompiled, rollouts, probe rounds and evaluation decode a "
        "plain float32 Llama on CPU with the lean step (adwin.decode.lean; docs/decisions.md 'The lean CPU decode "
        "step'), any other model on its own KV cache")


class SurpriseSection(_Strict):
    """``surprise`` policy: teacher-surprise horizon (``adwin.policies.surprise`` measures, the policy smooths)."""

    threshold: float = Field(-9.2, lt=0.0, description="a token is lost when the teacher's logprob of it is below")
    rank: int = Field(8, ge=1, le=1_000_000, description="per sample: the position of the rank-th lost token")
    quantile: float = Field(0.9, ge=0.0, le=1.0, description="quantile of those positions over the batch")
    scale: float = Field(1.25, gt=0.0, le=100.0, description="proposal = scale x quantile")
    ema: float = Field(0.3, gt=0.0, le=1.0, description="weight of the newest proposal in the EMA")
    min: int | None = Field(None, ge=1, description="None: the smallest candidate")
    max: int | None = Field(None, ge=1, description="None: rollout.max_response_len")


class WindowSection(_Strict, PolicyKnobs):
    """Window policy: ``adwin`` (default), ``full``, ``fixed`` (``window``), ``linear`` (``start``, ``step``),
    ``surprise`` (``surprise.*``). The policy's own fields are ``PolicyKnobs`` (adwin/policies/fields.py)."""

    policy: PolicyName = Field("adwin", description="the window policy (adwin.policies.registry)")
    candidates: Candidates = Field(default_factory=lambda: list(DEFAULT_CANDIDATES), description="increasing "
                                   "window lengths an audit picks from")
    surprise: SurpriseSection = Field(default_factory=SurpriseSection)
    confidence: bool = Field(False, description="audited policies: change the window only when a candidate's "
                             "cosine interval (audit.ci_level) is clear of the threshold, never on one that "
                             "straddles it")
    noise_hold: bool = Field(False, description="with confidence: an audit whose samples show no shared "
                             "full-gradient direction (its signal z below window.signal_z), or a candidate whose "
                             "interval contains its pure-noise reading, moves nothing (docs/decisions.md, 'The "
                             "shortest admissible window')")
    grow_to: Literal["sure", "point"] = Field("sure", description="with confidence, where a growth goes: the "
                                              "shortest longer candidate whose interval clears the threshold "
                                              "(sure) or whose point cosine does (point); else the horizon")
    signal_z: float = Field(3.0, ge=0.0, le=100.0, description="the full-gradient signal z "
                            "(adwin.audit.truth.signal_z) an audit needs to be resolved (window.unresolved), and, "
                            "with noise_hold, to move the window")
    unresolved: Literal["hold", "horizon", "noise_rule", "decide"] = Field(
        "hold", description="where the window goes after an audit whose evidence cannot resolve the full "
        "gradient's signal (its signal z below window.signal_z, or its pooled samples below "
        "window.resolve_samples x the noise scale it measured): hold (keep the window), horizon (the full "
        "horizon), noise_rule (the shortest candidate whose pure-noise reading clears the threshold; "
        "audit.estimator: batch), decide (the paper's rule on the cosines, the audit still marked unresolved). "
        "Judged only on audits with per-sample vectors (audit.ci_level or audit.estimator: debiased); "
        "docs/decisions.md, 'Unresolved audits'")
    resolve_samples: float = Field(1.0, ge=0.0, le=1000.0, description="the samples a decision must read, in units "
                                   "of the full gradient's noise scale B it measured (N >= resolve_samples x B: "
                                   "the batch Gram's signal share N / (N + B) then at least 1/2 at 1); 0 = off")

    def policy_options(self) -> dict[str, float]:
        """Policy-specific numbers for ``build_policy(options=...)``: the sub-section named after the policy
        (only ``surprise`` has one), else none; ``confidence`` when set."""
        section = getattr(self, self.policy, None)
        opts = {k: float(v) for k, v in section.model_dump().items() if v is not None} \
            if isinstance(section, BaseModel) else {}
        if is_audited(self.policy):
            opts |= {"unresolved": float(UNRESOLVED.index(self.unresolved)), "signal_z": self.signal_z,
                     "resolve_samples": self.resolve_samples}
        if not self.confidence:
            return opts
        return opts | {"confidence": 1.0, "noise_hold": float(self.noise_hold),
                       "grow_to": float(self.grow_to == "point"), "signal_z": self.signal_z}


# probe backends whose rounds and audits run in the learner's own step, on the trainer's weights and optimizer
IN_STEP_BACKENDS: tuple[str, ...] = ("inline", "rollout")


class ProbeConfig(_Strict):
    batch_size: int = Field(8, ge=1, le=65_536, description="P: completed probes per audit")
    staleness_limit: int = Field(5, ge=1, le=10_000, description="S: optimizer steps before forced completion")
    offers_per_step: int = Field(4, ge=0, le=65_536, description="unfinished prefixes the controller may take per step")
    max_active: int = Field(32, ge=1, le=1_000_000, description="probes in flight at most")
    backend: Literal["auto", "inline", "thread", "ray", "rollout"] = Field(
        "auto", description="where probe rounds and audits run: in the step (inline), a thread with its own "
        "student replica, Ray actors, or (rollout; sync trainer, one process) as extra rows of the next step's "
        "rollout generate call within its window, audits in the step; auto: rollout on CUDA (no extra decode "
        "steps), thread elsewhere (docs/decisions.md, \"Default probe backend\")")
    selection: Literal["uniform", "stratified"] = Field("uniform", description="which offers the controller "
                                                        "accepts: uniformly, or spread over prompts")
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
    ray_address: str | None = Field(None, description="Ray cluster of the probe workers; None = start a local one")
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

    method: Literal["fast", "reference", "sketch"] = Field("fast", description="fast: exact, one chunked forward "
                                                           "and one backward per segment; reference: one backward "
                                                           "per segment over the whole batch (tests); sketch: "
                                                           "CountSketched segment gradients (large models, ranks)")
    metric: Literal["identity", "adam"] = Field("identity", description="inner product of the cosine: plain, or "
                                                "weighted by Adam's second moment (the paper's metric-aware cosine)")
    sketch_dim: int = Field(16_384, ge=1, le=1 << 24, description="sketch width of audit.method: sketch")
    params: str = Field("all", description="'all' or 'top:N': gradients of the last N transformer blocks and "
                        "the head only (the backward stops early)")
    estimator: Literal["batch", "debiased"] = Field(
        "batch", description="batch cosine, or without the same-sample Gram terms (needs per-sample gradients)")
    macro: bool = Field(False, description="also per-sample (macro) cosines: telemetry only, ~2.7x the audit's cost")
    ci_level: float | None = Field(None, gt=0.0, lt=1.0, description="interval per candidate cosine (a U-statistic "
                                   "interval for audit.estimator: debiased, a bootstrap for batch); None = no "
                                   "interval (window.confidence needs one)")
    ci_samples: int = Field(200, ge=10, le=100_000, description="bootstrap resamples of the probe batch (audit.estimator: batch)")
    every: int = Field(1, ge=1, le=1_000_000, description="audit one ready probe batch in this many (the others "
                       "are consumed unaudited and the window stays)")
    skip_margin: float = Field(0.0, ge=0.0, lt=1.0, description="skip audits while the last skip_history audits "
                               "had every cosine this far from the threshold; 0 = off")
    skip_history: int = Field(2, ge=1, le=1000, description="audits audit.skip_margin looks back over")
    max_skips: int = Field(4, ge=0, le=1_000_000, description="consecutive skips before an audit is forced")
    # --- decision budget (adwin/audit/budget.py; docs/decisions.md, "Decision budget") ---
    budget: float | None = Field(0.1, gt=0.0, lt=1.0, description="share of the run's FLOPs that decisions (probe "
                                 "extension, the teacher's scoring of probes, drift diagnostics, audits) may take; "
                                 "it sets the offer and audit cadence. None = offer every step and audit every "
                                 "ready probe batch (audit.every / skip_margin still apply)")
    evidence_audits: int = Field(1, ge=1, le=64, description="audits whose probe samples one decision reads: this "
                                 "audit's and up to N - 1 earlier ones (within the staleness limit), weighted by "
                                 "audit.evidence_decay per step of age; needs audit.ci_level (its per-sample "
                                 "vectors); 1 = this audit alone (docs/decisions.md, 'The shortest admissible window')")
    evidence_decay: float = Field(0.7, gt=0.0, le=1.0, description="with evidence_audits > 1: an earlier sample's "
                                  "weight per optimizer step between its audit's weights and the newest")
    pool_max: int = Field(4, ge=1, le=1024, description="with a budget: most probe batches (of probes.batch_size) "
                          "pooled into one audit, evidence bought with what rarer decisions save; 1 = no pooling")
    budget_seconds: bool = Field(True, description="with a budget: also hold offer rounds while the learner's own "
                                 "seconds in decisions (waiting on probes, scoring, drift, audits) are over "
                                 "audit.budget of its wall; false = FLOPs alone (a clock makes a run depend on the "
                                 "machine's speed, not only its seed)")

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

    @model_validator(mode="after")
    def _check_evidence(self) -> AuditConfig:
        # here, not in TrainConfig: the generic recipe and the TRL callback validate an AuditConfig alone
        if self.evidence_audits == 1 and self.evidence_decay != 0.7:
            raise ValueError("audit.evidence_decay weights earlier audits' samples: set audit.evidence_audits > 1, "
                             "or leave audit.evidence_decay at 0.7")
        if self.evidence_audits > 1 and self.ci_level is None:
            raise ValueError("audit.evidence_audits pools the audits' per-sample vectors, which audit.ci_level "
                             "computes: set audit.ci_level (e.g. 0.9) or audit.evidence_audits: 1")
        return self


class OptimConfig(_Strict):
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon")
    grad_clip: float = Field(1.0, ge=0.0, description="gradient-norm clip; 0 = off")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up steps")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="learning-rate schedule "
                                                              "after the warm-up")
    max_bad_steps: int = Field(3, ge=1, le=1_000_000,
                               description="consecutive non-finite (skipped) steps before the run stops")
    micro_batch_size: int | None = Field(None, ge=1, le=1_000_000, description="rows per forward/backward inside "
                                         "a step (gradient accumulation, the same update as the whole batch; the "
                                         "audit's too, and the sync trainer's teacher scoring: the asyncopd teacher "
                                         "stage batches by asyncopd.teacher_batch); None = the whole step batch at "
                                         "once")


class EvalConfig(_Strict):
    every: int = Field(10, ge=0, le=1_000_000, description="0 = only at start and end")
    n_problems: int = Field(64, ge=1, le=1_000_000, description="held-out problems per evaluation")
    k: int = Field(1, ge=1, le=1024, description="mean@k samples per problem")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="evaluation sampling temperature; 0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="evaluation nucleus sampling; 1 = off")
    batch_size: int = Field(64, ge=1, le=65_536, description="rows generated and scored together")
    # with rollout.backend: vllm evaluation samples on vLLM either way (it never computes stopped rows)
    compact: bool = Field(True, description="rows that stopped leave the batch at once (adwin/sampling/compact.py): "
                          "the same samples' distribution at a fraction of the cost; false = transformers' generate")
    forced_lines: bool = Field(True, description="built-in tasks: also score each reference chain line under teacher "
                               "forcing (eval/forced_lines, per window bin eval/forced_lines@<w>); one student "
                               "forward per problem")


class ControllerSection(_Strict):
    url: str | None = Field(None, description="a running `adwin controller serve`; None = the embedded controller")
    serve: bool = Field(True, description="serve the embedded controller's API and dashboard on 127.0.0.1")
    port: int = Field(8470, ge=0, le=65_535, description="port of the embedded controller's API; 0 = any free one")
    token: str | None = Field(None, description="bearer token of the remote controller's writes")


class LoggingConfig(_Strict):
    wandb: Annotated[Literal["off", "offline", "online"], OffWord] = Field("off", description="also log to Weights & Biases")
    stdout: bool = Field(False, description="print one metrics line per step")
    progress: bool = Field(True, description="show a progress bar")


class AsyncOPDSection(_Strict):
    """``scheduler: asyncopd`` knobs (AsyncOPD Appendix G); the one source of them (``build_asyncopd`` reads
    this section). A sync run refuses values other than the defaults: it would ignore them."""

    queue_depth: int = Field(4, ge=0, le=4096, description="tau: the feeder holds at most (tau + 1) * B permits")
    rollout_workers: int = Field(1, ge=1, le=1024, description="rollout workers, each with its own engine")
    workers: Literal["thread", "ray"] = Field("thread", description="where the rollout workers' engines run")
    worker_batch: int = Field(16, ge=1, le=65_536, description="active requests per rollout worker")
    teacher_batch: int = Field(16, ge=1, le=65_536, description="completed items the teacher stage scores at once")
    pad_to_horizon: bool = Field(True, description="learner tensors padded to max prompt + max response length, so "
                                 "a changing window never changes shapes")
    throughput_warmup: int = Field(5, ge=1, le=1_000_000, description="learner updates left out of throughput")
    wait_timeout_s: float = Field(600.0, gt=0.0, description="no pipeline progress for this long: fail")
    ray_address: str | None = Field(None, description="Ray cluster of asyncopd.workers: ray; None = a local one")
    sync_every: int = Field(1, ge=1, le=1_000_000, description="push the learner's weights to the rollout workers "
                            "every this many updates (keep-mode; 1: AsyncOPD's sync after every update)")
