"""The decision budget: how much of the learner's compute ADWIN's decisions may take (``audit.budget``).

Math layer, no torch, no imports from the controller, the probes or the loops. Two pieces:

* ``FlopsModel``: the project's one FLOPs formula (``FLOPS_FORMULA``; ``adwin bench compare`` estimates a
  run's FLOPs with it), split by what each part pays for: training (per trained token: the student's
  generation, the teacher's scoring, the student's forward and backward) and each decision kind (probe
  extension, the teacher's scoring of probe batches, the drift diagnostics' teacher forward, the audit).
  FLOPs come from token counts and parameter counts, so a share means the same on every machine.
* ``DecisionBudget``: per step ``record_train``, per decision part ``record_decision``; it answers the
  probe client's two questions, ``allow_offers`` (how many probes to offer this step) and ``pool_size``
  (how many ready probe batches to audit now, as one pooled audit), keeps the decision FLOPs' share of
  all FLOPs at most ``budget`` (up to the first decision's cost, which is never delayed, and the error of
  the per-probe cost estimate),
  with ``gate_seconds`` also the learner's own decision seconds' share of its wall, and reports
  ``decision/*`` metrics. ``budget=None`` keeps today's behaviour: every ready batch audited.

The cadence rule, and why decisions are pooled rather than only made rarer: docs/decisions.md,
"Decision budget".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from adwin.audit.sizing import EvidenceSizer

DecisionKind = Literal["extension", "scoring", "drift", "audit"]
KINDS: tuple[str, ...] = get_args(DecisionKind)

FLOPS_FORMULA = (
    "FLOPs = (2·N_s + 2·N_t + 6·N_s) · (prompt + response tokens of the training rollouts)"
    " + 2·N_s · (probe extension tokens)"
    " + (2·N_t + 6·N_s) · (prompt + response tokens of the audited probe batches)"
)
FLOPS_NOTE = (
    "N_s, N_t: student and teacher parameter counts (all parameters; tied embeddings counted once, which is "
    "the LM-head matmul). 2·N per token for a forward pass (student generation with a KV cache, teacher "
    "scoring), 6·N per token for the student's forward+backward (Kaplan et al. 2020's standard estimate; the "
    "ADWIN paper reports end-to-end training EFLOPs without stating its formula). The audit counts as one "
    "forward+backward (`fast` measured 1.12x a plain one, docs/benchmarks.md). Not counted: attention's "
    "context-length term, the prefill repeated by each probe extension round, and evaluation (identical for "
    "every method). A LoRA student (N_a trainable adapter parameters) computes weight gradients for its adapters "
    "only: its forward+backward is 4·N_s + 2·N_a per token instead of 6·N_s."
)

FORWARD = 2.0  # FLOPs per parameter per token of a forward pass
FORWARD_BACKWARD = 6.0  # of a forward and a backward pass


class BudgetError(ValueError):
    """A decision budget built or fed with values it cannot use (the message names the argument)."""


def pool_limit(pool_max: int, offer_cap: int, staleness_limit: int, probe_batch: int) -> int:
    """The most batches of P one decision may pool: ``pool_max``, and no more than the controller takes in
    ``S // 2`` steps of offers (``offer_cap`` each), so that a round's first probes keep the other half
    of the staleness limit to be extended and to wait for the rest of the pool. The config refuses a
    ``probes.max_active`` below ``pool_limit · P`` (a round must fit)."""
    span = max(1, staleness_limit // 2)
    return max(1, min(pool_max, offer_cap * span // probe_batch))


@dataclass(frozen=True)
class FlopsModel:
    """``FLOPS_FORMULA`` per part. Token counts include the prompt wherever a forward reads it."""

    n_student: int
    n_teacher: int
    n_trainable: int | None = None  # the student's trainable parameters (a LoRA student's adapters); None: all

    def __post_init__(self) -> None:
        if self.n_student < 1 or self.n_teacher < 1:
            raise BudgetError(f"parameter counts must be >= 1, got n_student={self.n_student}, "
                              f"n_teacher={self.n_teacher}")
        if self.n_trainable is not None and not 1 <= self.n_trainable <= self.n_student:
            raise BudgetError(f"n_trainable must be in [1, n_student={self.n_student}], got {self.n_trainable}")

    @property
    def forward_backward(self) -> float:
        """FLOPs per token of the student's forward+backward: ``FORWARD_BACKWARD · N_s`` when every parameter
        trains; the input gradients of every layer (2·N_s) plus the weight gradients of the trainable ones only."""
        if self.n_trainable is None:
            return FORWARD_BACKWARD * self.n_student
        return (FORWARD_BACKWARD - FORWARD) * self.n_student + FORWARD * self.n_trainable

    def train(self, tokens: float) -> float:
        """A training rollout's tokens: generated by the student, scored by the teacher, trained on."""
        return (FORWARD * self.n_student + FORWARD * self.n_teacher + self.forward_backward) * tokens

    def decision(self, kind: DecisionKind, tokens: float) -> float:
        """One decision part: extension tokens are generated by the student; scoring and drift are teacher
        forwards over a probe batch's tokens; the audit is one student forward+backward over them."""
        per_param = {"extension": FORWARD * self.n_student, "scoring": FORWARD * self.n_teacher,
                     "drift": FORWARD * self.n_teacher, "audit": self.forward_backward}
        if kind not in per_param:
            raise BudgetError(f"decision kind must be one of {KINDS}, got {kind!r}")
        return per_param[kind] * tokens

    def probe(self, extension_tokens: float, probe_tokens: float, drift_fraction: float) -> float:
        """One probe through a decision: its extension, the teacher's scoring and the audit of its
        ``probe_tokens`` (prompt + full response), and the drift forward on ``drift_fraction`` of the probes."""
        return (self.decision("extension", extension_tokens) + self.decision("scoring", probe_tokens)
                + self.decision("audit", probe_tokens) + drift_fraction * self.decision("drift", probe_tokens))


@dataclass
class DecisionBudget:
    """See the module docstring. Build one per run; the probe client calls it in step order.

    ``probe_batch`` (P), ``staleness_limit`` (S) and ``offer_cap`` (probes the controller takes per step)
    are the probe settings; ``prior_probe_tokens`` / ``prior_extension_tokens`` estimate a probe's cost
    until the first audited probes measure it (a probe's prompt + full response; the tokens an extension
    adds): pass upper bounds (the longest prompt + ``rollout.max_response_len``; that minus the initial
    window), since an underestimate lets the rounds before the first audit overspend. ``drift``: whether
    drift diagnostics run (they are charged on one batch of P per decision). Not thread-safe: call it from
    the learner's thread (the workers' extension tokens come back there with each round's stats).
    """

    budget: float | None
    flops: FlopsModel
    probe_batch: int
    staleness_limit: int
    offer_cap: int
    prior_probe_tokens: float
    prior_extension_tokens: float
    pool_max: int = 4
    drift: bool = False
    # also hold rounds while the learner's own decision seconds are over the budget's share of its wall (a clock:
    # machine-dependent, so a run is no longer a pure function of its seed; docs/decisions.md, "Decision budget")
    gate_seconds: bool = False
    steps: int = 0
    train_flops: float = 0.0
    train_seconds: float = 0.0
    learner_seconds: float = 0.0  # the learner's own seconds in decision calls (a worker's audit not included)
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))  # FLOPs per kind
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    tokens: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    decisions: int = 0
    probes_audited: int = 0
    probes_released: int = 0  # dropped, expired or consumed unaudited
    in_flight: int = 0  # offered and accepted, not yet audited or released
    rounds: int = 0  # offer rounds opened (one round = the probes of one decision)
    round_size: int = 0
    round_left: int = 0  # probes of the open round still to offer
    sizer: EvidenceSizer | None = None  # the batches a decision needs to resolve (adwin.audit.sizing); None: 1

    def __post_init__(self) -> None:
        if self.budget is not None and not 0.0 < self.budget < 1.0:
            raise BudgetError(f"budget must be in (0, 1) or None (every ready batch audited), got {self.budget}")
        for name in ("probe_batch", "staleness_limit", "offer_cap", "pool_max"):
            if getattr(self, name) < 1:
                raise BudgetError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prior_probe_tokens < 0 or self.prior_extension_tokens < 0:
            raise BudgetError("prior_probe_tokens and prior_extension_tokens must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.budget is not None

    # --- what was spent -----------------------------------------------------------------------------

    def record_train(self, tokens: float, seconds: float = 0.0) -> None:
        """One optimizer step: its training rollouts' prompt + response tokens and the learner's seconds."""
        self.steps += 1
        self.train_flops += self.flops.train(tokens)
        self.train_seconds += seconds

    def record_decision(self, kind: DecisionKind, tokens: float, seconds: float = 0.0, probes: int = 0) -> None:
        """One decision part as it ran. ``probes``: for ``audit``, the probes that audit consumed."""
        cost = self.flops.decision(kind, tokens)  # raises for an unknown kind before anything is counted
        self.spent[kind] += cost
        self.tokens[kind] += tokens
        self.seconds[kind] += seconds
        if kind == "audit":
            self.decisions += 1
            self.probes_audited += probes
            self.in_flight = max(0, self.in_flight - probes)

    def record_seconds(self, kind: DecisionKind, seconds: float) -> None:
        """Measured seconds of a decision part already counted in FLOPs (an audit that came back later)."""
        if kind not in self.seconds:
            raise BudgetError(f"decision kind must be one of {KINDS}, got {kind!r}")
        self.seconds[kind] += seconds

    def record_learner(self, seconds: float) -> None:
        """Seconds the learner's thread spent in a decision call (offers, rounds it waited for, scoring, drift,
        an audit it ran or waited for): what the decisions take off the learner's wall."""
        self.learner_seconds += seconds

    def release(self, probes: int) -> None:
        """Probes that left without an audit (dropped, expired, consumed unaudited): no longer reserved."""
        self.probes_released += probes
        self.in_flight = max(0, self.in_flight - probes)

    # --- the cost model -----------------------------------------------------------------------------

    def _allowed(self, training: float) -> float:
        """What decisions may spend beside ``training`` of the same unit: D / (T + D) <= b  <=>  D <= b / (1 - b) · T."""
        b = self.budget if self.budget is not None else 0.0
        return b / (1.0 - b) * training

    def allowance(self) -> float:
        """Decision FLOPs the budget allows so far (``_allowed`` on the training FLOPs)."""
        return self._allowed(self.train_flops)

    def decision_flops(self) -> float:
        return sum(self.spent.values())

    def pool_limit(self) -> int:
        """This budget's ``pool_limit`` (the module function)."""
        return pool_limit(self.pool_max, self.offer_cap, self.staleness_limit, self.probe_batch)

    def pressure(self) -> float:
        """How many times the budget's rate is exceeded by offering ``offer_cap`` probes every step (the
        rate without a budget), at the current estimates; 0 before the first step. With ``gate_seconds``,
        the larger of that in FLOPs and in the learner's seconds."""
        per_step = self.allowance() / self.steps if self.steps else 0.0
        flops = self.offer_cap * self.probe_cost(1) / per_step if per_step > 0 else 0.0
        return max(flops, self.seconds_pressure())

    def seconds_allowance(self) -> float:
        """The learner's decision seconds the budget allows so far (``_allowed`` on its training seconds)."""
        return self._allowed(self.train_seconds)

    def learner_seconds_per_probe(self) -> float:
        """The learner's decision seconds per probe consumed so far (audited or released); 0 before any."""
        consumed = self.probes_audited + self.probes_released
        return self.learner_seconds / consumed if consumed else 0.0

    def seconds_pressure(self) -> float:
        """``pressure`` in the learner's seconds (0 without ``gate_seconds`` or before a probe was consumed)."""
        per_step = self.seconds_allowance() / self.steps if self.steps else 0.0
        if not self.gate_seconds or per_step <= 0:
            return 0.0
        return self.offer_cap * self.learner_seconds_per_probe() / per_step

    def pool(self) -> int:
        """Batches of P per decision after the first: 1 while the budget does not bind (a budget above what
        the run spends changes nothing), else ``ceil(pressure)`` up to ``pool_limit``: the more the budget
        thins the decisions out, the more evidence each one that is left gets; and at least the batches the
        ``sizer`` says the last audit's noise scale needs (the round then waits longer for its credit)."""
        r = self.pressure()
        need = self.sizer.batches if self.sizer is not None else 1  # a rarer, larger round where B demands it
        return min(self.pool_limit(), max(need, 1 if r <= 1.0 else math.ceil(r)))

    def probe_cost(self, pool: int | None = None) -> float:
        """Estimated FLOPs of one probe through a decision pooling ``pool`` batches (default ``pool()``), from
        what was measured (the priors before that); the drift forward reads one batch of the pool."""
        consumed = self.probes_audited + self.probes_released
        ext = self.tokens["extension"] / consumed if consumed else self.prior_extension_tokens
        full = self.tokens["audit"] / self.probes_audited if self.probes_audited else self.prior_probe_tokens
        k = pool if pool is not None else self.pool()
        return self.flops.probe(ext, full, 1.0 / k if self.drift else 0.0)

    def credit(self) -> float:
        """What the budget still allows, with every probe in flight charged its whole estimated cost (a
        probe's extension already spent is counted twice: the error is on the side of the budget)."""
        return self.allowance() - self.decision_flops() - self.in_flight * self.probe_cost()

    def seconds_credit(self) -> float:
        """``credit`` in the learner's seconds: what the budget still allows of them, every probe in flight
        charged the learner seconds a probe has taken so far; +inf without ``gate_seconds`` or while no training
        seconds were reported (a caller that times nothing is gated by FLOPs alone, not stopped)."""
        if not self.gate_seconds or self.train_seconds <= 0.0:
            return math.inf
        return self.seconds_allowance() - self.learner_seconds - self.in_flight * self.learner_seconds_per_probe()

    def affords(self, probes: int) -> bool:
        """Whether the credit covers a round of ``probes`` more at their estimated cost, in FLOPs and (with
        ``gate_seconds``) in the learner's seconds: a round is paid for before it starts, so the budget is
        not overshot by the round it lets start (only the first round, which never waits, can overshoot)."""
        return (self.credit() >= probes * self.probe_cost()
                and self.seconds_credit() >= probes * self.learner_seconds_per_probe())

    def cadence(self) -> float:
        """Steps between decisions at the current estimates: a round of ``pool() · P`` probes per that many
        steps, at the budget's rate or at ``offer_cap`` per step, whichever is slower; with the budget off,
        the steps per decision so far."""
        if not self.enabled:
            return self.steps / self.decisions if self.decisions else float("nan")
        per_step = self.allowance() / self.steps if self.steps else 0.0
        k = self.pool()
        rate = min(per_step / self.probe_cost(k), float(self.offer_cap)) if per_step > 0 else 0.0  # probes/step
        return k * self.probe_batch / rate if rate > 0 else float("nan")  # nothing trained yet: no rate

    # --- the two questions the probe client asks ----------------------------------------------------

    def allow_offers(self) -> int:
        """Probes to offer this step (call once per step, after ``record_train``; then ``record_offers``).

        Offers come in rounds, one round per decision: the first round (P probes) opens at once, so the
        first decision comes as early as probes can complete; a later round (``pool() · P``) opens when the
        credit, every probe in flight charged, covers the round's own estimated cost (``affords``; with
        ``gate_seconds``, in the learner's seconds too). With the budget off: ``offer_cap``, as without a
        budget.
        """
        if not self.enabled:
            return self.offer_cap
        if self.round_left <= 0:
            size = self.probe_batch * (self.pool() if self.rounds else 1)
            if self.rounds > 0 and not self.affords(size):
                return 0
            self.round_size = self.round_left = size
            self.rounds += 1
        return min(self.round_left, self.offer_cap)

    def record_offers(self, accepted: int) -> None:
        """How many of this step's offers became probes; the rest of the round is offered next step."""
        if accepted < 0:
            raise BudgetError(f"accepted must be >= 0, got {accepted}")
        self.in_flight += accepted
        if self.enabled:
            self.round_left = max(0, self.round_left - accepted)

    def pool_size(self, ready: int, oldest_staleness: int) -> int:
        """Ready probe batches (of P each) to audit now as one pooled audit; 0 = hold them.

        ``oldest_staleness``: of the oldest probe among the held batches, at the current version. Held
        batches are audited together when the open round's batches are in, when nothing more is in
        flight to join them, or when the oldest probe is at the staleness limit (one more step would put it
        past S). The first decision takes the first ready batch. Budget off: one batch at a time.
        """
        if ready <= 0:
            return 0
        if not self.enabled:
            return 1
        k = max(1, self.round_size // self.probe_batch)
        if self.decisions == 0:
            return 1
        if ready >= k:
            return k
        if oldest_staleness >= self.staleness_limit or ready * self.probe_batch >= self.in_flight + self.round_left:
            return ready
        return 0

    def drift_rows(self, rows: int) -> int:
        """Rows of a pooled batch the drift diagnostics read: one batch of P (a sample of the pool)."""
        return rows if not self.enabled else min(rows, self.probe_batch)

    # --- reports and checkpoints --------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """``decision/flops_share`` = D / (T + D) in FLOPs, ``decision/seconds_share`` the same in measured
        seconds (a worker's audit seconds included), ``decision/learner_share`` the learner's own decision
        seconds over those plus its training seconds, ``decision/cadence`` (steps per decision, see ``cadence``), ``decision/pool`` (probes per
        decision after the first), ``decision/pressure`` (see ``pressure``), and each kind's FLOPs share."""
        d, t = self.decision_flops(), self.train_flops
        ds, ls = sum(self.seconds.values()), self.learner_seconds
        out = {
            "decision/flops_share": d / (t + d) if t + d > 0 else 0.0,
            "decision/seconds_share": ds / (self.train_seconds + ds) if self.train_seconds + ds > 0 else 0.0,
            "decision/learner_share": ls / (self.train_seconds + ls) if self.train_seconds + ls > 0 else 0.0,
            "decision/cadence": self.cadence(),
            "decision/pool": float(self.pool() * self.probe_batch if self.enabled else self.probe_batch),
            "decision/pressure": self.pressure(),
            "decision/pressure_seconds": self.seconds_pressure(),
            "decision/decisions": float(self.decisions),
            "decision/in_flight": float(self.in_flight),
        }
        if self.budget is not None:
            out["decision/budget"] = self.budget
        if self.sizer is not None and math.isfinite(self.sizer.samples):  # N* over what one decision may pool
            out |= {"decision/samples_needed": self.sizer.samples,
                    "decision/resolvable": float(self.sizer.batches <= self.pool_limit())}
        out |= {f"decision/flops_share_{k}": v / (t + d) if t + d > 0 else 0.0 for k, v in self.spent.items()}
        return out

    def state_dict(self) -> dict[str, Any]:
        sizer = {"sizer": self.sizer.state_dict()} if self.sizer is not None else {}
        return {"steps": self.steps, "train_flops": self.train_flops, "train_seconds": self.train_seconds,
                "learner_seconds": self.learner_seconds, "spent": dict(self.spent), "seconds": dict(self.seconds),
                "tokens": dict(self.tokens), "decisions": self.decisions, "probes_audited": self.probes_audited,
                "probes_released": self.probes_released, "in_flight": self.in_flight, "rounds": self.rounds,
                "round_size": self.round_size, "round_left": self.round_left} | sizer

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name in ("steps", "decisions", "probes_audited", "probes_released", "in_flight", "rounds",
                     "round_size", "round_left"):
            setattr(self, name, int(state[name]))
        self.train_flops, self.train_seconds = float(state["train_flops"]), float(state["train_seconds"])
        self.learner_seconds = float(state.get("learner_seconds", 0.0))  # absent in checkpoints written before it
        for name in ("spent", "seconds", "tokens"):
            setattr(self, name, {k: float(state[name].get(k, 0.0)) for k in KINDS})
        if self.sizer is not None:  # absent in checkpoints written before it: one batch until the next audit
            self.sizer.load_state_dict(state.get("sizer", {}))


# --- a run's decisions from token counts alone ----------------------------------------------------------


@dataclass(frozen=True)
class RunShape:
    """A run's shape in tokens, for ``simulate``: per step, the training rollouts' prompt + response tokens
    and the unfinished prefixes there are to offer; per probe, its prompt + full response tokens, the
    tokens its extension adds and the steps that takes (at most S: the controller forces completion)."""

    steps: int
    train_tokens: float
    probe_tokens: float
    extension_tokens: float
    extension_steps: int
    available: int


def simulate(budget: DecisionBudget, shape: RunShape) -> dict[str, Any]:
    """Drive ``budget`` through ``shape`` as the probe client would (offer, extend, batch by P in FIFO order,
    pool, audit; unbatchable probes past S expire) and return when it decided and what it spent."""
    p, s = budget.probe_batch, budget.staleness_limit
    span = max(1, min(shape.extension_steps, s))
    extending: list[int] = []  # offer step of each probe still extending
    complete: list[int] = []  # complete, not yet in a batch
    ready: list[list[int]] = []  # batches of P offer steps
    steps_at: list[int] = []
    sizes: list[int] = []
    for t in range(shape.steps):
        budget.record_train(shape.train_tokens)
        accepted = min(budget.allow_offers(), shape.available)
        budget.record_offers(accepted)
        extending += [t] * accepted
        budget.record_decision("extension", len(extending) * shape.extension_tokens / span)
        complete += [o for o in extending if t - o == span - 1]
        extending = [o for o in extending if t - o < span - 1]
        while len(complete) >= p:
            ready.append(complete[:p])
            complete = complete[p:]
        version = t + 1
        if len(complete) < p and complete and version - complete[0] >= s:
            budget.release(len(complete))
            complete = []
        k = budget.pool_size(len(ready), version - ready[0][0] if ready else 0)
        if k:
            n = k * p
            ready = ready[k:]
            budget.record_decision("scoring", n * shape.probe_tokens)
            if budget.drift:
                budget.record_decision("drift", budget.drift_rows(n) * shape.probe_tokens)
            budget.record_decision("audit", n * shape.probe_tokens, probes=n)
            steps_at.append(t)
            sizes.append(n)
    return {"decision_steps": steps_at, "probes_per_decision": sizes,
            "first_decision": steps_at[0] if steps_at else None} | budget.metrics()
