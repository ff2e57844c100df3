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


# the suite's goals (docs/benchmarks.md, "The five-task suite")
SHARE_MAX = 0.10  # learner-side decision seconds / end-to-end wall, every run
LONG_TASK, LONG_WALL_MAX, LONG_FLOPS_MAX = "chain-long", 0.4, 0.4  # ADWIN vs full on the long repeated skill
REGRET_WALL_MAX = 0.6  # ADWIN's end-to-end wall over full's, averaged over tasks


def suite_goals(regret: Mapping[str, Mapping[str, Any]], tasks: Sequence[str], wall_ratio: Mapping[str, float],
                share_max: float, long_task: Mapping[str, Any] | None, long_measure: str = "accuracy",
                measures: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The suite's three goals, each met or not from the numbers.

    ``regret``: :func:`regrets` over the cross-task names (``fixed-rung<k>`` and fixed windows by value);
    ``wall_ratio``: per name, end-to-end wall over full's averaged over tasks; ``share_max``: the largest
    learner-side decision share of any run; ``long_task``: the per-method results of ``LONG_TASK``
    (``adwin.bench.compare.report.finish``'s ``methods``), None when it did not run; ``long_measure``: what its goal
    reads (``adwin.bench.compare.plan.suite_measure``); ``measures``: per task the measure its regret is of (None: accuracy
    everywhere)."""
    share = {"max_share": share_max, "limit": SHARE_MAX,
             "met": bool(math.isfinite(share_max) and share_max <= SHARE_MAX)}
    if long_task is None or ADWIN_KEY not in long_task or REFERENCE not in long_task:
        long = {"evaluated": False, "why": f"needs {ADWIN_KEY!r} and {REFERENCE!r} on {LONG_TASK}", "met": False}
    else:
        a = long_task[ADWIN_KEY]
        diff = a.get("paired", {}).get(long_measure, {}).get("diff_to_full")
        wall, flops = a["ratio_to_full"]["train_wall_s"], a["ratio_to_full"]["flops"]
        not_below = bool(diff is not None and diff["hi"] >= 0.0)
        wall_ok = bool(math.isfinite(wall) and wall <= LONG_WALL_MAX)
        flops_ok = bool(math.isfinite(flops) and flops <= LONG_FLOPS_MAX)
        long = {"evaluated": True, "measure": long_measure, "diff_to_full": diff, "not_resolved_below": not_below,
                "wall_ratio": wall,
                "flops_ratio": flops, "wall_ok": wall_ok, "flops_ok": flops_ok,
                "met": not_below and wall_ok and flops_ok}
    if ADWIN_KEY not in regret:
        reg: dict[str, Any] = {"evaluated": False, "why": f"needs {ADWIN_KEY!r}", "met": False}
    else:
        everywhere = [k for k, v in regret.items() if set(v["per_task"]) == set(tasks)]
        rivals = {k: regret[k]["worst"] for k in everywhere if k.startswith("fixed-") or k == "linear"}
        mine, ratio = regret[ADWIN_KEY]["worst"], wall_ratio.get(ADWIN_KEY, math.nan)
        lowest = bool(rivals) and all(mine < w for w in rivals.values())
        wall_ok = bool(math.isfinite(ratio) and ratio <= REGRET_WALL_MAX)
        reg = {"evaluated": True, "measures": dict(measures or {}), "adwin_worst_regret": mine, "rival_worst_regret": rivals, "lowest": lowest,
               "wall_ratio_mean": ratio, "wall_ok": wall_ok, "met": lowest and wall_ok}
    return {"decision_share": share, "chain_long": long, "regret": reg,
            "met": share["met"] and long["met"] and reg["met"]}


def goal_lines(goals: Mapping[str, Any]) -> list[str]:
    """One line per goal, each ending MET or NOT MET, every number from ``goals``."""
    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    s, lg, r = goals["decision_share"], goals["chain_long"], goals["regret"]
    lines = [f"decision share: max over runs {s['max_share']:.3f} of the e2e wall (learner-side), limit "
             f"{s['limit']:.2f} → {verdict(s['met'])}"]
    if lg.get("evaluated"):
        d = lg["diff_to_full"]
        ci = "no paired CI" if d is None else f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"
        lines.append(f"{LONG_TASK}: {ADWIN_KEY} − full on {lg.get('measure', 'accuracy')} {ci} "
                     f"({'not resolved below' if lg['not_resolved_below'] else 'resolved below'}), "
                     f"e2e wall {lg['wall_ratio']:.2f}× (≤ {LONG_WALL_MAX}), FLOPs {lg['flops_ratio']:.2f}× "
                     f"(≤ {LONG_FLOPS_MAX}) → {verdict(lg['met'])}")
    else:
        lines.append(f"{LONG_TASK}: not evaluated ({lg['why']}) → NOT MET")
    if r.get("evaluated"):
        rivals = ", ".join(f"{k} {v:.3f}" for k, v in r["rival_worst_regret"].items())
        other = ", ".join(f"{t} {m}" for t, m in r.get("measures", {}).items() if m != "accuracy")
        lines.append(f"worst-case regret (of accuracy{'; ' + other if other else ''}): {ADWIN_KEY} "
                     f"{r['adwin_worst_regret']:.3f} vs {rivals}; e2e wall "
                     f"{r['wall_ratio_mean']:.2f}× full averaged over tasks (≤ {REGRET_WALL_MAX}) → {verdict(r['met'])}")
    else:
        lines.append(f"worst-case regret: not evaluated ({r['why']}) → NOT MET")
    return lines
