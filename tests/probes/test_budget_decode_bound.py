"""The decision budget where decoding dominates the learner's wall (a GPU's regime: a decode step costs about the
same for 1 row or 64, so an inline probe round of ``W`` steps costs the learner as much as a rollout call of ``W``
steps), on a fake clock: the seconds gate (``audit.budget_seconds``) keeps the learner-side decision share under
``audit.budget`` over a 40-step run where FLOPs alone would not, and the audit's own work on the learner (the
teacher's scoring of the probe batch, the audit's segment forward and backward) is counted in the budget."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.audit.alignment import AuditResult
from adwin.audit.budget import DecisionBudget
from adwin.audit.job import AuditJob, AuditOutcome
from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.probes.async_executor import AsyncProbeExecutor
from adwin.probes.client import InlineAuditor, ProbeClient
from adwin.probes.pool import Extension, Probe, ProbePool
from adwin.probes.settings import audit_settings, decision_budget
from adwin.probes.workers import InlineWorker

W, H, PROMPT = 32, 64, 8  # window, horizon, prompt tokens: a probe completes in one round of W steps
ROWS, P, S, OFFERS = 512, 8, 4, 8  # training rows per step; probe batch, staleness limit, offers per step
DECODE_S = 0.02  # one decode step, whatever the rows (launch-bound)
TRAIN_S = 0.05  # the teacher's scoring and the update of a step: small beside its decoding
SCORE_S, AUDIT_S = 0.03, 0.08  # the teacher's scoring of one probe batch; one audit's segment passes
CANDS = [16, 32]


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class TimedAuditor:
    """Audits on the learner (as ``inline`` and ``rollout`` do): ``AUDIT_S`` of its clock per audit."""

    clock: FakeClock
    jobs: list[AuditJob] = field(default_factory=list)

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        self.jobs.append(job)
        self.clock.spend(AUDIT_S)
        cos = {c: 0.9 for c in CANDS}
        out: Future[AuditOutcome] = Future()
        out.set_result(AuditOutcome(job.audit_id, job.version, AuditResult(CANDS, cos, elapsed_s=AUDIT_S), {}))
        return out


def _client(clock: FakeClock, budget: DecisionBudget) -> ProbeClient:
    ctl = Controller()
    run = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=CANDS, max_len=H, threshold=0.5),
                                 probe_batch_size=P, offers_per_step=OFFERS, staleness_limit=S,
                                 max_active_probes=64)).run_id
    pool = ProbePool(H)

    def extend(contexts: list[list[int]], budgets: list[int]) -> Extension:  # an inline round: W decode steps
        clock.spend(DECODE_S * max(budgets, default=0))
        return Extension([[7] * b for b in budgets], [[-1.0] * b for b in budgets], [False] * len(budgets))

    def score(ids: torch.Tensor, mask: torch.Tensor, routes: list[str]) -> torch.Tensor:
        clock.spend(SCORE_S)
        return torch.zeros(ids.shape)

    return ProbeClient(ctl, run, pool, S, executor=AsyncProbeExecutor(pool, lambda: InlineWorker(extend)),
                       auditor=TimedAuditor(clock), settings=audit_settings(AuditConfig(), CANDS), score=score,
                       budget=budget, clock=clock, probe_batch_size=P)


def _budget(gate: bool) -> DecisionBudget:
    return decision_budget(AuditConfig(budget=0.1, budget_seconds=gate), probe_batch=P, staleness_limit=S,
                           offers_per_step=OFFERS, n_student=1000, n_teacher=1000, max_prompt_len=PROMPT,
                           max_response_len=H, min_window=min(CANDS), drift=False)


def _run(gate: bool, steps: int = 40) -> tuple[dict[str, float], ProbeClient]:
    """The sync trainer's step order with a decode-bound rollout: rollout, teacher + update, offer, rounds, audit."""
    clock = FakeClock()
    client = _client(clock, _budget(gate))
    for t in range(steps):
        clock.spend(DECODE_S * W + TRAIN_S)
        records = [Probe(f"s{t}-{b}", [1] * PROMPT, [7] * W, [t] * W, [-1.0] * W, submitted_step=t,
                         prompt_id=f"p{b}") for b in range(OFFERS)]  # the step's unfinished rollouts
        client.offer(t, records, [False] * OFFERS, W)
        client.advance(t + 1)
        client.audit(t + 1, release=t == steps - 1)
        client.record_train(float(ROWS * (PROMPT + W)), DECODE_S * W + TRAIN_S)
    return client.decision_metrics(), client


def test_the_seconds_gate_holds_the_learner_share_under_the_budget_where_decoding_dominates() -> None:
    gated, client = _run(gate=True)
    flops_only, _ = _run(gate=False)
    assert gated["decision/flops_share"] < 0.1 and flops_only["decision/flops_share"] < 0.1  # FLOPs never bind
    assert flops_only["decision/learner_share"] > 0.3  # a round of W steps every step: FLOPs do not see it
    assert gated["decision/learner_share"] <= 0.1
    assert gated["decision/decisions"] >= 2 and client.counts["audits"] == gated["decision/decisions"]  # not starved
    assert gated["decision/pressure_seconds"] > 1.0  # the learner's clock is what binds


def test_the_audits_own_work_on_the_learner_is_counted_in_the_budget() -> None:
    clock = FakeClock()
    client = _client(clock, _budget(gate=True))
    records = [Probe(f"p{b}", [1] * PROMPT, [7] * (H - 1), [0] * (H - 1), [-1.0] * (H - 1), prompt_id=f"p{b}")
               for b in range(P)]
    client.offer(0, records, [True] * P, H, complete_now=True)  # complete: no round, no decode of its own
    before = clock.now
    m = client.audit(1)
    b = client.budget
    assert m["audit/submitted"] == 1 and b is not None and b.decisions == 1
    assert b.seconds["scoring"] == pytest.approx(SCORE_S) and b.seconds["audit"] == pytest.approx(AUDIT_S)
    assert b.learner_seconds >= clock.now - before == pytest.approx(SCORE_S + AUDIT_S)  # both on the learner
    assert b.tokens["scoring"] == b.tokens["audit"] == P * (PROMPT + H - 1)  # FLOPs of the probe batch, both kinds


def test_a_real_inline_audit_is_inside_the_learner_seconds_it_is_charged() -> None:
    """The same with the real audit on a tiny model and the real clock: its segment forward and backward, and the
    teacher's scoring, are learner seconds (``decision/learner_share``), not only ``decision/seconds_share``."""
    import time

    model = make_tiny_llama(vocab_size=64, seed=3)
    teacher = make_tiny_llama(vocab_size=64, seed=4)
    scored: list[float] = []

    def score(ids: torch.Tensor, mask: torch.Tensor, routes: list[str]) -> torch.Tensor:
        t0 = time.perf_counter()
        lp = torch.log_softmax(teacher(input_ids=ids, attention_mask=mask).logits.float(), -1)[:, :-1]
        out = torch.zeros(ids.shape)
        out[:, 1:] = lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        scored.append(time.perf_counter() - t0)
        return out

    ctl = Controller()
    run = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=CANDS, max_len=H, threshold=0.5),
                                 probe_batch_size=P, offers_per_step=OFFERS, staleness_limit=S)).run_id
    client = ProbeClient(ctl, run, ProbePool(H), S, auditor=InlineAuditor(model), score=score,
                         settings=audit_settings(AuditConfig(), CANDS), budget=_budget(gate=True))
    g = torch.Generator().manual_seed(0)
    records = [Probe(f"p{b}", [1, 5, 6], torch.randint(3, 64, (H - 2,), generator=g).tolist(), [0] * (H - 2),
                     [-1.0] * (H - 2), prompt_id=f"p{b}") for b in range(P)]
    client.offer(0, records, [True] * P, H, complete_now=True)
    m = client.audit(1)
    b = client.budget
    assert m["audit/submitted"] == 1 and b is not None and scored
    assert b.seconds["audit"] == pytest.approx(m["audit/time"]) and b.seconds["scoring"] >= scored[0]
    assert b.learner_seconds >= m["audit/time"] + scored[0]
