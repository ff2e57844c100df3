"""The suite's goals, each met or not from the numbers, each with its power: the smallest difference it could
resolve (``adwin.bench.compare.power``), printed beside its verdict (docs/benchmarks.md, "The five-task suite").

1. **Decisions**: no run spends more than ``SHARE_MAX`` of its end-to-end wall on learner-side decisions. Power: the
   interval of the runs' mean share.
2. **Short tasks**: on each, ADWIN is not resolved below full-rollout OPD on its measure, at <= ``SHORT_WALL_MAX`` of
   full's end-to-end wall. Power: the paired interval of the measure, and the interval of the wall ratio over seeds.
3. **``chain-long``: quality, and a cost that follows the truth from both sides.**
   * Quality: ADWIN is not resolved below full on any of ``LONG_MEASURES``: teacher-forced line skill
     (``forced_lines``, every chain line predicted with the reference above it), which resolves what a prefix window
     fails to teach, and final-answer accuracy. Not ``lines_right``: it read 0.000-0.003 for every method on this
     task, so it could resolve nothing. Power: each measure's paired interval.
   * Cost above: ADWIN's FLOPs are at most those of training at the truth's window plus ``LONG_FLOPS_SLACK`` x
     full's (the decision budget). Power: the interval of the FLOPs ratio over seeds.
   * Cost below: at most ``BELOW_SHARE_MAX`` of ADWIN's steps (over all its seeds) trained at a window below the
     truth's at that step: a run that saves its FLOPs by training too short a window fails here, where the FLOPs
     bound alone would pass it. Power: the binomial interval at the bound over those steps (optimistic: the steps
     of one run are not independent).
   The truth's window comes from ``adwin bench audit-truth`` checkpoints (``--truth``): each holds from its step to
   the next (the first from step 0), and a step's cost is that of the fixed-window run at the window (full's at the
   horizon), so a truth that moves mid-run is charged piecewise. Without checkpoints the cost is not evaluated.
4. **Worst-case regret**: ADWIN's is the lowest of all methods run on every task, or within the 95 % CI of the
   lowest: above it by no more than the largest paired half-width of the task where ADWIN's regret is worst. Power:
   that half-width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from adwin.bench.compare import power
from adwin.bench.compare.tasks import ADWIN_KEY, REFERENCE

SHARE_MAX = 0.10  # learner-side decision seconds / end-to-end wall, every run
SHORT_WALL_MAX = 0.4  # ADWIN's end-to-end wall over full's, on each short task
LONG_TASK = "chain-long"
LONG_MEASURES = ("forced_lines", "accuracy")  # the long goal's quality: each not resolved below full
LONG_FLOPS_SLACK = 0.1  # x full's FLOPs: the decision budget's share
# ADWIN's steps trained below the truth's window / its steps: the share of unsafe decisions the audit-truth
# validation allows (docs/decisions.md, "Goals that can fail")
BELOW_SHARE_MAX = 0.10


def truth_segments(checkpoints: Sequence[tuple[int, int]], steps: int) -> list[tuple[int, float]]:
    """``(window, share of the run's steps)`` from audit-truth ``(step, truth window)`` checkpoints: each window holds
    from its step to the next checkpoint's (the first from step 0), cut at ``steps``."""
    points = sorted((int(s), int(w)) for s, w in checkpoints if int(s) < steps)
    if not points or steps < 1:
        return []
    points[0] = (0, points[0][1])
    bounds = [s for s, _ in points[1:]] + [steps]
    return [(w, (end - start) / steps) for (start, w), end in zip(points, bounds, strict=True)]


def truth_windows(checkpoints: Sequence[tuple[int, int]], steps: int) -> list[int]:
    """The truth's window at each of ``steps`` steps (empty without checkpoints), as ``truth_segments`` holds them."""
    out: list[int] = []
    for window, share in truth_segments(checkpoints, steps):
        out += [window] * round(share * steps)
    return out


def below_truth(runs: Sequence[Mapping[str, Any]], checkpoints: Sequence[tuple[int, int]], steps: int,
                horizon: int) -> dict[str, Any]:
    """ADWIN's steps trained below the truth's window, over all its runs (each run's ``windows``: the window each step
    trained under). A truth at or past the horizon is the horizon."""
    truth = [min(w, horizon) for w in truth_windows(checkpoints, steps)]
    pairs = [(int(w), truth[i]) for r in runs if r.get("method") == ADWIN_KEY
             for i, w in enumerate((r.get("windows") or [])[: len(truth)])]
    below = sum(1 for w, t in pairs if w < t)
    share = below / len(pairs) if pairs else math.nan
    return {"steps": len(pairs), "below": below, "share": share, "limit": BELOW_SHARE_MAX,
            "ok": bool(pairs) and share <= BELOW_SHARE_MAX, "power": power.of_share(BELOW_SHARE_MAX, len(pairs))}


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
        wall_power = power.of_ratio(m[ADWIN_KEY]["metrics"].get("train_wall_s", {}),
                                    m[REFERENCE]["metrics"].get("train_wall_s", {}))
        rows[task] = {"evaluated": True, "diff_to_full": diff, "not_resolved_below": ok, "wall_ratio": wall,
                      "wall_ok": wall_ok, "met": ok and wall_ok,
                      "power": {"quality": power.paired(diff), "wall_ratio": wall_power}}
    return {"tasks": rows, "evaluated": bool(rows), "met": bool(rows) and all(r["met"] for r in rows.values())}


def long_goal(methods: Mapping[str, Any] | None, runs: Sequence[Mapping[str, Any]],
              truth: Sequence[tuple[int, int]] | None, steps: int, horizon: int) -> dict[str, Any]:
    if methods is None or ADWIN_KEY not in methods or REFERENCE not in methods:
        return {"evaluated": False, "why": f"needs {ADWIN_KEY!r} and {REFERENCE!r} on {LONG_TASK}", "met": False}
    a = methods[ADWIN_KEY]
    below = {m: _not_below(a, m) for m in LONG_MEASURES}
    not_below = all(ok for ok, _ in below.values())
    flops, full = a["metrics"]["flops"]["mean"], methods[REFERENCE]["metrics"]["flops"]["mean"]
    out: dict[str, Any] = {"evaluated": True, "measures": list(LONG_MEASURES), "not_resolved_below": not_below,
                           "diff_to_full": {m: d for m, (_, d) in below.items()}, "flops_ratio": flops / full,
                           "power": {m: power.paired(d) for m, (_, d) in below.items()}
                           | {"flops_ratio": power.of_ratio(a["metrics"]["flops"],
                                                            methods[REFERENCE]["metrics"]["flops"])}}
    segments = truth_segments(truth or [], steps)
    bound = truth_flops(methods, segments, horizon) if segments else None
    if bound is None:
        why = ("no audit-truth checkpoints (--truth)" if not segments
               else "a truth window without its fixed-window run")
        return out | {"cost_evaluated": False, "why": why, "met": False}
    limit = bound + LONG_FLOPS_SLACK * full
    flops_ok = bool(flops <= limit)
    under = below_truth(runs, truth or [], steps, horizon)
    out["power"]["below_share"] = under.pop("power")
    cost_ok = flops_ok and under["ok"]
    return out | {"cost_evaluated": True, "truth": segments, "truth_flops_ratio": bound / full,
                  "limit_ratio": limit / full, "flops_ok": flops_ok, "below_truth": under, "cost_ok": cost_ok,
                  "met": not_below and cost_ok}


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
            "worst_task": worst_task, "halfwidth": slack, "rivals": everywhere, "met": lowest or within,
            "power": power.from_halfwidth(slack)}


def suite_goals(per_task: Mapping[str, Mapping[str, Any]], regret: Mapping[str, Mapping[str, Any]],
                share_max: float, measures: Mapping[str, str], halfwidths: Mapping[str, float], *,
                short: Sequence[str], truth: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> dict[str, Any]:
    """The four goals (module docstring). ``per_task``: each task's ``adwin.bench.compare.report.finish`` results;
    ``short``: the short-regime tasks; ``truth``: per task its audit-truth ``(step, window)`` checkpoints."""
    shares = [r.get("audit_overhead_frac") for res in per_task.values() for r in res.get("runs", [])]
    share = {"max_share": share_max, "limit": SHARE_MAX,
             "met": bool(math.isfinite(share_max) and share_max <= SHARE_MAX), "power": power.of_mean(shares)}
    long = per_task.get(LONG_TASK)
    meta = long["meta"] if long else {}
    lg = long_goal(long["methods"] if long else None, long.get("runs", []) if long else [],
                   (truth or {}).get(LONG_TASK), int(meta.get("steps", 0)), int(meta.get("horizon", 0)))
    goals = {"decision_share": share, "short_tasks": short_goal(per_task, [t for t in short if t in per_task], measures),
             "chain_long": lg, "regret": regret_goal(regret, list(per_task), halfwidths)}
    return goals | {"met": all(g["met"] for g in goals.values())}


def goal_lines(goals: Mapping[str, Any]) -> list[str]:
    """One line per goal, its power before its verdict, each ending MET or NOT MET, every number from ``goals``."""
    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    def ci(d: Mapping[str, float] | None) -> str:
        return "no paired CI" if d is None else f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"

    s, st, lg, r = goals["decision_share"], goals["short_tasks"], goals["chain_long"], goals["regret"]
    lines = [f"decision share: max over runs {s['max_share']:.3f} of the e2e wall (learner-side), limit "
             f"{s['limit']:.2f}; power: mean share {power.text(s['power'])} → {verdict(s['met'])}"]
    parts = [f"{t} {ci(v['diff_to_full'])} at {v['wall_ratio']:.2f}× (power: {power.text(v['power']['quality'])}, "
             f"wall {power.text(v['power']['wall_ratio'])})" if v["evaluated"] else f"{t} not evaluated"
             for t, v in st["tasks"].items()]
    lines.append(f"short tasks: {ADWIN_KEY} − full, e2e wall (not resolved below, ≤ {SHORT_WALL_MAX}×): "
                 f"{'; '.join(parts) or 'none ran'} → {verdict(st['met'])}")
    if not lg.get("evaluated"):
        lines.append(f"{LONG_TASK}: not evaluated ({lg['why']}) → NOT MET")
    else:
        p = lg["power"]
        diffs = ", ".join(f"{m} {ci(d)} (power {power.text(p[m])})" for m, d in lg["diff_to_full"].items())
        if lg["cost_evaluated"]:
            b = lg["below_truth"]
            cost = (f"FLOPs {lg['flops_ratio']:.2f}× full ≤ the truth's windows {lg['truth_flops_ratio']:.2f}× + "
                    f"{LONG_FLOPS_SLACK}: {'yes' if lg['flops_ok'] else 'no'} (power {power.text(p['flops_ratio'])}); "
                    f"steps below the truth's window {b['below']}/{b['steps']} = {b['share']:.2f} ≤ {b['limit']:.2f}: "
                    f"{'yes' if b['ok'] else 'no'} (power {power.text(p['below_share'])})")
        else:
            cost = f"FLOPs {lg['flops_ratio']:.2f}× full, cost bounds not evaluated ({lg['why']})"
        lines.append(f"{LONG_TASK}: {ADWIN_KEY} − full: {diffs} "
                     f"({'not resolved below' if lg['not_resolved_below'] else 'resolved below'}); {cost} "
                     f"→ {verdict(lg['met'])}")
    if r.get("evaluated"):
        rivals = ", ".join(f"{k} {v:.3f}" for k, v in r["rivals"].items() if k != ADWIN_KEY)
        lines.append(f"worst-case regret: {ADWIN_KEY} {r['adwin_worst_regret']:.3f}, lowest {r['lowest_method']} "
                     f"{r['lowest']:.3f} (+ half-width {r['halfwidth']:.3f} on {r['worst_task']}); {rivals}; "
                     f"power: {power.text(r['power'])} → {verdict(r['met'])}")
    else:
        lines.append(f"worst-case regret: not evaluated ({r['why']}) → NOT MET")
    return lines
