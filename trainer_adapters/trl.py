"""ADWIN for TRL's ``DistillationTrainer``: a ``TrainerCallback`` that sets the rollout window.

It drives ``DistillationTrainer`` and ``ServerDistillationTrainer`` (teacher behind a server), which generates
through the same path; which trainers, and which teacher scores the probes, is ``trl_teacher``.

Where the window must go (trl 1.16, ``trl/trainer/distillation_trainer.py``). Completions are generated
in ``_prepare_inputs`` -> ``_generate_and_score_completions`` -> ``_generate_single_turn``, once per
generation batch, inside the first ``training_step`` of an optimizer step, i.e. right after
``on_step_begin``. At that point the trainer reads:

- transformers backend: ``trainer.generation_config`` (passed as ``generate(generation_config=...)``,
  so its ``max_new_tokens`` is the cap) and ``trainer.generation_kwargs`` (the same dict is used to
  override the model's own ``generation_config`` during generation);
- vLLM backend: ``trainer.vllm_generation.max_completion_length`` (copied into the vLLM
  ``SamplingParams.max_tokens`` / server request on every ``generate``);
- tool-calling loop: ``trainer.max_completion_length`` (the completion budget after tool results).

``on_step_begin`` sets all four to the controller's window. Nothing else is patched.

Probes: every ``probe_every`` optimizer steps, ``on_step_end`` (after ``optimizer.step`` and
``zero_grad``) takes the step's rollouts from ``trainer._buffered_inputs``, offers them by the one offer
rule (``probes.offers.offer_indices``: unfinished prefixes, plus finished and full-length rollouts as
complete probes per ``offer_finished``, default ``"always"``; capped by ``probe_count``), and continues
the accepted prefixes to the full horizon in one second, full-length ``generate`` call with the updated
student (complete probes need none). Continuing the trainer's own prefixes rather than sampling fresh
full-length rollouts is deliberate: the prefix tokens are already paid for, and the audit then measures
the truncation of exactly the rollouts the trainer trains on (same prompts, same prefix distribution),
which is the quantity ADWIN's decision is about. The prefix was sampled by the
pre-step weights and the continuation by the post-step weights: staleness 1, below any limit ``S``.

When the controller has ``P`` complete probes, the teacher scores them (the local ``teacher_model``, or the
trainer's teacher server: ``trl_teacher``), ``adwin.audit.alignment.audit`` runs
under the current weights (``autograd.grad`` in eval mode: ``.grad`` and optimizer state untouched, and
it runs after ``zero_grad``, outside the accumulation/optimizer window), and the Gram goes to the
controller, whose decision is the window of the next ``on_step_begin``.

The audit's per-token loss is the token-local reverse-KL policy gradient (ADWIN eq. 23-24). With TRL's
``beta=1`` (reverse KL) that is a single-sample estimator of the gradient of the same objective TRL
optimizes with its full-distribution JSD; for ``beta < 1`` it is a proxy.

Metrics go into TRL's own store (``trainer._metrics["train"]``), which ``DistillationTrainer.log``
averages into every logged row, so ``window/*`` and ``probe/*`` reach ``log_history`` and every
reporting integration; mutating ``logs`` in ``on_log`` would be too late (transformers appends to
``log_history`` and calls the reporters before user callbacks).

Robustness (docs/adapters.md): ``attach`` refuses a run whose probes can never form a batch with this
trainer's rollouts per step (``controller/feasibility.py``); a reused run id with another spec is a
``RunConflict`` unless ``resume=True``; a controller that goes away mid-run is survived by default
(``ResilientController``: the last window stays, writes are buffered, ``controller/*`` gauges reach
``log_history``, and ``on_train_end`` delivers the buffer within ``drain_timeout_s``). Telemetry rows
(``report_step``) are keyed by the optimizer step that used the window: step ``t`` ran under
``windows[t]``.

TRL's ``AsyncDistillationTrainer`` built with ``AdwinRolloutWorker`` (``trl_async``) is driven another way: the
worker sends TRL's own requests to TRL's servers with the controller's window as ``max_tokens`` and full-length
probes, and the callback's events call its ``AsyncDriver`` (``trl_async_driver``: probe reports, the audit on the
trainer's side, the next window).

Single process only: ``RunIn.world_size`` > 1 would need every rank to audit its shard and submit a
sketch; the callback refuses ``num_processes > 1``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from adwin.config import AuditConfig
from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import AuditOut, PolicyIn, RunIn
from adwin.decode.static_cache import CompileSetting
from adwin.probes.offers import OFFER_FINISHED
from adwin.probes.settings import param_count, trainable_count
from adwin.runtime.resilient_controller import controller_metrics
from adwin.teacher.client import ClientSettings
from adwin.trainer_adapters.generic import WindowClient, hf_extender
from adwin.trainer_adapters.trl_async_driver import AsyncDriver
from adwin.trainer_adapters.trl_teacher import ProbeTeacher, check_trainer, probe_teacher

logger = logging.getLogger(__name__)


class AdwinCallback(TrainerCallback):
    """Drive ``DistillationTrainer``'s (or ``ServerDistillationTrainer``'s) completion length from an ADWIN controller.

    ``run`` is a run id already registered with ``controller`` or a ``RunIn`` to register. With a run
    id and ``candidates``, a ``RunIn`` is built (adwin policy, ``max_len`` = the trainer's configured
    ``max_completion_length``). Call ``attach(trainer)`` (it adds the callback): callbacks receive no
    trainer reference from transformers, and the window lives on the trainer. ``audit`` (an ``AuditConfig``)
    sets every audit knob as in the built-in trainer's ``audit`` section, ``audit.budget`` included (FLOPs
    from the student's and the teacher's parameter counts); without it, ``audit_method`` and
    ``audit_metric`` over ``AuditConfig``'s defaults, the default decision budget included
    (``AuditConfig(budget=None)`` audits every ready probe batch).

    Probes are scored by the trainer's ``teacher_model``, or, with ``ServerDistillationTrainer``, by its teacher
    server (``args.teacher_model_server_url``) over adwin's served-teacher client with ``teacher_server``'s
    timeouts and retries (default ``ClientSettings()``). ``teacher_params``: the teacher's parameter count the
    decision budget charges; default: counted from ``teacher_model``, or the student's count for a server (which
    cannot report one; logged at ``attach``).

    TRL's ``AsyncDistillationTrainer`` is driven when it was built with ``AdwinRolloutWorker`` (``trl_async``): TRL's
    teacher servers score the probes, the worker sends up to ``probe_count`` full-length probes a weight sync
    (``probe_every`` does not apply), and ``self.driver`` holds that run (``trl_async_driver``). The decision budget
    charges ``teacher_params`` for the teacher's forwards, else the student's count (a server reports none).
    """

    def __init__(
        self,
        controller: ControllerAPI,
        run: str | RunIn,
        candidates: list[int] | None = None,
        *,
        probe_every: int = 1,
        probe_count: int = 8,
        threshold: float = 0.7,
        audit_method: str = "fast",
        audit_metric: str = "identity",
        audit: AuditConfig | None = None,
        report_steps: bool = True,
        offer_finished: str = "always",
        resume: bool = False,
        resilient_controller: bool = True,
        drain_timeout_s: float = 30.0,
        compile: CompileSetting = "auto",
        teacher_server: ClientSettings | None = None,
        teacher_params: int | None = None,
    ) -> None:
        if probe_every < 1 or probe_count < 0:
            raise ValueError(f"probe_every must be >= 1 and probe_count >= 0, got {probe_every}, {probe_count}")
        if offer_finished not in OFFER_FINISHED:
            raise ValueError(f"offer_finished must be one of {OFFER_FINISHED}, got {offer_finished!r}")
        if teacher_params is not None and teacher_params < 1:
            raise ValueError(f"teacher_params must be >= 1, got {teacher_params}")
        self.controller = controller
        self.run = run
        self.candidates = candidates
        self.threshold = threshold
        self.probe_every = probe_every
        self.probe_count = probe_count
        self.compile = compile  # probe extension's decoding (adwin.decode.static_cache; auto: on CUDA)
        # one declaration of the audit; the callback knows both models, so the default budget can count FLOPs
        self.audit = audit or AuditConfig(method=audit_method, metric=audit_metric)
        self.report_steps = report_steps
        self.offer_finished = offer_finished
        self.resume = resume
        self.resilient_controller = resilient_controller
        self.drain_timeout_s = drain_timeout_s
        self.teacher_server = teacher_server
        self.teacher_params = teacher_params
        self.teacher: ProbeTeacher | None = None  # set by attach
        self.trainer: Any = None
        self.client: WindowClient | None = None
        self.decisions: list[AuditOut] = []
        self.driver: AsyncDriver | None = None  # set by attach for an AsyncDistillationTrainer with AdwinRolloutWorker
        self.windows: dict[int, int] = {}  # optimizer step -> window applied
        self._step_started: float | None = None  # the step's training seconds, for the decision budget

    # --- wiring -----------------------------------------------------------------------------------

    def attach(self, trainer: Any) -> AdwinCallback:
        """Check the trainer, connect its teacher (a server: ``TeacherUnavailable`` names an unreachable URL),
        then register the run and add the callback: a refused trainer or teacher registers nothing."""
        is_async = check_trainer(trainer)  # UnsupportedTrainer
        if trainer.accelerator.num_processes > 1:
            raise NotImplementedError("AdwinCallback supports one process; multi-rank audits need sketches per rank")
        if is_async:
            return self._attach_async(trainer)
        teacher = probe_teacher(trainer, self.teacher_server)  # NoTeacher without a teacher or a server URL
        try:
            self._connect(trainer, teacher)
        except BaseException:
            teacher.close()
            raise
        self.teacher, self.trainer = teacher, trainer
        trainer.add_callback(self)
        return self

    def _attach_async(self, trainer: Any) -> AdwinCallback:
        """An ``AsyncDistillationTrainer`` with ``AdwinRolloutWorker``: TRL's teacher servers score the probes."""
        student = trainer.accelerator.unwrap_model(trainer.model)
        urls = ", ".join(trainer.args.teacher_server_urls.values())
        self.driver = AsyncDriver.connect(
            trainer, self.controller, self.run, candidates=self.candidates, threshold=self.threshold,
            probe_count=self.probe_count, audit=self.audit, report_steps=self.report_steps,
            offer_finished=self.offer_finished, resume=self.resume, resilient_controller=self.resilient_controller,
            model_params=self._model_params(student, None, urls))
        self.trainer = trainer
        trainer.add_callback(self)
        return self

    def _connect(self, trainer: Any, teacher: ProbeTeacher) -> None:
        """Register the run with the controller and build the ``WindowClient``."""
        run = self.run
        if isinstance(run, str) and self.candidates is not None:
            policy = PolicyIn(
                name="adwin", candidates=self.candidates, threshold=self.threshold,
                max_len=int(trainer.args.max_completion_length),
            )
            run = RunIn(
                run_id=run, name=run, policy=policy,
                probe_batch_size=max(1, self.probe_count), offers_per_step=self.probe_count,
            )
        args = trainer.args
        rollouts = args.per_device_train_batch_size * args.gradient_accumulation_steps  # one generation batch
        self.client = WindowClient(
            self.controller, run, offer_finished=self.offer_finished, resume=self.resume,
            resilient_controller=self.resilient_controller, audit=self.audit,
            model_params=self._model_params(trainer.accelerator.unwrap_model(trainer.model), teacher.params,
                                            teacher.url),
            rollouts_per_step=min(rollouts, self.probe_count) if self.probe_count > 0 else 0,
        )
        if self.client.max_len != trainer.args.max_completion_length:
            logger.warning(
                "run %s: policy max_len %d differs from max_completion_length %s; probes run to max_len",
                self.client.run_id, self.client.max_len, trainer.args.max_completion_length,
            )

    def _model_params(self, student: Any, teacher_params: int | None, url: str | None) -> tuple[int, ...]:
        """The decision budget's counts; a teacher nobody can count (a server at ``url``) is charged the student's
        count."""
        n_teacher = self.teacher_params or teacher_params
        if n_teacher is None:
            n_teacher = param_count(student) or 1
            logger.warning("audit.budget: the teacher server %s cannot report its parameters; the decision budget "
                           "charges the student's count (%d) for its forwards (pass AdwinCallback(teacher_params=N))",
                           url, n_teacher)
        return model_params(student, n_teacher)

    def _client(self) -> WindowClient:
        if self.client is None or self.trainer is None:
            raise RuntimeError("call AdwinCallback.attach(trainer) before training")
        return self.client

    # --- the window -------------------------------------------------------------------------------

    def apply_window(self, window: int) -> None:
        """Set every cap the trainer reads at generation time (see the module docstring)."""
        tr = self.trainer
        tr.max_completion_length = window
        tr.generation_config.max_new_tokens = window
        tr.generation_kwargs["max_new_tokens"] = window
        if getattr(tr, "use_vllm", False):
            tr.vllm_generation.max_completion_length = window

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.driver is not None:  # the rollout worker caps its requests itself
            window = self.driver.step_begin()
        else:
            window = self._client().window(state.global_step)
            self.apply_window(window)
        self.windows[state.global_step] = window
        self._log("window/size", float(window))
        self._step_started = time.perf_counter()

    # --- probes and audits ------------------------------------------------------------------------

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.driver is not None:
            metrics, decision = self.driver.step_end(state.global_step)
            if decision is not None:
                self.decisions.append(decision)
                if decision.decision is not None:
                    self._log("window/next", float(decision.decision.window))
            for key, value in metrics.items():
                self._log(key, value)
            return
        rollout_step = state.global_step - 1  # the step whose rollouts are buffered
        if self._step_started is not None:  # generation, teacher scoring and the update all ran in the step
            prompts, responses, _ = self._rollouts()
            self._client().record_step(sum(map(len, prompts)) + sum(map(len, responses)),
                                       time.perf_counter() - self._step_started)
            self._step_started = None
        if (rollout_step % self.probe_every == 0 and self.probe_count > 0) or self._client().probes:
            self.probe_cycle(rollout_step)  # logs the controller/* gauges with the client's metrics
        else:
            for key, value in controller_metrics(self._client().controller).items():
                self._log(key, value)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        try:
            if self.driver is not None:
                self.driver.train_end(self.drain_timeout_s)
            else:
                self._client().close(self.drain_timeout_s)  # degraded mode: an ERROR names the writes still undelivered
        finally:
            if self.teacher is not None:
                self.teacher.close()

    def probe_cycle(self, rollout_step: int) -> AuditOut | None:
        """Offer the step's rollouts (offer rule), finish the held probes, audit a ready batch."""
        client, tr = self._client(), self.trainer
        version = rollout_step + 1  # weights after that step's optimizer update
        t0 = time.perf_counter()
        if rollout_step % self.probe_every == 0 and self.probe_count > 0:
            prompts, responses, finished = self._rollouts()
            client.offer(rollout_step, prompts, responses, version=rollout_step, finished=finished,
                         window=self.windows.get(rollout_step), limit=self.probe_count)
        student = tr.accelerator.unwrap_model(tr.model)
        extend = hf_extender(
            student, pad_id=tr._tokenizer.pad_token_id, eos_ids=tr.eos_token_ids,
            generation_kwargs={"temperature": tr.temperature, "top_p": tr.top_p, "top_k": tr.top_k},
            compile=self.compile,
        )
        tokens = client.extend_probes(version, extend, version=version, to_full=True)
        gen_s = time.perf_counter() - t0
        assert self.teacher is not None  # set with the client by attach
        decision = client.maybe_audit(
            student, self.teacher.score, pad_id=tr._tokenizer.pad_token_id,
            optimizer=tr.optimizer if self.audit.metric == "adam" else None,
        )
        if decision is not None:
            self.decisions.append(decision)
            if decision.decision is not None:
                self._log("window/next", float(decision.decision.window))
        self._log("probe/tokens_step", float(tokens))
        self._log("probe/gen_s", gen_s)
        for key, value in client.metrics().items():
            if key != "window/size":
                self._log(key, value)
        return decision

    def _rollouts(self) -> tuple[list[list[int]], list[list[int]], list[bool]]:
        """Prompt and completion ids of the step's generation batch, padding stripped."""
        tr = self.trainer
        eos = set(tr.eos_token_ids)
        prompts: list[list[int]] = []
        responses: list[list[int]] = []
        finished: list[bool] = []
        for part in tr._buffered_inputs or []:
            for ids, pm, cids, cm in zip(
                part["prompt_ids"], part["prompt_mask"], part["completion_ids"], part["completion_mask"], strict=True
            ):
                prompts.append(ids[pm.bool()].tolist())  # (P,) left padding removed
                resp = cids[cm.bool()].tolist()  # (C,) right padding removed
                responses.append(resp)
                finished.append(bool(resp) and resp[-1] in eos)
        return prompts, responses, finished

    # --- logging ----------------------------------------------------------------------------------

    def _log(self, key: str, value: float) -> None:
        if math.isfinite(value):
            self.trainer._metrics["train"][key].append(value)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, float] | None = None, **kwargs: Any,
    ) -> None:
        if self.report_steps and logs and "loss" in logs:
            numeric = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            # global_step already counts the step just logged; the row belongs to the step that used windows[t]
            if self.driver is not None:
                self.driver.hooks.on_step(state.global_step - 1, numeric)
            elif self.client is not None:
                self.client.report_step(state.global_step - 1, numeric)


def model_params(student: Any, n_teacher: int) -> tuple[int, ...]:
    """The decision budget's parameter counts: student, teacher, and the student's trainable ones when some are
    frozen (a PEFT student from TRL's ``peft_config``)."""
    counts = (param_count(student) or 1, n_teacher)
    n_trainable = trainable_count(student)
    return counts if n_trainable is None else (*counts, n_trainable)
