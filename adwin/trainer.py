"""The synchronous prefix-window OPD trainer (DESIGN.md "The loop", ADWIN sections 4.1-4.2).

``train`` reads top to bottom as one step of the paper's algorithm; the helpers below it do one thing
each. Versions: the student's version is the number of optimizer steps applied, so the rollout of step
``t`` comes from version ``t`` and everything after the update (probe extension, audit) uses ``t + 1``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adwin.checkpoint import save_checkpoint
from adwin.config import TrainConfig
from adwin.controller.api import ControllerAPI
from adwin.controller.schemas import AuditIn, OfferIn, PolicyIn, ProbeOfferItem, RunIn, WindowOut
from adwin.data import (
    Prompt,
    PromptStream,
    builtin_checker,
    builtin_prompts,
    check_routes,
    load_jsonl,
    match_answer,
)
from adwin.losses import opd_loss, token_logprobs
from adwin.metrics_log import ControllerLogger, JsonlLogger, MultiLogger, StdoutLogger, WandbLogger
from adwin.probes.pool import Extension, InlineProbeExecutor, Probe, ProbePool
from adwin.rollout import Rows, encode_prompts, eos_ids, generate, layout, pad_id_of
from adwin.teacher import Teachers, load_model, load_tokenizer

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """Everything a run computes with, loaded and checked before the first step."""

    student: torch.nn.Module
    tokenizer: Any
    teachers: Teachers
    train_prompts: PromptStream
    eval_prompts: list[Prompt]
    checker: Callable[[str, str], bool]


@dataclass
class Batch:
    """One step's rollouts: ragged per-sample lists plus their right-padded rows."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]
    rows: Rows


@dataclass
class TrainResult:
    run_id: str
    run_dir: Path
    initial_eval: dict[str, float]
    final_eval: dict[str, float]
    history: list[dict[str, Any]]
    totals: dict[str, float] = field(default_factory=dict)


def train(cfg: TrainConfig, controller: ControllerAPI, parts: Parts | None = None,
          on_step: Callable[[int, dict[str, Any]], None] | None = None) -> TrainResult:
    """Distill ``parts.student`` for ``cfg.steps`` steps, windows decided by ``controller``."""
    parts = parts or load_parts(cfg)
    seed_everything(cfg.seed)
    run_dir = Path(cfg.out_dir) / cfg.name
    run_id = controller.register_run(run_spec(cfg)).run_id
    sinks = open_loggers(cfg, run_dir, controller, run_id)
    optimizer, scheduler = build_optimizer(cfg, parts.student)
    gen = Sampler(parts, cfg)
    pool = ProbePool(cfg.rollout.max_response_len)
    executor = InlineProbeExecutor(pool, gen.extend)
    ledger = TokenLedger(cfg.rollout.max_response_len)
    probing = cfg.window.policy == "adwin" and cfg.probes.offers_per_step > 0
    clock, started = Clock(), time.perf_counter()
    with clock("eval"):
        initial = evaluate(parts, cfg, gen)
    final = initial
    for t in range(cfg.steps):
        win = controller.get_window(run_id, t)
        prompts = parts.train_prompts.next_batch(cfg.rollout.prompts_per_step)
        with clock("rollout"):
            batch = gen.roll_out(prompts, cfg.rollout.samples_per_prompt, win.window)
        with clock("teacher"):
            teacher = score_teacher(parts.teachers, batch, cfg)
        with clock("train"):
            m, behavior = optimize(parts.student, optimizer, scheduler, batch, teacher, cfg, win.window)
        version = t + 1  # optimizer steps applied: the weights every probe token from now on comes from
        if probing:
            with clock("probe"):
                offered = offer_prefixes(controller, run_id, t, batch, behavior, pool, win.window)
                m |= offered | extend_probes(controller, run_id, version, executor, pool, ledger,
                                             cfg.probes.staleness_limit)
            with clock("audit"):
                m |= audit_ready_batch(controller, run_id, pool, parts, cfg, optimizer, version)
        m |= window_metrics(win) | ledger.record(batch, win.window, pool.tokens_generated)
        if t == 0:
            m |= initial
        if (cfg.eval.every and (t + 1) % cfg.eval.every == 0) or t == cfg.steps - 1:
            with clock("eval"):
                final = evaluate(parts, cfg, gen)
            m |= final
        if (cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0) or t == cfg.steps - 1:
            save_checkpoint(run_dir, version, parts.student, parts.tokenizer, optimizer, scheduler,
                            controller.get_run(run_id).policy_state)
        m |= clock.metrics() | {"optim/lr": scheduler.get_last_lr()[0], "time/wall": time.perf_counter() - started}
        sinks.log(t, m)
        clock.reset()  # after logging: step 0 carries the initial evaluation's time
        if on_step is not None:
            on_step(t, m)
    sinks.close()
    return TrainResult(run_id, run_dir, initial, final, sinks.history, ledger.totals(pool.tokens_generated))


# --------------------------------------------------------------------------------------------- setup


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_parts(cfg: TrainConfig, profile: str = "default") -> Parts:
    """Load student, teachers and prompts; check tokenizers and routes before any compute.

    ``builtin`` model paths come from the built-in task's prepared assets of ``profile`` (``tiny`` for tests).
    """
    assets = None
    uses_builtin = cfg.model.student == "builtin" or "builtin" in cfg.model.teachers.values()
    if uses_builtin:
        from adwin import tasks

        assets = tasks.ensure_prepared(profile=profile, seed=cfg.seed)
    student_path = assets.student_path if cfg.model.student == "builtin" and assets else cfg.model.student
    tok_path = assets.tokenizer_path if cfg.model.student == "builtin" and assets else student_path
    tokenizer = load_tokenizer(tok_path)
    student = load_model(student_path, cfg.model.dtype, cfg.model.device)
    teacher_paths = resolve_teachers(cfg.model.teachers, assets)
    teachers = Teachers.load(teacher_paths, tokenizer, int(student.config.vocab_size), cfg.model.dtype, cfg.model.device)
    train_p, eval_p = load_prompts(cfg)
    check_routes(train_p + eval_p, list(teachers.models))
    checker = builtin_checker() if cfg.data.task == "builtin" else match_answer
    return Parts(student, tokenizer, teachers, PromptStream(train_p, cfg.seed), eval_p, checker)


def resolve_teachers(spec: dict[str, str], assets: Any) -> dict[str, str]:
    """``{"default": "builtin"}`` means all of the built-in task's teachers, keyed by route."""
    if assets is not None and spec == {"default": "builtin"}:
        return {k: str(v) for k, v in assets.teacher_paths.items()}
    out = {}
    for key, path in spec.items():
        if path == "builtin":
            if assets is None or key not in assets.teacher_paths:
                raise ValueError(f"model.teachers.{key}: no built-in teacher for route {key!r}")
            path = str(assets.teacher_paths[key])
        out[key] = path
    return out


def load_prompts(cfg: TrainConfig) -> tuple[list[Prompt], list[Prompt]]:
    d = cfg.data
    if d.task == "builtin":
        n_train = min(cfg.steps * cfg.rollout.prompts_per_step, 100_000)
        return builtin_prompts(n_train, cfg.seed, "train"), builtin_prompts(cfg.eval.n_problems, cfg.seed, "eval")
    assert d.path is not None  # the config validator guarantees it
    train_p = load_jsonl(d.path, d.route_key)
    if d.eval_path:
        return train_p, load_jsonl(d.eval_path, d.route_key)[: cfg.eval.n_problems]
    # No eval file: hold out the tail (at most a fifth of the file) so eval prompts are never trained on.
    n_hold = max(1, min(cfg.eval.n_problems, d.n_eval, len(train_p) // 5))
    if len(train_p) <= n_hold:
        raise ValueError(f"data.path has {len(train_p)} prompts: too few to hold out evaluation problems")
    return train_p[:-n_hold], train_p[-n_hold:]


def run_spec(cfg: TrainConfig) -> RunIn:
    w, p = cfg.window, cfg.probes
    policy = PolicyIn(name=w.policy, candidates=w.candidates, threshold=w.threshold,
                      max_len=cfg.rollout.max_response_len, initial=w.initial, window=w.window,
                      start=w.start, step=w.step)
    return RunIn(name=cfg.name, policy=policy, probe_batch_size=p.batch_size, staleness_limit=p.staleness_limit,
                 offers_per_step=p.offers_per_step, max_active_probes=p.max_active, lookahead=p.lookahead,
                 selection=p.selection, seed=cfg.seed, config=cfg.model_dump(mode="json"))


def open_loggers(cfg: TrainConfig, run_dir: Path, controller: ControllerAPI, run_id: str) -> MultiLogger:
    resolved = cfg.model_dump(mode="json")
    sinks: list[Any] = [JsonlLogger(run_dir, resolved), ControllerLogger(controller, run_id)]
    if cfg.logging.stdout:
        sinks.append(StdoutLogger(keys=["window/current", "loss/total", "loss/teacher_kl", "eval/accuracy"]))
    if cfg.logging.wandb != "off":
        sinks.append(WandbLogger(cfg.logging.wandb, run_dir, cfg.name, resolved))
    return MultiLogger(sinks)


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with linear warmup, then a constant, cosine or linear decay to zero at ``cfg.steps``."""
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / (o.warmup_steps + 1)
        frac = (step - o.warmup_steps) / max(1, cfg.steps - o.warmup_steps)
        if o.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))
        if o.schedule == "linear":
            return max(0.0, 1.0 - frac)
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------- step pieces


class Sampler:
    """Student sampling for rollouts, probe extension and evaluation (transformers ``generate``)."""

    def __init__(self, parts: Parts, cfg: TrainConfig) -> None:
        self.parts, self.cfg = parts, cfg
        self.eos = eos_ids(parts.student, parts.tokenizer)
        self.pad = pad_id_of(parts.tokenizer, self.eos)

    def roll_out(self, prompts: list[Prompt], n: int, window: int) -> Batch:
        """``n`` samples per prompt, at most ``window`` tokens each, then right-padded rows for scoring."""
        rep = [p for p in prompts for _ in range(n)]
        ctx = encode_prompts(self.parts.tokenizer, [p.prompt for p in rep], self.cfg.data.max_prompt_len)
        r = self.cfg.rollout
        g = generate(self.parts.student, ctx, [window] * len(ctx), eos=self.eos, pad_id=self.pad,
                     temperature=r.temperature, top_p=r.top_p)
        return Batch(rep, ctx, g.response_ids, g.finished, layout(ctx, g.response_ids, self.pad))

    def extend(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        """Probe extension with the newest weights; records behavior logprobs per token."""
        r = self.cfg.rollout
        g = generate(self.parts.student, contexts, budgets, eos=self.eos, pad_id=self.pad,
                     temperature=r.temperature, top_p=r.top_p, with_logprobs=True)
        return Extension(g.response_ids, g.logprobs or [[] for _ in contexts], g.finished)


@dataclass
class TeacherSignal:
    logprobs: torch.Tensor  # (B, L) realized-token teacher logprobs
    logits: torch.Tensor | None = None  # (B, L, V) raw layout, dense losses only
    topk_ids: torch.Tensor | None = None  # (B, L, k) aligned with input_ids
    topk_logprobs: torch.Tensor | None = None  # (B, L, k)


def score_teacher(teachers: Teachers, batch: Batch, cfg: TrainConfig) -> TeacherSignal:
    """Realized-token logprobs always; full logits or top-k only when the configured loss needs them."""
    ids, attn, routes = batch.rows.input_ids, batch.rows.attention_mask, [p.route for p in batch.prompts]
    if cfg.loss.name == "reverse_kl_pg":
        return TeacherSignal(teachers.score(ids, attn, routes))
    logits = teachers.logits(ids, attn, routes)  # (B, L, V)
    signal = TeacherSignal(token_logprobs(logits, ids), logits=logits)
    if cfg.loss.name == "forward_kl_topk":
        aligned = torch.nn.functional.pad(torch.log_softmax(logits[:, :-1], -1), (0, 0, 1, 0))  # (B, L, V)
        signal.topk_logprobs, signal.topk_ids = aligned.topk(min(cfg.loss.topk, logits.shape[-1]), dim=-1)
        signal.logits = None
    return signal


def optimize(student: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, batch: Batch,
             teacher: TeacherSignal, cfg: TrainConfig, window: int) -> tuple[dict[str, float], torch.Tensor]:
    """One AdamW step on the OPD loss over the first ``window`` response tokens.

    Returns the metrics and the student's per-token logprobs before the update (B, L): the behavior
    logprobs of this step's prefixes, which probes carry forward.
    """
    rows, lc = batch.rows, cfg.loss
    device = next(student.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    logits = student(input_ids=rows.input_ids.to(device), attention_mask=rows.attention_mask.to(device)).logits
    loss, lm = opd_loss(
        lc.name, input_ids=rows.input_ids.to(device), response_mask=rows.response_mask.to(device),
        student_logits=logits, teacher_logprobs=teacher.logprobs.to(device),
        teacher_logits=None if teacher.logits is None else teacher.logits.to(device),
        teacher_topk_ids=None if teacher.topk_ids is None else teacher.topk_ids.to(device),
        teacher_topk_logprobs=None if teacher.topk_logprobs is None else teacher.topk_logprobs.to(device),
        window=window, aggregation=lc.aggregation, beta=lc.jsd_beta, clip_low=lc.clip_low, clip_high=lc.clip_high,
    )
    loss.backward()
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), clip)
    optimizer.step()
    scheduler.step()
    behavior = token_logprobs(logits.detach(), rows.input_ids.to(device)).cpu()  # (B, L)
    metrics = {"loss/total": float(loss.detach()), "loss/teacher_kl": lm.get("loss/teacher_kl", float("nan")),
               "loss/tokens": lm["loss/tokens"], "optim/grad_norm": float(grad_norm)}
    return metrics, behavior


def offer_prefixes(controller: ControllerAPI, run_id: str, step: int, batch: Batch, behavior: torch.Tensor,
                   pool: ProbePool, window: int) -> dict[str, float]:
    """Offer this step's unfinished prefixes; the ones the controller accepts enter the pool.

    At the full horizon nothing is unfinished, yet the window must still be able to shrink again: then
    every rollout is offered as an already complete probe (a full rollout costs no extension at all).
    """
    at_horizon = window >= pool.max_response_len
    picks = [b for b, done in enumerate(batch.finished) if at_horizon or not done]
    items = {f"s{step}-{b}": b for b in picks}
    offers = [ProbeOfferItem(sample_id=sid, prompt_id=batch.prompts[b].id, response_len=len(batch.response_ids[b]),
                             version=step) for sid, b in items.items()]
    accepted = controller.offer_probes(run_id, OfferIn(step=step, offers=offers),
                                       idempotency_key=f"{run_id}-offer-{step}").accepted if offers else []
    for sid in accepted:
        b = items[sid]
        n_p, n_r = len(batch.prompt_ids[b]), len(batch.response_ids[b])
        lp = behavior[b, n_p : n_p + n_r].tolist()
        pool.add(Probe(sid, list(batch.prompt_ids[b]), list(batch.response_ids[b]), [step] * n_r, lp,
                       batch.prompts[b].route, submitted_step=step,
                       finished=batch.finished[b] or n_r >= pool.max_response_len))
    return {"probe/offered": float(len(offers)), "probe/accepted": float(len(accepted))}


def extend_probes(controller: ControllerAPI, run_id: str, version: int, executor: InlineProbeExecutor,
                  pool: ProbePool, ledger: TokenLedger, limit: int) -> dict[str, float]:
    """One probe round under the controller's plan with weights ``version``; report every probe."""
    plan = controller.probe_plan(run_id, version)
    stats = executor.run_round(plan, version)
    for rep in stats.reports:
        controller.report_probe(run_id, rep, idempotency_key=f"{run_id}-probe-{rep.probe_id}-{version}")
        probe = pool.get(rep.probe_id) if rep.probe_id in pool else None
        if rep.finished and probe is not None and probe.versions and probe.versions[-1] > probe.submitted_step:
            ledger.completed_lengths.append(len(probe.response_ids))  # a truncated sample's full length
    # Staleness of every probe this round touched (extended or force-completed): the controller forces
    # completion when it reaches S, so anything above S is a scheduling bug, not a tuning matter.
    stale = [pool.get(r.probe_id).staleness(version) for r in stats.reports if r.probe_id in pool]
    if stale and max(stale) > limit:
        raise RuntimeError(f"probe staleness {max(stale)} exceeds the limit S={limit} at version {version}")
    return {"probe/active": float(len(plan.active)), "probe/forced": float(stats.forced),
            "probe/completed": float(stats.completed), "probe/tokens": float(stats.tokens), "probe/pool": float(len(pool)),
            "probe/staleness_max": float(max(stale, default=0)),
            "probe/staleness_mean": float(np.mean(stale)) if stale else 0.0}


def audit_ready_batch(controller: ControllerAPI, run_id: str, pool: ProbePool, parts: Parts, cfg: TrainConfig,
                      optimizer: torch.optim.Optimizer, version: int) -> dict[str, float]:
    """When P probes are complete: audit them under the current weights and submit the cosines."""
    from adwin.alignment import audit

    ready = controller.next_probe_batch(run_id, idempotency_key=f"{run_id}-batch-{version}")
    if ready is None:
        return {}
    probes = pool.pop(ready.probe_ids)
    stale = [p.staleness(version) for p in probes]
    if max(stale) > cfg.probes.staleness_limit:  # complete probes can wait in the queue past S
        log.warning("audit %d consumes probes %d steps stale (S=%d): they waited complete for a batch to fill",
                    ready.audit_id, max(stale), cfg.probes.staleness_limit)
    batch = pool.probe_batch(probes, pad_id_of(parts.tokenizer, eos_ids(parts.student, parts.tokenizer)),
                             parts.teachers.score)
    res = audit(parts.student, batch, cfg.window.candidates, method=cfg.audit.method, metric=cfg.audit.metric,
                optimizer=optimizer, sketch_dim=cfg.audit.sketch_dim, seed=cfg.seed)
    out = controller.submit_audit(run_id, ready.audit_id,
                                  AuditIn(cosines=res.cosines, macro_cosines=res.macro_cosines or None,
                                          stats={"elapsed_s": res.elapsed_s, "probes": float(len(probes))}),
                                  idempotency_key=f"{run_id}-audit-{ready.audit_id}")
    m = {"audit/id": float(ready.audit_id), "audit/time": res.elapsed_s, "audit/staleness_max": float(max(stale)),
         "audit/staleness_mean": float(np.mean(stale)), "audit/probe_tokens": float(batch.response_mask.sum())}
    m |= {f"audit/micro_cos_{c}": v for c, v in res.cosines.items()}
    m |= {f"audit/macro_cos_{c}": v for c, v in res.macro_cosines.items()}
    if out.decision is not None:
        m["audit/next_window"] = float(out.decision.window)
    return m


def window_metrics(win: WindowOut) -> dict[str, Any]:
    m: dict[str, Any] = {"window/current": float(win.window), "window/reason": win.reason}
    m |= {f"window/cos_{c}": float(v) for c, v in (win.cosines or {}).items()}
    return m


class TokenLedger:
    """Rollout token accounting: sync tokens vs. what a full-rollout run of the same steps would generate.

    Full-rollout estimate per step: finished samples count their real length; each truncated sample
    counts the mean length of the probes completed so far (probes *are* truncated samples continued to
    EOS or the horizon), clamped to ``[window, max_len]``; before any probe completes, ``max_len`` (an
    upper bound). A full-policy run has no truncation below ``max_len``, so its estimate is exact.
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.completed_lengths: list[int] = []
        self.sync = self.full = 0.0

    def record(self, batch: Batch, window: int, probe_tokens_total: int) -> dict[str, float]:
        lens = [len(r) for r in batch.response_ids]
        truncated = [not f for f in batch.finished]
        est = float(np.mean(self.completed_lengths)) if self.completed_lengths else float(self.max_len)
        est = min(max(est, float(window)), float(self.max_len))
        sync = float(sum(lens))
        full = float(sum(n for n, cut in zip(lens, truncated, strict=True) if not cut)) + est * sum(truncated)
        self.sync += sync
        self.full += full
        return {"rollout/sync_tokens": sync, "rollout/full_equiv_tokens": full,
                "rollout/truncated_frac": float(np.mean(truncated)), "rollout/mean_len": float(np.mean(lens)),
                "rollout/sync_tokens_total": self.sync, "rollout/full_equiv_tokens_total": self.full,
                "probe/tokens_total": float(probe_tokens_total)}

    def totals(self, probe_tokens_total: int) -> dict[str, float]:
        return {"sync_tokens": self.sync, "probe_tokens": float(probe_tokens_total), "full_equiv_tokens": self.full}


class Clock:
    """Wall time per phase of the current step (``time/<phase>``)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def reset(self) -> None:
        self.spent = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.spent.items()}


# -------------------------------------------------------------------------------------------- eval


@torch.no_grad()
def evaluate(parts: Parts, cfg: TrainConfig, gen: Sampler, chunk: int = 64) -> dict[str, float]:
    """Accuracy mean@k on held-out problems and the teacher KL (k1 of KL(p || q)) on those rollouts."""
    e = cfg.eval
    problems = [p for p in parts.eval_prompts[: e.n_problems] for _ in range(e.k)]
    correct, kl_sum, kl_tokens, lengths = [], 0.0, 0.0, []
    for i in range(0, len(problems), chunk):
        part = problems[i : i + chunk]
        ctx = encode_prompts(parts.tokenizer, [p.prompt for p in part], cfg.data.max_prompt_len)
        g = generate(parts.student, ctx, [cfg.rollout.max_response_len] * len(ctx), eos=gen.eos, pad_id=gen.pad,
                     temperature=e.temperature, top_p=e.top_p)
        texts = parts.tokenizer.batch_decode(g.response_ids, skip_special_tokens=True)
        correct += [parts.checker(txt, p.answer) for txt, p in zip(texts, part, strict=True) if p.answer is not None]
        rows = layout(ctx, g.response_ids, gen.pad)
        dev = next(parts.student.parameters()).device
        logits = parts.student(input_ids=rows.input_ids.to(dev), attention_mask=rows.attention_mask.to(dev)).logits
        s_lp = token_logprobs(logits, rows.input_ids.to(dev)).cpu()  # (b, L)
        t_lp = parts.teachers.score(rows.input_ids, rows.attention_mask, [p.route for p in part])  # (b, L)
        mask = rows.response_mask.float()
        kl_sum += float(((s_lp - t_lp) * mask).sum())
        kl_tokens += float(mask.sum())
        lengths += [len(r) for r in g.response_ids]
    out = {"eval/teacher_kl": kl_sum / max(kl_tokens, 1.0), "eval/mean_len": float(np.mean(lengths))}
    if correct:
        out["eval/accuracy"] = float(np.mean(correct))
    return out
