"""Paired statistics of ``adwin bench compare`` per task, and regret across tasks.

Every run of a task evaluates the same held-out problems (mean@k per problem, ``eval_scores``), so
methods are compared problem by problem: a method's accuracy is the mean over problems of its per-problem
score averaged over seeds, with a 95 % percentile-bootstrap CI over problems; its paired difference to
full-rollout OPD is the mean over problems of (its score - full's score), bootstrapped the same way
(resampling problems keeps the pairing).

Sizing the evaluation (docs/benchmarks.md, "The five-task suite (`adwin bench compare --suite`)"): with per-sample
outcomes of variance
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

from adwin.tasks.suite import LINE_MEASURES

Z95 = 1.959963984540054
BOOTSTRAP = 2000  # resamples per interval
ADWIN_KEY, REFERENCE = "adwin-0.7", "full"


def samples_needed(halfwidth: float, outcome_var: float = 0.25) -> int:
    """Evaluation samples per method (problems x k x seeds) for a paired-difference 95 % CI half-width of
    ``halfwidth`` when the two methods' outcomes are independent given the problem (the worst case)."""
    if not 0 < halfwidth < 1:
        raise ValueError(f"halfwidth must be in (0, 1), got {halfwidth}")
    return math.ceil(Z95**2 * 2 * outcome_var / halfwidth**2)


def problem_scores(runs: Sequence[Mapping[str, Any]], method: str, measure: str = "accuracy") -> np.ndarray | None:
    """Per-problem ``measure`` of ``method`` averaged over its seeds, (n_problems,); None without eval scores."""
    rows = [r["eval_scores"][measure] for r in runs
            if r["method"] == method and measure in (r.get("eval_scores") or {})]
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


# what an evaluation scores per problem, in print order; forced_lines: teacher-forced line skill (adwin.tasks.forced)
MEASURES = ("accuracy", *LINE_MEASURES, "forced_lines")


def measures_of(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The measures every run with evaluation scores has, in ``MEASURES`` order."""
    have = [set(r["eval_scores"]) for r in runs if r.get("eval_scores")]
    return [m for m in MEASURES if have and all(m in h for h in have)]


def paired_stats(runs: Sequence[Mapping[str, Any]], order: Sequence[str],
                 measure: str = "accuracy") -> dict[str, dict[str, Any]]:
    """Per method, of ``measure``: ``value`` (mean over problems, CI) and ``diff_to_full`` (paired mean difference to
    full-rollout OPD, CI)."""
    ref = problem_scores(runs, REFERENCE, measure)
    out: dict[str, dict[str, Any]] = {}
    for key in order:
        scores = problem_scores(runs, key, measure)
        if scores is None:
            continue
        entry: dict[str, Any] = {"value": bootstrap_mean_ci(scores)}
        if ref is not None and len(ref) == len(scores):
            entry["diff_to_full"] = bootstrap_mean_ci(scores - ref)
        out[key] = entry
    return out


def regrets(accuracy: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """``accuracy[task][method]`` (each task's measure: accuracy, or a line measure on the long tasks) -> per method its
    regret on each task (the task's best mean minus its own) and its worst-case regret over the tasks it ran on."""
    out: dict[str, dict[str, Any]] = {}
    for task, by_method in accuracy.items():
        best = max(by_method.values())
        for method, acc in by_method.items():
            out.setdefault(method, {"per_task": {}})["per_task"][task] = best - acc
    for entry in out.values():
        entry["worst"] = max(entry["per_task"].values())
    return out
