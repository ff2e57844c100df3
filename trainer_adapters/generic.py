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

``hf_extender`` and ``teacher_scorer`` build both from transformers models.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from adwin.audit.alignment import AuditResult, ProbeBatch, audit
from adwin.controller.api import ControllerAPI
from adwin.controller.feasibility import expiry_warning
from adwin.controller.schemas import (
    AuditIn,
    AuditOut,
    OfferIn,
    ProbeOfferItem,
    ProbeOut,
    ProbePlanOut,
    ProbeReportIn,
    RunIn,
    StepMetricsIn,
)
from adwin.objectives.losses import token_logprobs
from adwin.probes.offers import OFFER_FINISHED, is_complete, offer_indices
from adwin.runtime.resilient_controller import controller_metrics, drain_controller
from adwin.sampling.rollout import generate, layout, response_values
from adwin.trainer_adapters.registration import check_feasible, register, resilient

logger = logging.getLogger(__name__)

Extend = Callable[[list[list[int]], list[int]], tuple[list[list[int]], list[bool]]]
Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class HeldProbe:
    """A probe this process holds: its tokens and the student version of each response token."""

    prompt_ids: list[int]
    response_ids: list[int]
    versions: list[int]
    finished: bool = False


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

    ``offer_finished`` (``probes.offers``): ``"always"`` (the adapters' default) also offers rollouts that
    finished inside the window as complete probes, so a window most rollouts fit into keeps auditing;
    ``"at_horizon"`` is the paper's rule (unfinished prefixes only, finished ones at the full horizon).
    ``resume=True`` continues a run id registered with another spec instead of raising ``RunConflict``.
    ``resilient_controller=True`` (default) trains on through a controller outage (``ResilientController``); call
    ``close()`` at the end to deliver the writes buffered meanwhile. ``rollouts_per_step`` (when known)
    lets the feasibility check count the rollouts a step can offer at most.
    """

    def __init__(self, controller: ControllerAPI, run: str | RunIn, *, offer_finished: str = "always",
                 resume: bool = False, resilient_controller: bool = True, rollouts_per_step: int | None = None) -> None:
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
        self._expiry_warned = False
        self.probes: dict[str, HeldProbe] = {}
        self.stats = ClientStats()
        self.last_window: int | None = None
        self.last_step: int | None = None  # the batch forms at it: the controller's reads do not record it

    # --- window -----------------------------------------------------------------------------------

    def window(self, step: int) -> int:
        """The response-token cap for ``step``; cached by the controller, never blocks on probes."""
        self.last_window = self.controller.get_window(self.run_id, step).window
        self.last_step = step
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
        chosen = offer_indices(done, cap, self.max_len, self.offer_finished)[:limit]
        items: list[ProbeOfferItem] = []
        by_id: dict[str, HeldProbe] = {}
        for i in chosen:
            p, r = prompts[i], responses[i]
            sid = f"{self.run_id}:{step}:{i}"
            key = prompt_keys[i] if prompt_keys is not None else _prompt_key(p)
            items.append(ProbeOfferItem(sample_id=sid, prompt_id=key, response_len=len(r), version=version))
            by_id[sid] = HeldProbe(list(map(int, p)), list(map(int, r)), [version] * len(r),
                                   finished=is_complete(done[i], len(r), self.max_len))
        if not items:
            return []
        out = self.controller.offer_probes(
            self.run_id, OfferIn(step=step, offers=items), idempotency_key=f"offer:{step}:{items[0].sample_id}"
        )
        for pid in out.accepted:
            self.probes[pid] = by_id[pid]
        self.stats.offered += len(items)
        self.stats.accepted += len(out.accepted)
        return list(out.accepted)

    def probe_plan(self, step: int) -> ProbePlanOut:
        return self.controller.probe_plan(self.run_id, step)

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
        gone = [pid for pid, p in self.probes.items()
                if p.finished and p.versions and version - min(p.versions) > self.staleness_limit]
        for pid in gone:
            del self.probes[pid]
        self.stats.expired += len(gone)
        warning = expiry_warning(self.stats.expired, self.stats.accepted, probe_batch_size=self.probe_batch_size,
                                 staleness_limit=self.staleness_limit)
        if warning and not self._expiry_warned:
            self._expiry_warned = True
            logger.warning("run %s: %s", self.run_id, warning)
        return len(gone)

    def extend_probes(self, step: int, extend: Extend, *, version: int, to_full: bool = False) -> int:
        """One extension round over the held active probes; returns the probe tokens generated.

        Each probe grows by at most the plan's ``extend_by`` (the current window), or to the full
        horizon when the controller marks it ``force_complete`` (staleness reached S) or ``to_full``
        is set (a loop that finishes its probes in one full-length generation call). Probes the
        controller lists but this process does not hold belong to other processes and are skipped.
        """
        self.forget_expired(version)
        plan = self.probe_plan(step)
        forced = set(plan.force_complete)
        held = [pid for pid in plan.active if pid in self.probes]
        for pid in held:  # offered complete (finished inside the window): nothing to generate
            if self.probes[pid].finished:
                self.report(step, pid, 0, version, finished=True)
                self.stats.completed += 1
        ids = [pid for pid in held if not self.probes[pid].finished]
        if not ids:
            return 0
        budgets = []
        for pid in ids:
            room = self.max_len - len(self.probes[pid].response_ids)
            budgets.append(room if (to_full or pid in forced) else min(plan.extend_by, room))
        contexts = [self.probes[pid].prompt_ids + self.probes[pid].response_ids for pid in ids]
        new_tokens, eos = extend(contexts, budgets)
        added = 0
        for pid, budget, toks, hit_eos in zip(ids, budgets, new_tokens, eos, strict=True):
            probe = self.probes[pid]
            toks = list(map(int, toks))[:budget]
            probe.response_ids += toks
            probe.versions += [version] * len(toks)
            probe.finished = bool(hit_eos) or len(probe.response_ids) >= self.max_len
            is_forced = pid in forced and not probe.finished
            self.report(step, pid, len(toks), version, finished=probe.finished, forced=is_forced)
            added += len(toks)
            self.stats.completed += int(probe.finished or is_forced)
            self.stats.forced += int(is_forced)
        self.stats.probe_tokens += added
        return added

    # --- audits -----------------------------------------------------------------------------------

    def audit_and_submit(
        self,
        model: torch.nn.Module,
        probe_batch: ProbeBatch,
        audit_id: int,
        candidates: Sequence[int] | None = None,
        **audit_kwargs: Any,
    ) -> AuditOut:
        """Audit ``probe_batch`` under the model's current weights and hand the Gram to the controller.

        The controller computes the cosines from the Gram with the run's candidates, so the audit must
        use exactly those. ``audit`` takes gradients with ``autograd.grad``: no ``.grad`` is touched.
        """
        cands = list(candidates) if candidates is not None else self.candidates
        if cands != self.candidates:
            raise ValueError(f"audit candidates {cands} differ from the run's {self.candidates}")
        result: AuditResult = audit(model, probe_batch, cands, **audit_kwargs)
        if result.gram is None:
            raise ValueError(f"audit method {result.method!r} returned no Gram matrix")
        stats = {"elapsed_s": result.elapsed_s, **result.extra}
        out = self.controller.submit_audit(
            self.run_id,
            audit_id,
            AuditIn(
                gram=result.gram.tolist(),
                macro_cosines=result.macro_cosines or None,
                stats={k: float(v) for k, v in stats.items() if math.isfinite(v)},
            ),
            idempotency_key=f"audit:{audit_id}",
        )
        self.stats.audits += 1
        self.stats.audit_s += result.elapsed_s
        self.stats.last_cosines = dict(out.cosines or result.cosines)
        return out

    def maybe_audit(self, model: torch.nn.Module, score: Score, *, pad_id: int, **audit_kwargs: Any) -> AuditOut | None:
        """If the controller has a complete probe batch, audit it and submit; else None.

        The batch's probes are dropped from ``probes`` afterwards (they are consumed).
        """
        batch = self.controller.next_probe_batch(self.run_id, step=self.last_step)
        if batch is None:
            return None
        missing = [pid for pid in batch.probe_ids if pid not in self.probes]
        if missing:
            raise KeyError(f"probe batch {batch.audit_id} names probes this client does not hold: {missing[:3]}")
        held = [self.probes.pop(pid) for pid in batch.probe_ids]
        probe_batch = build_probe_batch(held, score, pad_id=pad_id)
        return self.audit_and_submit(model, probe_batch, batch.audit_id, **audit_kwargs)

    # --- telemetry --------------------------------------------------------------------------------

    def report_step(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self.controller.report_step(self.run_id, StepMetricsIn(step=step, metrics=clean), idempotency_key=f"step:{step}")

    def metrics(self) -> dict[str, float]:
        """``window/*`` and ``probe/*`` values for the trainer's own logger."""
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
            "probe/held": float(len(self.probes)),
            "probe/audits": float(s.audits),
            "probe/audit_s": float(s.audit_s),
        })
        for c, v in s.last_cosines.items():
            out[f"window/cos@{c}"] = float(v)
        out.update(controller_metrics(self.controller))  # controller/* gauges in degraded mode
        return out

    def close(self, timeout_s: float = 30.0) -> int:
        """End of run: deliver the writes buffered during a controller outage (bounded); returns those left."""
        return drain_controller(self.controller, timeout_s)


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
    and an audit. ``versions`` tags each response token with the student version that produced it.
    """
    if not prompts:
        raise ValueError("pack needs at least one row")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("each row needs at least one prompt token (column 0 has no predictor)")
    rows = layout(prompts, responses, pad_id)
    tags = None if versions is None else response_values(rows, versions, fill=-1, dtype=torch.long)  # (B, L)
    with torch.no_grad():
        teacher = score(rows.input_ids, rows.attention_mask).float() * rows.response_mask  # (B, L), 0 off the response
    return ProbeBatch(rows.input_ids, rows.attention_mask, rows.response_mask, teacher, versions=tags)


def build_probe_batch(probes: Sequence[HeldProbe], score: Score, *, pad_id: int) -> ProbeBatch:
    """``pack`` of complete held probes, with their version tags."""
    return pack(
        [p.prompt_ids for p in probes], [p.response_ids for p in probes], score,
        pad_id=pad_id, versions=[p.versions for p in probes],
    )


def teacher_scorer(teacher: torch.nn.Module, *, temperature: float = 1.0) -> Score:
    """``Score`` from an HF causal LM: log q(token) at each column, logits divided by ``temperature``."""

    def score(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        device = next(teacher.parameters()).device
        ids, am = input_ids.to(device), attention_mask.to(device)
        with torch.no_grad():
            logits = teacher(input_ids=ids, attention_mask=am, position_ids=(am.cumsum(1) - 1).clamp_min(0)).logits
        return token_logprobs(logits / temperature, ids).cpu()  # (B, L)

    return score


def hf_extender(
    model: torch.nn.Module,
    *,
    pad_id: int,
    eos_ids: Iterable[int],
    generation_kwargs: dict[str, Any] | None = None,
) -> Extend:
    """``Extend`` from an HF causal LM: one ``adwin.sampling.rollout.generate`` call per round.

    Sampling follows ``generation_kwargs`` (HF ``generate`` arguments, e.g. the host trainer's
    ``temperature``/``top_p``/``top_k``) over ``do_sample=True`` and the model's generation config. Each
    context is cut to its own budget and just after its first EOS (kept: it is a trained token).
    """
    eos = {int(e) for e in eos_ids}
    sampling = {"do_sample": True, **(generation_kwargs or {})}

    def extend(contexts: list[list[int]], budgets: list[int]) -> tuple[list[list[int]], list[bool]]:
        g = generate(model, contexts, budgets, eos=eos, pad_id=pad_id, sampling=sampling)
        return g.response_ids, g.finished

    return extend
