"""The window rules replayed on a pool of per-sample gradients, scored against a truth read from other samples.

``decisions`` runs ADWIN's policy in each variant (``Rule``) on audits of ``P`` probes drawn from a pool, every rule on
the same draws, beside the *noise-reading rule*: after each audit, the shortest candidate whose pure-noise reading
``sqrt(N_w / N_F)`` over that audit's own samples clears the threshold (from their response lengths when the pool
has them, ``adwin.audit.truth.token_floor``; else from their same-sample energies, ``noise_floor``). It reads no
cross-sample product, so a rule that decides as it does decides on the response lengths. A rule whose audit the
policy judges unresolved (``adwin.policies.resolution``: too little signal z, or too few samples for the noise scale
it measured) follows its fallback (``Rule.unresolved``, ``window.unresolved``) exactly as the product's does, and
``held_out`` reports the share of such audits per rule.

``held_out`` splits the pool (``adwin.audit.truth.split_pool``): the truth (population cosines, the truth's window) is
read from one half, the rules replayed on the other, and every rule is scored (``adwin.bench.audit_scores``) beside
the baselines on the same scale: the noise-reading rule, each constant window (every candidate, the horizon) and the
truth's own schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from adwin.audit import truth as tr
from adwin.bench import audit_scores as sc

NOISE_RULE = "noise reading"
TRUTHS_SCHEDULE = "truth's schedule"
SPLITS = ("half", "cross")  # --split: the truth from one half, the replay from the other; cross also swaps them


@dataclass(frozen=True)
class Rule:
    """One variant of the online rule, as a run's config would set it."""

    name: str
    estimator: str  # audit.estimator
    confidence: bool  # window.confidence
    noise_hold: bool = False  # window.noise_hold
    grow_to: str = "sure"  # window.grow_to
    signal_z: float = 3.0  # window.signal_z
    pool: int = 1  # audit.evidence_audits
    decay: float = 0.7  # audit.evidence_decay
    unresolved: str = "decide"  # window.unresolved: the paper's rule decides whatever the evidence resolves
    resolve_samples: float = 1.0  # window.resolve_samples


SHIPPED = "batch, point, 8 audits pooled (decay 0.9)"  # the rule the short presets ship: the one the goals judge
SHIPPED_LONG = "batch, point, 8 audits pooled (decay 0.9), no fallback"  # the long ones': unresolved audits decide
RULES: tuple[Rule, ...] = (
    Rule("paper (batch, point)", "batch", confidence=False),
    Rule("batch, point, 4 audits pooled", "batch", confidence=False, pool=4),
    Rule(SHIPPED, "batch", confidence=False, pool=8, decay=0.9, unresolved="hold"),
    Rule(SHIPPED_LONG, "batch", confidence=False, pool=8, decay=0.9),
    Rule("batch, point, 8 audits pooled (decay 0.9), unresolved: horizon", "batch", confidence=False, pool=8,
         decay=0.9, unresolved="horizon"),
    Rule("batch, point, 8 audits pooled (decay 0.9), unresolved: noise rule", "batch", confidence=False, pool=8,
         decay=0.9, unresolved="noise_rule"),
    Rule("debiased, point", "debiased", confidence=False),
    Rule("batch, confidence", "batch", confidence=True),
    Rule("debiased, confidence", "debiased", confidence=True),
    Rule("batch, confidence, noise hold", "batch", confidence=True, noise_hold=True),
    Rule("debiased, confidence, noise hold", "debiased", confidence=True, noise_hold=True),
    Rule("debiased, confidence, noise hold, grow to point", "debiased", confidence=True, noise_hold=True,
         grow_to="point"),
    Rule("debiased, confidence, noise hold, 4 audits pooled", "debiased", confidence=True, noise_hold=True, pool=4),
    Rule("batch, confidence, noise hold, 4 audits pooled", "batch", confidence=True, noise_hold=True, pool=4),
    Rule("debiased, confidence, noise hold, 8 audits pooled", "debiased", confidence=True, noise_hold=True, pool=8,
         decay=0.9),
    Rule("debiased, confidence, noise hold (z >= 2), 8 audits pooled", "debiased", confidence=True,
         noise_hold=True, signal_z=2.0, pool=8, decay=0.9),
)


def shipped_rule(task: str) -> str:
    """The rule the presets ship for ``task``'s regime: the pooled point rule with the regime's fallback for unresolved
    audits (``adwin.bench.compare.plan.UNRESOLVED_BY_REGIME``); a task that is not built in gets the default preset's."""
    from adwin.bench.compare.plan import UNRESOLVED_BY_REGIME, regime
    from adwin.tasks.suite import TASK_NAMES, get_task

    if task not in TASK_NAMES:
        return SHIPPED
    return SHIPPED_LONG if UNRESOLVED_BY_REGIME[regime(get_task(task))] == "decide" else SHIPPED


@dataclass
class _Audit:
    cosines: Mapping[int, float]
    cosine_ci: Mapping[int, tuple[float, float]]
    noise_floor: Mapping[int, float]
    signal_z: float
    noise_scale: float | None  # B, what the policy judges resolution on with samples (None: infinite)
    samples: float


def noise_reading(h: np.ndarray, candidates: Sequence[int], idx: np.ndarray,
                  lengths: np.ndarray | None) -> np.ndarray:
    """(K,) the pure-noise reading of the samples ``idx``: token counts when ``lengths`` are known (``h`` unread),
    else their same-sample energies (their own Grams: still no cross-sample product)."""
    if lengths is not None:
        return tr.token_floor(np.asarray(lengths)[idx], candidates)
    return tr.noise_floor(tr.per_sample_grams(h)[idx], len(candidates))


def decisions(h: np.ndarray, candidates: Sequence[int], horizon: int, threshold: float, rules: Sequence[Rule], *,
              p: int, audits: int, runs: int, rng: np.random.Generator, lengths: np.ndarray | None = None,
              initial: int | None = None, cadence: int = 1, max_age: int | None = None,
              level: float = 0.9, marks: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The window after each audit, per rule and for the noise-reading rule (``NOISE_RULE``): ``{name: (runs,
    audits)}``. ``runs`` runs of ``audits`` audits of ``p`` probes drawn from the pool (the weights held fixed, so
    the right window never moves; within a run no sample is drawn twice), the same draws for every rule. ADWIN's
    policy decides on the estimators the product computes (``adwin.audit.evidence``; a pooled rule weights the last
    ``rule.pool`` audits' samples by ``rule.decay ** age``, ``cadence`` steps between audits, none older than
    ``max_age`` steps: the staleness limit the product's pool keeps to). ``lengths``: the samples' response lengths,
    for the noise-reading rule. ``marks``, when given, receives per rule a (runs, audits) bool array: the audits
    the policy judged unresolved (``adwin.policies.resolution``), whose window followed the rule's fallback."""
    from adwin.audit.evidence import evidence_of_gram
    from adwin.policies.adaptive import AdaptiveWindow

    cands, n = [int(c) for c in candidates], h.shape[0]
    if audits * p > n:
        raise ValueError(f"{audits} audits of {p} probes need {audits * p} distinct samples; the pool has {n}")
    if lengths is not None and len(lengths) != n:
        raise ValueError(f"{len(lengths)} response lengths for a pool of {n} samples")
    segs = np.arange(len(cands) + 1)
    out = {name: np.empty((runs, audits), dtype=np.int64) for name in [r.name for r in rules] + [NOISE_RULE]}
    unresolved = {r.name: np.zeros((runs, audits), dtype=bool) for r in rules}
    for run in range(runs):
        order = rng.permutation(n)
        seeds = rng.integers(1 << 30, size=audits)
        for a in range(audits):
            floor = noise_reading(h, cands, order[a * p:(a + 1) * p], lengths)
            out[NOISE_RULE][run, a] = tr.truth_window(dict(zip(cands, floor, strict=True)), cands, horizon, threshold)
        for rule in rules:
            policy = AdaptiveWindow(cands, threshold=threshold, max_len=horizon, initial=initial,
                                    confidence=rule.confidence, noise_hold=rule.noise_hold, grow_to=rule.grow_to,
                                    signal_z=rule.signal_z, unresolved=rule.unresolved,
                                    resolve_samples=rule.resolve_samples)
            for a in range(audits):
                first = max(0, a - rule.pool + 1)
                if max_age is not None:  # the product drops an audit older than the staleness limit from the pool
                    first = max(first, a - max_age // cadence)
                idx = order[first * p:(a + 1) * p]
                ages = cadence * (a - np.arange(first, a + 1))  # (audits pooled,)
                weights = np.repeat(rule.decay ** ages.astype(float), p)  # (m,): decay ** age per sample
                sub = h[np.ix_(idx, segs, idx, segs)]  # (m, K+1, m, K+1)
                sub = sub * weights[:, None, None, None] * weights[None, None, :, None]
                ev = evidence_of_gram(sub, cands, estimator=rule.estimator, level=level if rule.confidence else None,
                                      n_boot=100, seed=int(seeds[a]))
                policy.observe(_Audit(ev.cosines, ev.cosine_ci, ev.noise_floor, ev.signal_z,
                                      ev.measures.get("noise_scale"), float(ev.samples)))
                out[rule.name][run, a] = policy.window(0)
                unresolved[rule.name][run, a] = policy.resolution.resolved is False
    if marks is not None:
        marks.update(unresolved)
    return out


def baselines(candidates: Sequence[int], horizon: int, truth_window: int | None, shape: tuple[int, int]
              ) -> dict[str, np.ndarray]:
    """The constant windows (every candidate and the horizon) and, where there is a truth, its own schedule, as
    (runs, audits) windows beside the replayed rules'."""
    out = {f"constant {w}": np.full(shape, int(w)) for w in [*candidates, horizon]}
    if truth_window is not None:
        out[TRUTHS_SCHEDULE] = np.full(shape, int(truth_window))
    return out


def held_out(h: np.ndarray, candidates: Sequence[int], horizon: int, threshold: float, *, truth_idx: np.ndarray,
             replay_idx: np.ndarray, p_run: Sequence[int], audits: int, runs: int, rng: np.random.Generator,
             lengths: np.ndarray | None = None, rules: Sequence[Rule] = RULES, **replay_kw: Any) -> dict[str, Any]:
    """One fold: the truth from the samples ``truth_idx``, every rule and baseline replayed on ``replay_idx`` at
    each ``p_run``, scored against it; the direction of the truth from the noise-reading window (the truth half's
    own pure-noise reading) and, per rule, its difference from the noise-reading rule."""
    if np.intersect1d(truth_idx, replay_idx).size:
        raise ValueError("the truth and the replay must read disjoint samples")
    cands = [int(c) for c in candidates]
    h_truth, h_replay = tr.sub_pool(h, truth_idx), tr.sub_pool(h, replay_idx)
    z = tr.signal_z(h_truth)
    seen = z >= tr.IDENTIFIABLE_Z
    pop = tr.population_interval(h_truth, cands)
    window = tr.truth_window({c: v[0] for c, v in pop.items()}, cands, horizon, threshold) if seen else None
    sure = tr.truth_window({c: v[1] for c, v in pop.items()}, cands, horizon, threshold) if seen else None
    floor = noise_reading(h, cands, truth_idx, lengths)
    noise_window = tr.truth_window(dict(zip(cands, floor, strict=True)), cands, horizon, threshold)
    truth = sc.Truth(window, {c: v[0] for c, v in pop.items()}, horizon, threshold, cands) if seen else None
    fold: dict[str, Any] = {
        "truth_samples": [int(i) for i in truth_idx], "replay_samples": int(len(replay_idx)), "signal_z": z,
        "population": {str(c): list(v) for c, v in pop.items()}, "truth_window": window,
        "surely_admissible_window": sure, "noise_reading": {str(c): float(v) for c, v in zip(cands, floor, strict=True)},
        "noise_source": "token counts" if lengths is not None else "same-sample energies",
        "noise_window": noise_window, "direction": sc.direction(window, noise_window), "replay": {},
        "versus_noise": {}, "unresolved": {}}
    lens = None if lengths is None else np.asarray(lengths)[replay_idx]
    for p in p_run:
        marks: dict[str, np.ndarray] = {}
        chosen = decisions(h_replay, cands, horizon, threshold, rules, p=int(p), audits=audits, runs=runs, rng=rng,
                           lengths=lens, marks=marks, **replay_kw)
        fold["unresolved"][str(p)] = {name: float(m.mean()) for name, m in marks.items()}  # share of audits
        chosen = {NOISE_RULE: chosen.pop(NOISE_RULE)} | baselines(cands, horizon, window, (runs, audits)) | chosen
        fold["replay"][str(p)] = {name: sc.score(w, truth, horizon) for name, w in chosen.items()}
        if truth is not None:
            fold["versus_noise"][str(p)] = {r.name: sc.difference(chosen[r.name], chosen[NOISE_RULE], truth, horizon)
                                            for r in rules}
    return fold
