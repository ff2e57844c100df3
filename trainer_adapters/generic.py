"""Wire any on-policy distillation loop to the ADWIN controller in a few lines.

``WindowClient`` wraps a ``ControllerAPI`` (the in-process ``Controller`` or ``RemoteController``) and
keeps the token state of this process's probes, so a training loop only has to say *what happened*:

    client = WindowClient(controller, RunIn(...))          # or WindowClient(controller, "run-id")
    W = client.window(step)                                 # cap the rollout at W response tokens
    client.offer(step, prompts, responses, version=step)    # unfinished prefixes may become probes
    client.extend_probes(step + 1, extend, version=step + 1)  # one extension round (<= W tokens each)
    client.maybe_audit(model, score, pad_id=...)            # audit a ready probe batch, apply decision

The model-facing pieces are plain callables, so the same client serves an HF ``generate`` backend, a
vLLM engine or a test double:

- ``Extend(contexts, budgets) -> (new_tokens, finished)``: continue each context (prompt + response
  ids) by at most ``budgets[i]`` tokens with the newest student weights; ``finished[i]`` is True when
  the continuation emitted EOS.
- ``Score(input_ids, attention_mask) -> (B, L)``: the teacher's log-probability of the token at each
  column (column ``i`` predicted by logits ``i - 1``; column 0 is ignored).

``hf_extender`` and ``teacher_scorer`` build both from transformers models; ``served_scorer`` scores with a
teacher server.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from adwin.audit.alignment import ProbeBatch
from adwin.audit.budget import DecisionBudget
from adwin.audit.job import AuditJob, AuditSettings
from adwin.config import AuditConfig
from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import AuditOut, ProbeOut, ProbePlanOut, ProbeReportIn, RunIn, StepMetricsIn
from adwin.decode.generate import generate
from adwin.decode.static_cache import CompileSetting
from adwin.probes.async_executor import AsyncProbeExecutor
from adwin.probes.client import InlineAuditor, ProbeClient
from adwin.probes.offers import OFFER_FINISHED
from adwin.probes.pool import Extension, Probe, ProbePool, probe_batch
from adwin.probes.settings import audit_schedule, audit_settings, decision_budget
from adwin.probes.workers import InlineWorker
from adwin.runtime.resilient_controller import controller_metrics, drain_controller
from adwin.teacher.client import ClientSettings
from adwin.teacher.scoring import score_rows
from adwin.teacher.served import ServedTeachers
from adwin.trainer_adapters.registration import check_feasible, register, resilient

Extend = Callable[[list[list[int]], list[int]], tuple[list[list[int]], list[bool]]]
Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def HeldProbe(prompt_ids: list[int], response_ids: list[int], versions: list[int],  # noqa: N802 - the old record's name
              finished: bool = False) -> Probe:
    """A probe this process holds: the one probe record (``adwin.probes.pool.Probe``), without behavior logprobs."""
    return Probe("", list(prompt_ids), list(response_ids), list(versions), None, finished=finished)


@dataclass
class ClientStats:
    """Counters since the client was built; ``metrics()`` turns them into ``probe/*`` log keys."""

    offered: int = 0
    accepted: int = 0
    probe_tokens: int = 0
    completed: int = 0
    forced: int = 0
    audits: int = 0
    expired: int = 0
    audit_s: float = 0.0
    last_cosines: dict[int, float] = field(default_factory=dict)


class WindowClient:
    """The controller, seen from one training process: window, probes, audits, step metrics.

    A thin driver of the one probe client (``adwin.probes.client.ProbeClient``, ``self.probe_client``): probes
    continue with the ``Extend`` each ``extend_probes`` call is given, audits run on the model ``maybe_audit``
    is given, with the settings of ``audit`` (an ``AuditConfig``; default: its defaults) and the keyword
    arguments of ``maybe_audit``/``audit_and_submit`` over them; ``audit.every``/``audit.skip_*`` schedule the
    audits as in the built-in trainer.

    ``offer_finished`` (``probes.offers``): ``"always"`` (the adapters' default) also offers rollouts that
    finished inside the window as complete probes, so a window most rollouts fit into keeps auditing;
    ``"at_horizon"`` is the paper's rule (unfinished prefixes only, finished ones at the full horizon).
    ``model_params``: the student's and the teacher's parameter counts, which the decision budget
    (``audit.budget``, docs/decisions.md "Decision budget") needs, and optionally the student's trainable ones
    (a LoRA student's adapters: its backward is cheaper, ``FlopsModel``); an ``audit`` with a budget and no
    ``model_params`` is refused. Without ``audit``, no budget (every ready batch audited, as before). The loop
    tells the budget each step's training compute with ``record_step``; ``metrics()`` adds ``decision/*``.
    ``resume=True`` continues a run id registered with another spec instead of raising ``RunConflict``.
    ``resilient_controller=True`` (default) trains on through a controller outage (``ResilientController``); call
    ``close()`` at the end to deliver the writes buffered meanwhile. ``rollouts_per_step`` (when known)
    lets the feasibility check count the rollouts a step can offer at most.
    """

    def __init__(self, controller: ControllerAPI, run: str | RunIn, *, offer_finished: str = "always",
                 resume: bool = False, resilient_controller: bool = True, rollouts_per_step: int | None = None,
                 audit: AuditConfig | None = None, model_params: tuple[int, ...] | None = None) -> None:
        if offer_finished not in OFFER_FINISHED:
            raise ValueError(f"offer_finished must be one of {OFFER_FINISHED}, got {offer_finished!r}")
        self.offer_finished = offer_finished
        self.controller = resilient(controller, resilient_controller)
        out = register(self.controller, run, resume=resume)
        check_feasible(out, rollouts_per_step=rollouts_per_step)
        self.run_id = out.run_id
        policy = out.spec["policy"]
        self.candidates: list[int] = [int(c) for c in policy.get("candidates") or []]
        self.max_len: int = int(policy["max_len"])
        self.staleness_limit: int = int(out.spec.get("staleness_limit", 1 << 30))
        self.probe_batch_size: int = int(out.spec.get("probe_batch_size", 1))
        self.audit_config = audit or AuditConfig(budget=None)
        if self.audit_config.budget is not None and model_params is None:
            raise ValueError(f"audit.budget={self.audit_config.budget} needs model_params=(student parameters, teacher "
                             f"parameters) to count FLOPs; pass them, or AuditConfig(budget=None)")
        self.probe_client = ProbeClient(self.controller, self.run_id, ProbePool(self.max_len), self.staleness_limit,
                                        offer_finished=offer_finished, probe_batch_size=self.probe_batch_size,
                                        schedule=audit_schedule(self.audit_config, float(policy.get("threshold", 0.7))))
        if model_params is not None:
            self.probe_client.budget = spec_budget(self.audit_config, out.spec, model_params)
        self._extend: Extend | None = None  # the one extension rounds use: the last ``extend_probes`` call's
        self.probe_client.executor = AsyncProbeExecutor(self.probe_client.pool, lambda: InlineWorker(self._extender))
        self.probe_tokens = 0
        self.last_window: int | None = None
        self.last_step: int | None = None  # the batch forms at it: the controller's reads do not record it
        self.audit_metrics: dict[str, float] = {}  # the last ``maybe_audit``'s ``audit/*`` (teacher_unavailable, ...)

    @property
    def probes(self) -> dict[str, Probe]:
        """The probes this process holds, by id (offered, extended or complete, not yet audited)."""
        return {p.probe_id: p for p in self.probe_client.pool.snapshot()}

    @property
    def stats(self) -> ClientStats:
        c, pc = self.probe_client.counts, self.probe_client
        return ClientStats(c["offered"], c["accepted"], self.probe_tokens, c["completed"], c["forced"], c["audits"],
                           c["expired"], pc.record.audit_s, dict(pc.record.last_cosines))

    # --- window -----------------------------------------------------------------------------------

    def window(self, step: int) -> int:
        """The response-token cap for ``step``; cached by the controller, never blocks on probes."""
        self.last_window = self.controller.get_window(self.run_id, step).window
        self.last_step = step
        self.probe_client.record.window = self.last_window
        return self.last_window

    # --- probes -----------------------------------------------------------------------------------

    def offer(
        self,
        step: int,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        version: int,
        finished: Sequence[bool] | None = None,
        prompt_keys: Sequence[str] | None = None,
        window: int | None = None,
        limit: int | None = None,
    ) -> list[str]:
        """Offer this step's rollouts by ``probes.offers.offer_indices``; returns the accepted probe ids.

        ``finished[i]``: rollout ``i`` ended (EOS). Unfinished prefixes are offered for continuation;
        finished and full-length ones per ``offer_finished``, as already complete probes (reported
        complete at the next ``extend_probes``, no tokens generated). ``window`` is the cap these
        rollouts were generated under (default: the last ``window()``); ``limit`` caps the offers.
        ``prompt_keys`` groups rollouts of one prompt (stratified selection); by default each prompt's
        token ids are the key.
        """
        if not self.candidates:
            return []  # nothing to audit without candidates
        done = list(finished) if finished is not None else [False] * len(responses)
        cap = window if window is not None else self.last_window if self.last_window is not None else self.max_len
        records = [Probe(f"{self.run_id}:{step}:{i}", list(map(int, p)), list(map(int, r)), [version] * len(r), None,
                         submitted_step=version,
                         prompt_id=prompt_keys[i] if prompt_keys is not None else _prompt_key(p))
                   for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]
        return self.probe_client.offer(step, records, done, cap, limit=limit)

    def probe_plan(self, step: int) -> ProbePlanOut:
        return self.probe_client.plan(step)

    def report(
        self,
        step: int,
        probe_id: str,
        tokens_added: int,
        version: int,
        *,
        finished: bool = False,
        forced: bool = False,
        dropped: bool = False,
    ) -> ProbeOut:
        report = ProbeReportIn(
            probe_id=probe_id, step=step, tokens_added=tokens_added, version=version,
            finished=finished, forced=forced, dropped=dropped,
        )
        return self.controller.report_probe(self.run_id, report)

    def forget_expired(self, version: int) -> int:
        """Drop finished probes past the staleness limit: the controller expires them, no batch will name them."""
        return self.probe_client.evict(version)

    def extend_probes(self, step: int, extend: Extend, *, version: int, to_full: bool = False) -> int:
        """One extension round over the held active probes; returns the probe tokens generated.

        Each probe grows by at most the plan's ``extend_by`` (the current window), or to the full
        horizon when the controller marks it ``force_complete`` (staleness reached S) or ``to_full``
        is set (a loop that finishes its probes in one full-length generation call). Probes the
        controller lists but this process does not hold belong to other processes and are skipped.
        """
        self.forget_expired(version)
        self._extend = extend
        stats = self.probe_client.advance(version, to_full=to_full, drop_unknown=False, plan_at=step)
        self.probe_tokens += stats.tokens
        return stats.tokens

    def _extender(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        """The user's ``Extend`` as the pool's extender: each continuation cut to its budget, no behavior logprobs."""
        if self._extend is None:
            raise RuntimeError("extend_probes sets the Extend a round uses")
        new_tokens, eos = self._extend(contexts, budgets)
        return Extension([list(map(int, t))[:b] for t, b in zip(new_tokens, budgets, strict=True)], None,
                         [bool(e) for e in eos])

    # --- audits -----------------------------------------------------------------------------------

    def audit_and_submit(
        self,
        model: torch.nn.Module,
        probe_batch: ProbeBatch,
        audit_id: int,
        candidates: Sequence[int] | None = None,
        **audit_kwargs: Any,
    ) -> AuditOut | None:
        """Audit ``probe_batch`` under the model's current weights and hand it to the controller.

        The controller decides with the run's candidates, so the audit must use exactly those. ``audit`` takes
        gradients with ``autograd.grad``: no ``.grad`` is touched. None when the audit was refused for NaN/Inf
        (the window stays; ``probe/audits_rejected``).
        """
        cands = list(candidates) if candidates is not None else self.candidates
        if cands != self.candidates:
            raise ValueError(f"audit candidates {cands} differ from the run's {self.candidates}")
        optimizer = audit_kwargs.pop("optimizer", None)
        version = self.last_step if self.last_step is not None else 0
        job = AuditJob(audit_id, version, probe_batch, self._settings(audit_kwargs))
        tags = probe_batch.versions
        stale = [] if tags is None or not (tags >= 0).any() else [version - int(tags[tags >= 0].min())]
        self.probe_client.record.last_out = None
        self.probe_client.submit_now(audit_id, InlineAuditor(model, optimizer).submit_audit(job), version, stale,
                                     float(probe_batch.response_mask.sum()))
        return self.probe_client.record.last_out

    def maybe_audit(self, model: torch.nn.Module, score: Score, *, pad_id: int, **audit_kwargs: Any) -> AuditOut | None:
        """If the controller has a complete probe batch, audit it and submit; else None (also when the audit
        was refused for NaN/Inf: the window stays). The batch's probes are dropped from ``probes`` (consumed)."""
        pc = self.probe_client
        pc.auditor = InlineAuditor(model, audit_kwargs.pop("optimizer", None))
        pc.settings = self._settings(audit_kwargs)
        pc.score, pc.pad_id = (lambda ids, mask, routes: score(ids, mask)), pad_id
        pc.record.last_out = None
        self.audit_metrics = pc.audit(self.last_step if self.last_step is not None else 0, wait=True)
        return pc.record.last_out

    def _settings(self, audit_kwargs: dict[str, Any]) -> AuditSettings:
        """``audit_config`` with ``audit_kwargs`` over it (``audit.*`` fields; ``micro_batch``/``autocast``; the
        rest of ``adwin.audit.alignment.audit``'s arguments pass through)."""
        kw = dict(audit_kwargs)
        fields = {k: kw.pop(k) for k in list(kw) if k in AuditConfig.model_fields}
        cfg = AuditConfig.model_validate(self.audit_config.model_dump() | fields)  # checked like a config
        s = audit_settings(cfg, self.candidates, seed=int(kw.pop("seed", 0)), micro_batch=kw.pop("micro_batch", None),
                           autocast=kw.pop("autocast", "off"))
        s.extra = kw
        return s

    # --- telemetry --------------------------------------------------------------------------------

    def record_step(self, tokens: int, seconds: float) -> None:
        """One training step for the decision budget: its rollouts' prompt + response tokens (generated, scored
        by the teacher, trained on) and its measured seconds. Call it every step, before ``offer``."""
        self.probe_client.record_train(float(tokens), seconds)

    def report_step(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self.controller.report_step(self.run_id, StepMetricsIn(step=step, metrics=clean), idempotency_key=f"step:{step}")

    def metrics(self) -> dict[str, float]:
        """``window/*``, ``probe/*``, ``decision/*`` and the last ``maybe_audit``'s ``audit/*`` values for the
        trainer's own logger."""
        out: dict[str, float] = {}
        if self.last_window is not None:
            out["window/size"] = float(self.last_window)
        s = self.stats
        out.update({
            "probe/offered": float(s.offered),
            "probe/accepted": float(s.accepted),
            "probe/tokens": float(s.probe_tokens),
            "probe/completed": float(s.completed),
            "probe/forced": float(s.forced),
            "probe/expired": float(s.expired),
            "probe/held": float(len(self.probe_client.pool)),
            "probe/audits": float(s.audits),
            "probe/audits_rejected": float(self.probe_client.counts["rejected"]),
            "probe/audit_s": float(s.audit_s),
        })
        for c, v in s.last_cosines.items():
            out[f"window/cos@{c}"] = float(v)
        out.update(controller_metrics(self.controller))  # controller/* gauges in degraded mode
        out.update(self.probe_client.decision_metrics())
        out.update(self.audit_metrics)
        return out

    def close(self, timeout_s: float = 30.0) -> int:
        """End of run: with a decision budget, close the probe batches still held for a pooled audit unaudited
        (their probes released), as the sync trainer's last step does: no later step would use their decision.
        Then deliver the writes buffered during a controller outage (bounded); returns those left."""
        self.probe_client.release_held(self.last_step if self.last_step is not None else 0)
        return drain_controller(self.controller, timeout_s)


def spec_budget(audit: AuditConfig, spec: dict[str, Any], model_params: tuple[int, ...]) -> DecisionBudget:
    """The decision budget of an adapter's run (``spec``: the registered ``RunIn``): ``model_params`` = (student,
    teacher[, the student's trainable]) parameter counts; prompt lengths unknown, so the horizon stands for them."""
    policy = spec["policy"]
    max_len = int(policy["max_len"])
    return decision_budget(
        audit, probe_batch=int(spec.get("probe_batch_size", 1)),
        staleness_limit=min(int(spec.get("staleness_limit", 1 << 20)), 1 << 20),
        offers_per_step=int(spec.get("offers_per_step", 1)), n_student=model_params[0], n_teacher=model_params[1],
        max_prompt_len=max_len, max_response_len=max_len, min_window=min(policy.get("candidates") or [max_len]),
        drift=False, n_trainable=model_params[2] if len(model_params) > 2 else None)


def _prompt_key(prompt: Sequence[int]) -> str:
    """Stable across processes (``hash`` of a str would not be): rollouts of one prompt share it."""
    return "p" + hashlib.blake2b(",".join(map(str, prompt)).encode(), digest_size=8).hexdigest()


# --- model-facing helpers ---------------------------------------------------------------------------


def pack(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    score: Score,
    *,
    pad_id: int,
    versions: Sequence[Sequence[int]] | None = None,
) -> ProbeBatch:
    """Right-padded (``adwin.sampling.rollout.layout``), teacher-scored ``ProbeBatch`` of prompt + response rows.

    The same layout serves a training step (``input_ids``, ``response_mask``, ``teacher_logprobs``)
    and an audit (the one builder, ``adwin.probes.pool.probe_batch``). ``versions`` tags each response token
    with the student version that produced it.
    """
    if not prompts:
        raise ValueError("pack needs at least one row")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("each row needs at least one prompt token (column 0 has no predictor)")
    tags = versions if versions is not None else [[0] * len(r) for r in responses]
    batch = build_probe_batch([HeldProbe(list(p), list(r), list(v)) for p, r, v in zip(prompts, responses, tags,
                                                                                       strict=True)], score, pad_id=pad_id)
    if versions is None:
        batch.versions = None
    return batch


def build_probe_batch(probes: Sequence[Probe], score: Score, *, pad_id: int) -> ProbeBatch:
    """``adwin.probes.pool.probe_batch`` of complete held probes, scored by a two-argument ``Score``."""
    return probe_batch(probes, pad_id, lambda ids, mask, routes: score(ids, mask))


def teacher_scorer(teacher: torch.nn.Module, *, vocab: int | None = None, temperature: float = 1.0) -> Score:
    """``Score`` from an HF causal LM: log q(token) at each column, logits divided by ``temperature``.

    ``vocab``: the student's output width (``student.config.vocab_size``). A teacher padded wider (Qwen2.5-7B
    teaching 1.5B) is read on those columns only, as the built-in trainer reads it; without it the teacher's
    whole output is the support (``adwin.teacher.scoring``)."""

    def score(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return score_rows(teacher, input_ids, attention_mask, vocab=vocab, temperature=temperature).realized  # (B, L)

    return score


class ServedScore:
    """``Score`` from a teacher server (``vllm serve``, SGLang, ``adwin teacher serve``; docs/teacher-server.md):
    rows go out batched and concurrently, with the retries of the client's settings; ``close()`` ends its
    connections."""

    def __init__(self, teachers: ServedTeachers) -> None:
        self.teachers = teachers

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.teachers.score(input_ids, attention_mask, ["default"] * input_ids.shape[0])  # (B, L)

    def close(self) -> None:
        self.teachers.close()


def served_scorer(url: str, student_tokenizer: Any, vocab_size: int, *, settings: ClientSettings | None = None,
                  context: int | None = None) -> ServedScore:
    """A ``ServedScore`` of the server at ``url``, connected and checked against the student's tokenizer now
    (``ServedTeachers.load``)."""
    return ServedScore(ServedTeachers.load({"default": url}, student_tokenizer, vocab_size,
                                           settings or ClientSettings(), context=context))


def hf_extender(
    model: torch.nn.Module,
    *,
    pad_id: int,
    eos_ids: Iterable[int],
    generation_kwargs: dict[str, Any] | None = None,
    compile: CompileSetting = "auto",
) -> Extend:
    """``Extend`` from an HF causal LM: one ``adwin.decode.generate.generate`` call per round.

    Sampling follows ``generation_kwargs`` (HF ``generate`` arguments, e.g. the host trainer's
    ``temperature``/``top_p``/``top_k``) over ``do_sample=True`` and the model's generation config. Each
    context is cut to its own budget and just after its first EOS (kept: it is a trained token). ``compile``:
    decode on a static cache with transformers' compiled step (``auto``: on CUDA; ``rollout.compile``).
    """
    eos = {int(e) for e in eos_ids}
    sampling = {"do_sample": True, **(generation_kwargs or {})}

    def extend(contexts: list[list[int]], budgets: list[int]) -> tuple[list[list[int]], list[bool]]:
        g = generate(model, contexts, budgets, eos=eos, pad_id=pad_id, sampling=sampling, compile=compile)
        return g.response_ids, g.finished

    return extend
