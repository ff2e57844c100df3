"""Scores of replayed window decisions against a held-out truth, and the verdicts they support (numpy only).

A replay (``adwin.bench.audit_replay``) yields, per rule, the windows chosen: a (runs, audits) array, every rule on
the same draws. Each is scored against the truth read from the pool's other half (``Truth``):

- *exact*: the chosen window is the truth's;
- *admissible*: the chosen window's held-out population cosine reaches the threshold (the horizon always does);
- *unsafe*: the chosen window is shorter than the truth's;
- *cost*: the chosen window over the horizon;
- *within one rung* (secondary: a constant window next to the truth's scores it at 100 %).

Each share carries a percentile-bootstrap interval over the replayed runs (a run's decisions share its draws, so the
run, not the decision, is the unit); ``difference`` resamples the same runs for two rules, which the replay drew
alike. The interval is over the replay alone: it takes the truth as given.

A checkpoint judges a rule only where the truth's window and the noise-reading window (the shortest whose
pure-noise reading clears the threshold) differ: ``direction`` says which way, ``goals`` applies the criteria.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

METRICS = ("exact", "admissible", "unsafe", "cost")
LONGER, SHORTER, SAME, NO_TRUTH = "truth longer", "truth shorter", "same", "no truth"
MIN_ADMISSIBLE, MAX_UNSAFE = 0.8, 0.1  # the goal's bounds on a judged rule's shares


@dataclass(frozen=True)
class Truth:
    """The truth's window and the population cosines it was read from (one half of the pool)."""

    window: int
    population: Mapping[int, float]  # candidate -> held-out population cosine
    horizon: int
    threshold: float
    candidates: Sequence[int]

    def admissible(self, w: np.ndarray) -> np.ndarray:
        """(..., ) bool: the window's population cosine reaches the threshold; the horizon always does, and a
        window the truth did not measure never does."""
        cos = {int(c): float(v) for c, v in self.population.items()}
        ok = np.vectorize(lambda x: int(x) >= self.horizon or cos.get(int(x), float("-inf")) >= self.threshold,
                          otypes=[bool])
        return ok(w)


def _rung(w: np.ndarray, candidates: Sequence[int], horizon: int) -> np.ndarray:
    ladder = np.asarray(sorted(int(c) for c in candidates) + [int(horizon)])
    return np.minimum(np.searchsorted(ladder, w, side="left"), len(ladder) - 1)


def per_run(windows: np.ndarray, truth: Truth | None, horizon: int) -> dict[str, np.ndarray]:
    """Each metric's share within each run: (runs,) per metric (the truth's metrics absent without a truth)."""
    w = np.asarray(windows)  # (runs, audits)
    out = {"cost": (w / float(horizon)).mean(axis=1)}
    if truth is not None:
        out["exact"] = (w == truth.window).mean(axis=1)
        out["admissible"] = truth.admissible(w).mean(axis=1)
        out["unsafe"] = (w < truth.window).mean(axis=1)
        near = np.abs(_rung(w, truth.candidates, horizon) - _rung(np.asarray(truth.window), truth.candidates, horizon))
        out["within_one_rung"] = (near <= 1).mean(axis=1)
    return out


def _interval(x: np.ndarray, idx: np.ndarray, level: float) -> list[float]:
    means = x[idx].mean(axis=1)  # (n_boot,)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


def _resamples(runs: int, n_boot: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, runs, size=(n_boot, runs))  # (n_boot, runs)


def score(windows: np.ndarray, truth: Truth | None, horizon: int, *, level: float = 0.9, n_boot: int = 1000,
          seed: int = 0) -> dict[str, Any]:
    """Shares of one rule's (runs, audits) windows: ``{metric: {"share", "ci"}}`` (None for the truth's metrics
    without a truth), the windows chosen (share of decisions) and the number of decisions."""
    w = np.asarray(windows)
    runs = per_run(w, truth, horizon)
    idx = _resamples(w.shape[0], n_boot, seed)
    out: dict[str, Any] = {m: None for m in (*METRICS, "within_one_rung")}
    for m, x in runs.items():
        out[m] = {"share": float(x.mean()), "ci": _interval(x, idx, level)}
    values, counts = np.unique(w, return_counts=True)
    out["windows"] = {str(int(v)): float(c) / w.size for v, c in zip(values, counts, strict=True)}
    out["decisions"] = int(w.size)
    return out


def difference(a: np.ndarray, b: np.ndarray, truth: Truth, horizon: int, *, level: float = 0.9, n_boot: int = 1000,
               seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per metric, rule ``a``'s share less rule ``b``'s with the interval of the paired bootstrap over runs (the
    replay drew the same audits for both, run by run)."""
    ra, rb = per_run(a, truth, horizon), per_run(b, truth, horizon)
    idx = _resamples(np.asarray(a).shape[0], n_boot, seed)
    return {m: {"diff": float((ra[m] - rb[m]).mean()), "ci": _interval(ra[m] - rb[m], idx, level)} for m in METRICS}


def direction(truth_window: int | None, noise_window: int) -> str:
    """Where the truth's window lies from the noise-reading window: the two cases a rule is judged on, or neither."""
    if truth_window is None:
        return NO_TRUTH
    if truth_window == noise_window:
        return SAME
    return LONGER if truth_window > noise_window else SHORTER


def judge(case: str, rule: Mapping[str, Any], versus_noise: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether ``rule``'s scores meet the goal of ``case`` (``LONGER`` or ``SHORTER``), and the figures it rests on.

    Truth longer: admissible on >= 80 % of decisions, unsafe on <= 10 %, and an admissible share above the noise
    rule's by more than the interval. Truth shorter: on the truth's window more often than the noise rule, by more
    than the interval, at a lower cost (the cost difference's interval below 0), admissible on >= 80 %."""
    adm, unsafe = rule["admissible"]["share"], rule["unsafe"]["share"]
    if case == LONGER:
        d = versus_noise["admissible"]
        ok = adm >= MIN_ADMISSIBLE and unsafe <= MAX_UNSAFE and d["ci"][0] > 0
        return ok, (f"admissible {_pct(adm)}, unsafe {_pct(unsafe)}, admissible vs noise rule "
                    f"{_pts(d['diff'])} [{_pts(d['ci'][0])}, {_pts(d['ci'][1])}]")
    if case == SHORTER:
        d, c = versus_noise["exact"], versus_noise["cost"]
        ok = d["ci"][0] > 0 and c["ci"][1] < 0 and adm >= MIN_ADMISSIBLE
        return ok, (f"exact vs noise rule {_pts(d['diff'])} [{_pts(d['ci'][0])}, {_pts(d['ci'][1])}], cost vs noise "
                    f"rule {c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}], admissible {_pct(adm)}")
    raise ValueError(f"a goal judges {LONGER!r} or {SHORTER!r} checkpoints, not {case!r}")


def goals(cases: Sequence[Mapping[str, Any]], rule: str) -> list[dict[str, Any]]:
    """Per probe batch P and direction, whether ``rule`` meets its goal at every judged checkpoint: ``met``, ``not
    met`` or ``no checkpoint to judge``, with each checkpoint's figures. ``cases``: one per checkpoint fold,
    ``{"where", "direction", "replay": {P: {rule: score}}, "versus_noise": {P: {rule: difference}}}``."""
    out = []
    sizes = sorted({p for c in cases for p in c["replay"]}, key=int)
    for p in sizes:
        for case in (LONGER, SHORTER):
            judged = [c for c in cases if c["direction"] == case and rule in c["replay"].get(p, {})]
            rows = [(c["where"], *judge(case, c["replay"][p][rule], c["versus_noise"][p][rule])) for c in judged]
            status = "no checkpoint to judge" if not rows else ("met" if all(ok for _, ok, _ in rows) else "not met")
            out.append({"rule": rule, "P": int(p), "case": case, "status": status,
                        "checkpoints": [{"where": w, "met": ok, "figures": f} for w, ok, f in rows]})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _pts(x: float) -> str:
    return f"{100 * x:+.0f}"
