"""The cross-task outputs of ``adwin bench compare`` over several tasks: regret per task and worst case under
each method's cross-task names (fixed windows by ladder rung and by value), wall, FLOPs and token ratios to
full averaged over tasks, the largest learner-side decision share, the suite's goals (computed), ``suite.json``,
``index.html`` and a regret-vs-wall plot."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adwin.bench.compare.goals import LONG_MEASURES, LONG_TASK, goal_lines, suite_goals
from adwin.bench.compare.plan import regime, suite_measure
from adwin.bench.compare.report import SMOKE_BANNER, _plt, clean, markdown_table
from adwin.bench.compare.tasks import REFERENCE, regrets, samples_needed

RATIOS = {"train_wall_s": "e2e wall", "flops": "FLOPs", "rollout_tokens": "rollout tokens"}


def cross_task(methods: Mapping[str, Sequence[Any]], per_task: Mapping[str, Mapping[str, Any]],
               measures: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Per cross-task name (``Method.suite_names``): each task's measure per task (``measures[task]``, accuracy where
    absent: the mean over seeds of its final value), and each ratio to full per task."""
    score: dict[str, dict[str, float]] = {}
    ratios: dict[str, dict[str, dict[str, float]]] = {m: {} for m in RATIOS}
    for task, chosen in methods.items():
        results = per_task[task]["methods"]
        measure = (measures or {}).get(task, "accuracy")
        for m in chosen:
            if m.key not in results:
                continue
            for name in m.suite_names():
                score.setdefault(task, {})[name] = results[m.key]["metrics"][f"{measure}_final"]["mean"]
                for metric in RATIOS:
                    ratios[metric].setdefault(name, {})[task] = results[m.key]["ratio_to_full"][metric]
    return {"measure": score, "ratios": ratios}


def mean_over_tasks(by_task: Mapping[str, float], tasks: Sequence[str]) -> float:
    """The mean over ``tasks`` (NaN unless the name ran on every task with a finite value)."""
    vals = [by_task.get(t, math.nan) for t in tasks]
    vals = [v if v is not None else math.nan for v in vals]
    return sum(vals) / len(vals) if vals and all(math.isfinite(v) for v in vals) else math.nan


def max_decision_share(per_task: Mapping[str, Mapping[str, Any]]) -> float:
    vals = [float(r["audit_overhead_frac"]) for res in per_task.values() for r in res["runs"]
            if r.get("audit_overhead_frac") is not None and math.isfinite(float(r["audit_overhead_frac"]))]
    return max(vals, default=math.nan)


def finish_suite(meta: dict[str, Any], methods: Mapping[str, Sequence[Any]],
                 per_task: Mapping[str, Mapping[str, Any]], out_dir: Path, plots: bool = True,
                 truth: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> dict[str, Any]:
    """The cross-task outputs; ``truth``: per task its audit-truth ``(step, window)`` checkpoints (``--truth``), which
    the ``chain-long`` cost goal reads (``adwin.bench.compare.goals``)."""
    from adwin.tasks.suite import get_task

    tasks = list(per_task)
    measures = {t: suite_measure(t) for t in tasks}
    cross = cross_task(methods, per_task, measures)
    regret = regrets(cross["measure"])
    means = {metric: {k: mean_over_tasks(v, tasks) for k, v in by_name.items()}
             for metric, by_name in cross["ratios"].items()}
    halfwidths = {t: max((e["paired"][measures[t]]["diff_to_full"]["halfwidth"] for e in r["methods"].values()
                          if "diff_to_full" in e.get("paired", {}).get(measures[t], {})), default=math.nan)
                  for t, r in per_task.items()}
    share = max_decision_share(per_task)
    short = [t for t in tasks if regime(get_task(t)) == "short"]
    goals = suite_goals(per_task, regret, share, measures, halfwidths, short=short, truth=truth)
    suite = {"meta": meta | {"samples_needed_for_0.03": samples_needed(0.03)}, "measures": measures, "regret": regret,
             "ratio_mean": means, "token_ratio_mean": means["rollout_tokens"], "max_paired_halfwidth": halfwidths,
             "max_decision_share": share, "goals": goals, "goal_lines": goal_lines(goals)}
    (out_dir / "suite.json").write_text(json.dumps(clean(suite), indent=2))
    from rich.console import Console

    console = Console(width=200)
    for line in suite["goal_lines"]:
        console.print(line, markup=False)
    if plots:
        plot_regret_vs_wall(regret, means["train_wall_s"], out_dir / "regret_vs_wall.png", meta)
    write_suite_html(suite, tasks, out_dir / "index.html")
    write_suite_markdown(suite, tasks, out_dir / "suite.md")
    (out_dir / "headline.md").write_text(headline_markdown(suite, methods, per_task))
    return suite


def suite_rows(suite: Mapping[str, Any], tasks: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """The cross-task table: regret per task, worst case, and each ratio to full averaged over tasks."""
    header = ["method", *(f"regret {t}" for t in tasks), "worst-case regret",
              *(f"× full {label} (mean over tasks)" for label in RATIOS.values())]
    rows = [[k, *(_f(e["per_task"].get(t)) for t in tasks), _f(e["worst"]),
             *(_f(suite["ratio_mean"][m].get(k), "{:.2f}") for m in RATIOS)] for k, e in suite["regret"].items()]
    return header, rows


def write_suite_markdown(suite: Mapping[str, Any], tasks: Sequence[str], path: Path) -> None:
    """``suite.md``: the cross-task table and the goal lines, as markdown."""
    meta = suite["meta"]
    banner = f"**{SMOKE_BANNER.format(mode=meta['mode'])}**\n\n" if meta.get("smoke") else ""
    goals = "".join(f"- {line}\n" for line in suite["goal_lines"])
    path.write_text(f"{banner}`{meta.get('command')}`\n\n" + markdown_table(*suite_rows(suite, tasks))
                    + "\n" + goals)


HEADLINE_FAMILIES = ("full", "linear", "fixed-", "adwin-0.7")  # the headline's methods, in this order


def headline_markdown(suite: Mapping[str, Any], methods: Mapping[str, Sequence[Any]],
                      per_task: Mapping[str, Mapping[str, Any]]) -> str:
    """The headline for README and docs/benchmarks.md: per task, full, linear, every fixed window and ADWIN-0.7 with
    the task's measure (and accuracy beside a line measure; on ``chain-long`` its goal's measures too), their paired
    95 % CIs against full, x full e2e wall and x full FLOPs; then the cross-task regret and the goal lines as the
    suite printed them."""
    from adwin.bench.compare.report import ci_text

    meta = suite["meta"]
    banner = f"**{SMOKE_BANNER.format(mode=meta['mode'])}**\n\n" if meta.get("smoke") else ""
    out = [f"{banner}`{meta.get('command')}` (commit {meta.get('commit') or 'unknown'}, device "
           f"{meta.get('device', 'cpu')})\n"]
    for task, chosen in methods.items():
        measure = suite["measures"][task]
        results = per_task[task]["methods"]
        # beside the task's measure, what its goal reads (chain-long's: teacher-forced line skill and accuracy)
        shown = list(dict.fromkeys([measure, *(LONG_MEASURES if task == LONG_TASK else ("accuracy",))]))
        header = ["method", *(c for m in shown for c in (f"{m} [95% CI]", f"Δ {m} vs full [paired 95% CI]")),
                  "× full e2e wall", "× full FLOPs"]
        keys = [m.key for f in HEADLINE_FAMILIES for m in chosen
                if (m.key.startswith(f) if f.endswith("-") else m.key == f) and m.key in results]
        rows = [[k, *(ci_text(results[k], m, w) for m in shown for w in ("value", "diff_to_full")),
                 _f(results[k]["ratio_to_full"]["train_wall_s"], "{:.2f}"), _f(results[k]["ratio_to_full"]["flops"],
                                                                                 "{:.2f}")] for k in keys]
        meta_t = per_task[task].get("meta", {})
        size = (f"{meta_t.get('steps')} steps of {meta_t.get('rollouts_per_step')} rollouts, seeds "
                f"{meta_t.get('seeds')}, {meta_t.get('eval_problems')} problems" if meta_t else "")
        out.append(f"\n**{task}** (measure: {measure}; {size})\n\n" + markdown_table(header, rows))
    header, rows = suite_rows(suite, list(per_task))
    out.append("\n**Across the tasks** (regret of each task's measure)\n\n" + markdown_table(header, rows))
    out.append("\n" + "".join(f"- {line}\n" for line in suite["goal_lines"]))
    return "".join(out)


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "—" if x is None or not math.isfinite(x) else fmt.format(x)


def write_suite_html(suite: Mapping[str, Any], tasks: Sequence[str], path: Path) -> None:
    meta, esc = suite["meta"], html.escape
    header, table = suite_rows(suite, tasks)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    rows = ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in table]
    banner = f"<p class='smoke'>{esc(SMOKE_BANNER.format(mode=meta['mode']))}</p>" if meta.get("smoke") else ""
    sections = "".join(
        f"<h2>{esc(t)}</h2><p><a href='{esc(t)}/index.html'>full table</a> · largest paired CI half-width "
        f"{_f(suite['max_paired_halfwidth'][t])}</p><img src='{esc(t)}/accuracy_vs_tokens.png' alt='accuracy'>"
        f"<img src='{esc(t)}/windows.png' alt='windows'><img src='{esc(t)}/audits.png' alt='audits'>" for t in tasks)
    goals = "".join(f"<li>{esc(line)}</li>" for line in suite["goal_lines"])
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>adwin bench compare across tasks {esc(meta['date'])}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}
.smoke{{color:#b00;font-weight:bold;font-size:1.2em}} img{{max-width:32%}}</style></head><body>
<h1>adwin bench compare across tasks</h1>{banner}
<p>{esc(meta['date'])} · command: <code>{esc(str(meta.get('command')))}</code></p>
<p>Regret: the task's best mean accuracy minus the method's. <code>fixed-rung&lt;k&gt;</code>: the k-th window of
each task's own ladder; a fixed window by value has a regret on the tasks whose ladder holds it. Ratios are to
{esc(REFERENCE)}; e2e wall excludes the start and end evaluation (the same for every method).</p>
<table><tr>{head}</tr>{''.join(rows)}</table><h2>Goals (computed from the numbers above)</h2><ul>{goals}</ul>
<img src="regret_vs_wall.png" alt="regret vs wall">{sections}</body></html>
"""
    path.write_text(page)


LABEL_LEVELS = (4, 14, -12)  # label heights in points above a marker; neighbours take the next one


def label_offsets(points: list[tuple[float, float]], near: float = 0.15) -> dict[tuple[float, float], tuple[int, int]]:
    """A label offset per point: points at one regret whose walls are within ``near`` of the previous point's (in
    full's walls) take the next height in turn, so their labels, which run to the right, do not overprint."""
    out: dict[tuple[float, float], tuple[int, int]] = {}
    last: dict[float, tuple[float, int]] = {}  # regret -> (wall, level) of the last point placed at it
    for x, y in sorted(points, key=lambda p: (p[1], p[0])):
        prev = last.get(y)
        level = (prev[1] + 1) % len(LABEL_LEVELS) if prev is not None and x - prev[0] < near else 0
        out[(x, y)] = (5, LABEL_LEVELS[level])
        last[y] = (x, level)
    return out


def plot_regret_vs_wall(regret: Mapping[str, Mapping[str, Any]], wall: Mapping[str, float], path: Path,
                        meta: Mapping[str, Any]) -> None:
    """One point per cross-task name: worst-case regret against e2e wall over full's (mean over tasks)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    points: dict[tuple[float, float], list[str]] = {}  # a rung and a value naming the same runs share a point
    for k, entry in regret.items():
        x, y = wall.get(k, math.nan), entry["worst"]
        if math.isfinite(x) and math.isfinite(y):
            points.setdefault((x, y), []).append(k)
    offsets = label_offsets(list(points))
    for (x, y), names in points.items():
        adaptive = any(k.startswith("adwin") for k in names)
        ax.plot(x, y, "*" if adaptive else "o", markersize=11 if adaptive else 6)
        ax.annotate(" = ".join(names), (x, y), textcoords="offset points", xytext=offsets[(x, y)], fontsize=8)
    ax.set_xlabel("e2e wall / full's, mean over tasks")
    ax.set_ylabel("worst-case regret over tasks")
    title = "worst-case regret vs wall"
    ax.set_title(f"SMOKE RUN — {title}" if meta.get("smoke") else title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
