"""Paired statistics of ``adwin bench compare`` per task, and regret across tasks.

Every run of a task evaluates the same held-out problems (mean@k per problem, ``eval_scores``), so
methods are compared problem by problem: a method's accuracy is the mean over problems of its per-problem
score averaged over seeds, with a 95 % percentile-bootstrap CI over problems; its paired difference to
full-rollout OPD is the mean over problems of (its score - full's score), bootstrapped the same way
(resampling problems keeps the pairing).

Sizing the evaluation (docs/benchmarks.md, "The three-task suite"): with per-sample outcomes of variance
at most 1/4 and two methods sampled independently on each problem, the paired difference of one problem
averaged over ``k`` samples and ``S`` seeds has variance at most ``2 / (4 k S)``; problem-level variance
cancels in the pairing. The CI half-width 1.96 * sqrt(1 / (2 k S n)) is <= h when
``n k S >= 1.96^2 / (2 h^2)``: 2,135 samples per method for h = 0.03 (:func:`samples_needed`). The
default suite's 1,024 problems x k = 1 x 2 seeds = 2,048 come close to that worst case; the measured
half-width is reported next to every difference, since correlated methods do better and a bound is not a
measurement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Z95 = 1.959963984540054
BOOTSTRAP = 2000  # resamples per interval
ADWIN_KEY, REFERENCE = "adwin-0.7", "full"


def samples_needed(halfwidth: float, outcome_var: float = 0.25) -> int:
    """Evaluation samples per method (problems x k x seeds) for a paired-difference 95 % CI half-width of
    ``halfwidth`` when the two methods' outcomes are independent given the problem (the worst case)."""
    if not 0 < halfwidth < 1:
        raise ValueError(f"halfwidth must be in (0, 1), got {halfwidth}")
    return math.ceil(Z95**2 * 2 * outcome_var / halfwidth**2)


def problem_scores(runs: Sequence[Mapping[str, Any]], method: str) -> np.ndarray | None:
    """Per-problem score of ``method`` averaged over its seeds, (n_problems,); None without eval scores."""
    rows = [r["eval_scores"] for r in runs if r["method"] == method and r.get("eval_scores")]
    if not rows:
        return None
    if len({len(s) for s in rows}) != 1:
        raise ValueError(f"{method}: runs evaluated different numbers of problems; paired statistics need the same")
    return np.asarray(rows, dtype=float).mean(0)


def bootstrap_mean_ci(values: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Mean and 95 % percentile-bootstrap CI over the entries of ``values`` (n,)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))  # (R, n)
    means = values[idx].mean(1)  # (R,)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(values.mean()), "lo": float(lo), "hi": float(hi), "halfwidth": float(hi - lo) / 2,
            "n": int(len(values))}


def paired_stats(runs: Sequence[Mapping[str, Any]], order: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method: ``accuracy`` (mean, CI) and ``diff_to_full`` (paired mean difference, CI)."""
    ref = problem_scores(runs, REFERENCE)
    out: dict[str, dict[str, Any]] = {}
    for key in order:
        scores = problem_scores(runs, key)
        if scores is None:
            continue
        entry: dict[str, Any] = {"accuracy": bootstrap_mean_ci(scores)}
        if ref is not None and len(ref) == len(scores):
            entry["diff_to_full"] = bootstrap_mean_ci(scores - ref)
        out[key] = entry
    return out


def regrets(accuracy: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """``accuracy[task][method]`` -> per method its regret on each task (the task's best mean accuracy
    minus its own) and its worst-case regret over the tasks it ran on."""
    out: dict[str, dict[str, Any]] = {}
    for task, by_method in accuracy.items():
        best = max(by_method.values())
        for method, acc in by_method.items():
            out.setdefault(method, {"per_task": {}})["per_task"][task] = best - acc
    for entry in out.values():
        entry["worst"] = max(entry["per_task"].values())
    return out


def suite_goal(regret: Mapping[str, Mapping[str, Any]], token_ratio: Mapping[str, float]) -> dict[str, Any]:
    """Issue 15's goal as measured: ADWIN-0.7's worst-case regret below every fixed window's and the linear
    schedule's, at <= 0.5x full-rollout OPD's rollout tokens (probes included) averaged over tasks."""
    if ADWIN_KEY not in regret:
        return {"evaluated": False, "why": f"needs {ADWIN_KEY!r}"}
    rivals = {k: v["worst"] for k, v in regret.items() if k.startswith("fixed-") or k == "linear"}
    mine = regret[ADWIN_KEY]["worst"]
    ratio = token_ratio.get(ADWIN_KEY, math.nan)
    beats = all(mine < w for w in rivals.values())
    return {"evaluated": True, "adwin_worst_regret": mine, "rival_worst_regret": rivals,
            "beats_every_fixed_and_linear": bool(beats and rivals), "adwin_token_ratio": ratio,
            "tokens_at_most_half": bool(math.isfinite(ratio) and ratio <= 0.5),
            "met": bool(beats and rivals and math.isfinite(ratio) and ratio <= 0.5)}
