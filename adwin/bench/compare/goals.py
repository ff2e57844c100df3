"""The suite's goals, each met or not from the numbers (docs/benchmarks.md, "The five-task suite").

1. **Decisions**: no run spends more than ``SHARE_MAX`` of its end-to-end wall on learner-side decisions.
2. **Short tasks**: on each, ADWIN is not resolved below full-rollout OPD on its measure, at <= ``SHORT_WALL_MAX`` of
   full's end-to-end wall.
3. **``chain-long``: a cost that follows the truth.** ADWIN is not resolved below full on ``lines_right`` nor on
   accuracy, and its FLOPs are at most those of training at the truth's window plus ``LONG_FLOPS_SLACK`` x full's
   (the decision budget). The truth's window comes from ``adwin bench audit-truth`` checkpoints (``--truth``): each
   holds from its step to the next, and a step's cost is that of the fixed-window run at the window (full's at the
   horizon), so a truth that moves mid-run is charged piecewise. Without checkpoints the goal is not evaluated.
4. **Worst-case regret**: ADWIN's is the lowest of all methods run on every task, or within the 95 % CI of the
   lowest: above it by no more than the largest paired half-width of the task where ADWIN's regret is worst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from adwin.bench.compare.tasks import ADWIN_KEY, REFERENCE

SHARE_MAX = 0.10  # learner-side decision seconds / end-to-end wall, every run
SHORT_WALL_MAX = 0.4  # ADWIN's end-to-end wall over full's, on each short task
LONG_TASK = "chain-long"
LONG_FLOPS_SLACK = 0.1  # x full's FLOPs: the decision budget's share


def truth_segments(checkpoints: Sequence[tuple[int, int]], steps: int) -> list[tuple[int, float]]:
    """``(window, share of the run's steps)`` from audit-truth ``(step, truth window)`` checkpoints: each window holds
    from its step to the next checkpoint's (the first from step 0), cut at ``steps``."""
    points = sorted((int(s), int(w)) for s, w in checkpoints if int(s) < steps)
    if not points or steps < 1:
        return []
    points[0] = (0, points[0][1])
    bounds = [s for s, _ in points[1:]] + [steps]
    return [(w, (end - start) / steps) for (start, w), end in zip(points, bounds, strict=True)]


def truth_flops(methods: Mapping[str, Any], segments: Sequence[tuple[int, float]], horizon: int) -> float | None:
    """FLOPs of training at the truth's windows: each segment's share of the fixed-window run's FLOPs (full's at the
    horizon); None when a segment's window has no run."""
    total = 0.0
    for window, share in segments:
        key = REFERENCE if window >= horizon else f"fixed-{window}"
        if key not in methods:
            return None
        total += share * methods[key]["metrics"]["flops"]["mean"]
    return total


def _not_below(entry: Mapping[str, Any], measure: str) -> tuple[bool, dict | None]:
    diff = entry.get("paired", {}).get(measure, {}).get("diff_to_full")
    return bool(diff is not None and diff["hi"] >= 0.0), diff


def short_goal(per_task: Mapping[str, Mapping[str, Any]], short: Sequence[str],
               measures: Mapping[str, str]) -> dict[str, Any]:
    rows = {}
    for task in short:
        m = per_task[task]["methods"]
        if ADWIN_KEY not in m or REFERENCE not in m:
            rows[task] = {"evaluated": False, "met": False}
            continue
        ok, diff = _not_below(m[ADWIN_KEY], measures.get(task, "accuracy"))
        wall = m[ADWIN_KEY]["ratio_to_full"]["train_wall_s"]
        wall_ok = bool(math.isfinite(wall) and wall <= SHORT_WALL_MAX)
        rows[task] = {"evaluated": True, "diff_to_full": diff, "not_resolved_below": ok, "wall_ratio": wall,
                      "wall_ok": wall_ok, "met": ok and wall_ok}
    return {"tasks": rows, "evaluated": bool(rows), "met": bool(rows) and all(r["met"] for r in rows.values())}


def long_goal(methods: Mapping[str, Any] | None, measure: str, truth: Sequence[tuple[int, int]] | None,
              steps: int, horizon: int) -> dict[str, Any]:
    if methods is None or ADWIN_KEY not in methods or REFERENCE not in methods:
        return {"evaluated": False, "why": f"needs {ADWIN_KEY!r} and {REFERENCE!r} on {LONG_TASK}", "met": False}
    a = methods[ADWIN_KEY]
    below = {m: _not_below(a, m) for m in dict.fromkeys((measure, "accuracy"))}
    not_below = all(ok for ok, _ in below.values())
    flops, full = a["metrics"]["flops"]["mean"], methods[REFERENCE]["metrics"]["flops"]["mean"]
    out: dict[str, Any] = {"evaluated": True, "measure": measure, "not_resolved_below": not_below,
                           "diff_to_full": {m: d for m, (_, d) in below.items()}, "flops_ratio": flops / full}
    segments = truth_segments(truth or [], steps)
    bound = truth_flops(methods, segments, horizon) if segments else None
    if bound is None:
        why = ("no audit-truth checkpoints (--truth)" if not segments
               else "a truth window without its fixed-window run")
        return out | {"cost_evaluated": False, "why": why, "met": False}
    limit = bound + LONG_FLOPS_SLACK * full
    cost_ok = bool(flops <= limit)
    return out | {"cost_evaluated": True, "truth": segments, "truth_flops_ratio": bound / full,
                  "limit_ratio": limit / full, "cost_ok": cost_ok, "met": not_below and cost_ok}


def regret_goal(regret: Mapping[str, Mapping[str, Any]], tasks: Sequence[str],
                halfwidths: Mapping[str, float]) -> dict[str, Any]:
    if ADWIN_KEY not in regret:
        return {"evaluated": False, "why": f"needs {ADWIN_KEY!r}", "met": False}
    everywhere = {k: v["worst"] for k, v in regret.items() if set(v["per_task"]) == set(tasks)}
    mine = regret[ADWIN_KEY]["worst"]
    best = min(everywhere, key=everywhere.get)
    worst_task = max(regret[ADWIN_KEY]["per_task"], key=regret[ADWIN_KEY]["per_task"].get)
    slack = halfwidths.get(worst_task, math.nan)
    lowest = mine <= everywhere[best]
    within = bool(math.isfinite(slack) and mine - everywhere[best] <= slack + 1e-12)  # measures are means: rounding
    return {"evaluated": True, "adwin_worst_regret": mine, "lowest_method": best, "lowest": everywhere[best],
            "worst_task": worst_task, "halfwidth": slack, "rivals": everywhere, "met": lowest or within}


def suite_goals(per_task: Mapping[str, Mapping[str, Any]], regret: Mapping[str, Mapping[str, Any]],
                share_max: float, measures: Mapping[str, str], halfwidths: Mapping[str, float], *,
                short: Sequence[str], truth: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> dict[str, Any]:
    """The four goals (module docstring). ``per_task``: each task's ``adwin.bench.compare.report.finish`` results;
    ``short``: the short-regime tasks; ``truth``: per task its audit-truth ``(step, window)`` checkpoints."""
    share = {"max_share": share_max, "limit": SHARE_MAX,
             "met": bool(math.isfinite(share_max) and share_max <= SHARE_MAX)}
    long = per_task.get(LONG_TASK)
    meta = long["meta"] if long else {}
    lg = long_goal(long["methods"] if long else None, measures.get(LONG_TASK, "accuracy"),
                   (truth or {}).get(LONG_TASK), int(meta.get("steps", 0)), int(meta.get("horizon", 0)))
    goals = {"decision_share": share, "short_tasks": short_goal(per_task, [t for t in short if t in per_task], measures),
             "chain_long": lg, "regret": regret_goal(regret, list(per_task), halfwidths)}
    return goals | {"met": all(g["met"] for g in goals.values())}


def goal_lines(goals: Mapping[str, Any]) -> list[str]:
    """One line per goal, each ending MET or NOT MET, every number from ``goals``."""
    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    def ci(d: Mapping[str, float] | None) -> str:
        return "no paired CI" if d is None else f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"

    s, st, lg, r = goals["decision_share"], goals["short_tasks"], goals["chain_long"], goals["regret"]
    lines = [f"decision share: max over runs {s['max_share']:.3f} of the e2e wall (learner-side), limit "
             f"{s['limit']:.2f} → {verdict(s['met'])}"]
    parts = [f"{t} {ci(v['diff_to_full'])} at {v['wall_ratio']:.2f}×" if v["evaluated"] else f"{t} not evaluated"
             for t, v in st["tasks"].items()]
    lines.append(f"short tasks: {ADWIN_KEY} − full, e2e wall (not resolved below, ≤ {SHORT_WALL_MAX}×): "
                 f"{'; '.join(parts) or 'none ran'} → {verdict(st['met'])}")
    if not lg.get("evaluated"):
        lines.append(f"{LONG_TASK}: not evaluated ({lg['why']}) → NOT MET")
    else:
        diffs = ", ".join(f"{m} {ci(d)}" for m, d in lg["diff_to_full"].items())
        cost = (f"FLOPs {lg['flops_ratio']:.2f}× full ≤ the truth's windows {lg['truth_flops_ratio']:.2f}× + "
                f"{LONG_FLOPS_SLACK}: {'yes' if lg['cost_ok'] else 'no'}" if lg["cost_evaluated"]
                else f"FLOPs {lg['flops_ratio']:.2f}× full, cost bound not evaluated ({lg['why']})")
        lines.append(f"{LONG_TASK}: {ADWIN_KEY} − full: {diffs} "
                     f"({'not resolved below' if lg['not_resolved_below'] else 'resolved below'}); {cost} "
                     f"→ {verdict(lg['met'])}")
    if r.get("evaluated"):
        rivals = ", ".join(f"{k} {v:.3f}" for k, v in r["rivals"].items() if k != ADWIN_KEY)
        lines.append(f"worst-case regret: {ADWIN_KEY} {r['adwin_worst_regret']:.3f}, lowest {r['lowest_method']} "
                     f"{r['lowest']:.3f} (+ half-width {r['halfwidth']:.3f} on {r['worst_task']}); {rivals} "
                     f"→ {verdict(r['met'])}")
    else:
        lines.append(f"worst-case regret: not evaluated ({r['why']}) → NOT MET")
    return lines
