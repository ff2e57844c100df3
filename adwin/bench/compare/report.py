"""``adwin bench compare`` outputs: the rich table, results.json, the two PNGs and the HTML page."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adwin.bench.compare.stats import FLOPS_FORMULA, FLOPS_NOTE, aggregate, goal_check
from adwin.bench.compare.tasks import MEASURES, measures_of, paired_stats

FORCED_TITLE = ("Teacher-forced line skill by position: share of the chain lines right, of those ending in each "
                "range of response tokens (final evaluation, mean over seeds)")
SMOKE_BANNER = "SMOKE RUN ({mode}): one seed, few steps, reduced budget. Not a result; do not quote these numbers."


def clean(o: Any) -> Any:
    """JSON-safe: non-finite floats become null (json.dumps would write NaN, which is not JSON)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, Mapping):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    return o


def finish(meta: dict[str, Any], methods: Sequence[Any], runs: list[dict[str, Any]], out_dir: Path,
           plots: bool = True) -> dict[str, Any]:
    labels = {m.key: m.label for m in methods}
    per_method = aggregate(runs, [m.key for m in methods])
    for measure in measures_of(runs):  # accuracy, and the task's line measures
        for key, paired in paired_stats(runs, [m.key for m in methods], measure).items():
            per_method[key].setdefault("paired", {})[measure] = paired
    for key, entry in per_method.items():
        entry["label"] = labels[key]
    results = {"meta": meta | {"flops_formula": FLOPS_FORMULA, "flops_note": FLOPS_NOTE},
               "methods": per_method, "goal": goal_check(per_method), "runs": runs}
    (out_dir / "results.json").write_text(json.dumps(clean(results), indent=2))
    partial = out_dir / "runs.partial.json"
    if partial.exists():
        partial.unlink()
    print_table(results)
    if plots:
        adaptive = [m.key for m in methods if m.adaptive]
        plot_accuracy_vs_tokens(per_method, out_dir / "accuracy_vs_tokens.png", meta)
        plot_windows(runs, adaptive, labels, out_dir / "windows.png", meta)
        plot_audit_curves(runs, out_dir / "audits.png", meta)
        write_html(results, out_dir / "index.html")
    write_markdown(results, out_dir / "results.md")
    return results


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub table, for pasting a result into docs as it was printed."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def write_markdown(results: Mapping[str, Any], path: Path) -> None:
    """``results.md``: the printed table as markdown, with the command and the machine."""
    meta = results["meta"]
    banner = f"**{SMOKE_BANNER.format(mode=meta['mode'])}**\n\n" if meta.get("smoke") else ""
    batch = (f" of {meta['rollouts_per_step']} rollouts (P = {meta['probe_batch']})"
             if "rollouts_per_step" in meta else "")
    head = (f"{banner}`{meta.get('command')}` — task {meta.get('task', 'chain')}, {meta['steps']} steps{batch} x "
            f"seeds {meta['seeds']}, {meta.get('total_s', math.nan):.0f} s; machine after: {meta.get('machine')}\n\n")
    text = head + markdown_table([name for name, _ in columns(results)], table_rows(results))
    header, rows = forced_table(results)
    if rows:
        text += f"\n{FORCED_TITLE}\n\n" + markdown_table(header, rows)
    path.write_text(text)


def _ms(entry: Mapping[str, Any], metric: str, fmt: str = "{:.3f}") -> str:
    v = entry["metrics"][metric]
    if v["n"] == 0:
        return "—"
    if v["n"] == 1:
        return fmt.format(v["mean"])
    return f"{fmt.format(v['mean'])} ± {fmt.format(v['std'])}"


def _ratio(entry: Mapping[str, Any], metric: str) -> str:
    r = entry["ratio_to_full"][metric]
    return "—" if r is None or not math.isfinite(r) else f"{r:.2f}×"


def _eng(x: float) -> str:
    if not math.isfinite(x):
        return "—"
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"


def ci_text(entry: Mapping[str, Any], measure: str, what: str) -> str:
    """``what`` (``value`` or ``diff_to_full``) of a method's paired statistics of ``measure``, as mean [lo, hi]."""
    v = entry.get("paired", {}).get(measure, {}).get(what)
    if v is None:
        return "—"
    return f"{v['mean']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]" if what == "diff_to_full" else \
        f"{v['mean']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]"


COLUMNS: list[tuple[str, Any]] = [
    ("method", lambda k, e: k),
    ("accuracy", lambda k, e: _ms(e, "accuracy_final")),
    ("acc 95% CI (problems)", lambda k, e: ci_text(e, "accuracy", "value")),
    ("Δ vs full, paired 95% CI", lambda k, e: ci_text(e, "accuracy", "diff_to_full")),
    ("teacher KL", lambda k, e: _ms(e, "teacher_kl_final")),
    ("sync tokens", lambda k, e: _ms(e, "sync_tokens", "{:,.0f}")),
    ("probe tokens", lambda k, e: _ms(e, "probe_tokens", "{:,.0f}")),
    ("× full tokens", lambda k, e: _ratio(e, "rollout_tokens")),
    ("FLOPs", lambda k, e: _eng(e["metrics"]["flops"]["mean"])),
    ("× full FLOPs", lambda k, e: _ratio(e, "flops")),
    ("e2e wall s", lambda k, e: _ms(e, "train_wall_s", "{:.1f}")),
    ("× full e2e wall", lambda k, e: _ratio(e, "train_wall_s")),
    ("train s", lambda k, e: _ms(e, "learner_train_s", "{:.1f}")),
    ("× full train", lambda k, e: _ratio(e, "learner_train_s")),
    ("decision share of wall (learner)", lambda k, e: _ms(e, "audit_overhead_frac", "{:.3f}")),
    ("decision FLOPs share", lambda k, e: _ms(e, "probe_flops_frac", "{:.2f}")),
    ("mean W", lambda k, e: _ms(e, "mean_window", "{:.0f}")),
    ("acc / 1M tok", lambda k, e: _ms(e, "accuracy_per_mtoken", "{:.2f}")),
]


def columns(results: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``COLUMNS``, with each line measure the task has (its CI and paired difference to full) after accuracy's."""
    have = {m for e in results["methods"].values() for m in e.get("paired", {})}
    extra: list[tuple[str, Any]] = []
    for measure in (m for m in MEASURES[1:] if m in have):
        label = measure.replace("_", " ")
        extra += [(f"{label} [95% CI]", lambda k, e, m=measure: ci_text(e, m, "value")),
                  (f"Δ {label} vs full, paired 95% CI", lambda k, e, m=measure: ci_text(e, m, "diff_to_full"))]
    return COLUMNS[:4] + extra + COLUMNS[4:]


def table_rows(results: Mapping[str, Any]) -> list[list[str]]:
    cols = columns(results)
    return [[fn(k, e) for _, fn in cols] for k, e in results["methods"].items()]


# the AsyncOPD methods only: how stale their data was and what the lag did to the ratios
LAG_COLUMNS: list[tuple[str, Any]] = [
    ("method", lambda k, e: k),
    ("accuracy", lambda k, e: _ms(e, "accuracy_final")),
    ("teacher KL", lambda k, e: _ms(e, "teacher_kl_final")),
    ("staleness mean", lambda k, e: _ms(e, "staleness_mean", "{:.2f}")),
    ("staleness max", lambda k, e: _ms(e, "staleness_max", "{:.0f}")),
    ("ratio p50", lambda k, e: _ms(e, "is_ratio_p50", "{:.3f}")),
    ("ratio p99", lambda k, e: _ms(e, "is_ratio_p99", "{:.2f}")),
    ("ratio max", lambda k, e: _ms(e, "is_ratio_max", "{:.1f}")),
    ("|Δ log p| mean", lambda k, e: _ms(e, "logprob_gap_mean", "{:.3f}")),
    ("trained tokens", lambda k, e: _ms(e, "sync_tokens", "{:,.0f}")),
    ("discarded tokens", lambda k, e: _ms(e, "discarded_tokens", "{:,.0f}")),
    ("train wall s", lambda k, e: _ms(e, "train_wall_s", "{:.1f}")),
]


def forced_table(results: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Teacher-forced line skill by position (``adwin.tasks.forced``): per method, the mean over its seeds of the
    share of chain lines right among those ending in each window bin; empty when no run scored it."""
    from adwin.tasks.forced import bin_edges

    runs, meta = results.get("runs", []), results["meta"]
    have = {int(e) for r in runs for e in (r.get("forced_bins") or {})}
    if not have:
        return [], []
    bins = [(lo, hi) for lo, hi in bin_edges(meta.get("candidates", []), int(meta.get("horizon", max(have))))
            if hi in have]  # a bin no line ended in has no value
    edges = [hi for _, hi in bins]
    header = ["method", *[f"({lo}, {hi}]" if hi < int(meta.get("horizon", 0)) else f"> {lo}" for lo, hi in bins]]
    rows = []
    for key in results["methods"]:
        mine = [r["forced_bins"] for r in runs if r["method"] == key and r.get("forced_bins")]
        cells = [np.mean([b[str(e)] for b in mine if str(e) in b]) if any(str(e) in b for b in mine) else math.nan
                 for e in edges]
        rows.append([key, *("—" if not math.isfinite(c) else f"{c:.3f}" for c in cells)])
    return header, rows


def lag_rows(results: Mapping[str, Any]) -> list[list[str]]:
    return [[fn(k, e) for _, fn in LAG_COLUMNS] for k, e in results["methods"].items()
            if e["metrics"].get("staleness_mean", {}).get("n", 0) > 0]


def goal_text(goal: Mapping[str, Any]) -> str:
    if not goal.get("evaluated"):
        return f"goal not evaluated: {goal.get('why')}"
    red = goal["rollout_token_reduction"]
    return (f"goal (ADWIN 0.7 vs full): accuracy within full's spread: {'yes' if goal['accuracy_within_full_spread'] else 'NO'}; "
            f"rollout tokens {red:.2f}× fewer (sync only {goal['sync_token_reduction']:.2f}×), >= 3×: "
            f"{'yes' if goal['reduction_at_least_3x'] else 'NO'}; best accuracy per rollout token: "
            f"{goal['best_accuracy_per_token']} → goal {'MET' if goal['met'] else 'NOT MET'} (as measured)")


def print_table(results: Mapping[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 200))  # 13 columns: never squeeze them
    meta = results["meta"]
    if meta.get("smoke"):
        console.print(f"[bold red]{SMOKE_BANNER.format(mode=meta['mode'])}[/bold red]")
    title = (f"adwin bench compare — task {meta.get('task', 'chain')}, {meta['steps']} steps × seeds {meta['seeds']} "
             f"(mean ± std over seeds; ratios of means to full)")
    table = Table(title=title)
    for name, _ in columns(results):
        table.add_column(name, justify="left" if name == "method" else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console.print(table)
    if lag_rows(results):
        lag = Table(title="AsyncOPD methods: lag statistics (ratio = pi / pi_behavior per trained token; OAPL's "
                          "loss does not use it)")
        for name, _ in LAG_COLUMNS:
            lag.add_column(name, justify="left" if name == "method" else "right")
        for row in lag_rows(results):
            lag.add_row(*row)
        console.print(lag)
    header, rows = forced_table(results)
    if rows:
        forced = Table(title=FORCED_TITLE)
        for name in header:
            forced.add_column(name, justify="left" if name == "method" else "right")
        for row in rows:
            forced.add_row(*row)
        console.print(forced)
    console.print("methods: " + "; ".join(f"{k} = {e.get('label', k)}" for k, e in results["methods"].items()))
    console.print(f"FLOPs (estimate): {FLOPS_FORMULA}")
    if not meta.get("suite"):  # the suite's goals are the cross-task ones (compare_suite), not this task's
        console.print(goal_text(results["goal"]))
    console.print(f"total {meta.get('total_s', math.nan):.0f} s; machine before: {meta.get('machine_before')}, "
                  f"after: {meta.get('machine')}")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy_vs_tokens(methods: Mapping[str, Any], path: Path, meta: Mapping[str, Any]) -> None:
    """One point per method: final accuracy against rollout tokens (sync + probe), error bars = std over seeds."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for key, e in methods.items():
        x, y = e["metrics"]["rollout_tokens"], e["metrics"]["accuracy_final"]
        if not (math.isfinite(x["mean"]) and math.isfinite(y["mean"])):
            continue
        marker = "*" if key.startswith("adwin") else "s" if key in ("full", "iw-opd") else "o"
        ax.errorbar(x["mean"], y["mean"], xerr=x["std"] or None, yerr=y["std"] or None, fmt=marker, capsize=3,
                    markersize=10 if marker == "*" else 6, label=e.get("label", key))
        ax.annotate(key, (x["mean"], y["mean"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("rollout tokens per run (sync + probe), log scale")
    ax.set_ylabel("final accuracy (mean@k)")
    title = "accuracy vs rollout tokens (error bars: std over seeds)"
    if meta.get("smoke"):
        title = f"SMOKE RUN — {title}"
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_windows(runs: Sequence[Mapping[str, Any]], keys: Sequence[str], labels: Mapping[str, str], path: Path,
                 meta: Mapping[str, Any]) -> None:
    """Window over steps for the adaptive methods: the mean over seeds, shaded from min to max."""
    import numpy as np

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for key in keys:
        series = [r["windows"] for r in runs if r["method"] == key and r.get("windows")]
        if not series:
            continue
        n = min(len(s) for s in series)
        arr = np.array([s[:n] for s in series], dtype=float)  # (seeds, steps)
        steps = np.arange(n)
        (line,) = ax.plot(steps, arr.mean(0), label=labels.get(key, key), drawstyle="steps-post")
        if len(series) > 1:
            ax.fill_between(steps, arr.min(0), arr.max(0), step="post", alpha=0.15, color=line.get_color())
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("window (response tokens)")
    title = "window over steps (mean over seeds; band: min-max)"
    ax.set_title(f"SMOKE RUN — {title}" if meta.get("smoke") else title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_html(results: Mapping[str, Any], path: Path) -> None:
    meta, esc = results["meta"], html.escape
    head = "".join(f"<th>{esc(n)}</th>" for n, _ in columns(results))
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in table_rows(results))
    lag = lag_rows(results)
    lag_table = "" if not lag else (
        "<h2>AsyncOPD methods: lag statistics</h2><table><tr>" + "".join(f"<th>{esc(n)}</th>" for n, _ in LAG_COLUMNS)
        + "</tr>" + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in lag) + "</table>")
    banner = f"<p class='smoke'>{esc(SMOKE_BANNER.format(mode=meta['mode']))}</p>" if meta.get("smoke") else ""
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>adwin bench compare {esc(meta['date'])}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}
.smoke{{color:#b00;font-weight:bold;font-size:1.2em}} code{{background:#f4f4f4}}</style></head><body>
<h1>adwin bench compare</h1>{banner}
<p>{esc(meta['date'])} · {meta['steps']} steps × seeds {esc(str(meta['seeds']))} · profile {esc(meta['profile'])}
· command: <code>{esc(str(meta.get('command')))}</code></p>
<p>Mean ± std over seeds; × columns are ratios of means to full-rollout OPD. e2e wall: the run's whole wall but
its start and end evaluation (identical for every method); train: the learner's rollout + teacher + train phases;
decision share: the learner's own seconds on probes, the teacher's scoring of probe batches, drift and audits
(time/probe + time/audit) over the e2e wall, not a probe worker thread's.</p>
<table><tr>{head}</tr>{body}</table>{lag_table}
<p>{'' if meta.get('suite') else esc(goal_text(results['goal']))}</p>
<p><b>FLOPs (estimate):</b> {esc(FLOPS_FORMULA)}. {esc(FLOPS_NOTE)}</p>
<p>total {meta.get('total_s', 0):.0f} s · machine before: {esc(json.dumps(meta.get('machine_before')))}, after:
{esc(json.dumps(meta.get('machine')))}</p>
<h2>Accuracy vs rollout tokens</h2><img src="accuracy_vs_tokens.png" alt="accuracy vs rollout tokens">
<h2>Window over steps</h2><img src="windows.png" alt="window over steps">
<h2>Audit cosines per candidate and drift diagnostics (ADWIN 0.7 runs)</h2><img src="audits.png" alt="audits">
</body></html>
"""
    path.write_text(page)


def _audit_series(runs: Sequence[Mapping[str, Any]], method: str) -> dict[str, list[float]]:
    """Every ``audit/micro_cos_*`` and ``drift/*`` value logged by ``method``'s runs (metrics.jsonl)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        path = Path(r.get("run_dir", "")) / "metrics.jsonl"
        if r["method"] != method or not path.is_file():
            continue
        for line in path.read_text().splitlines():
            for k, v in json.loads(line).items():
                if (k.startswith("audit/micro_cos_") or k.startswith("drift/")) and isinstance(v, (int, float)):
                    out.setdefault(k, []).append(float(v))
    return out


def plot_audit_curves(runs: Sequence[Mapping[str, Any]], path: Path, meta: Mapping[str, Any],
                      method: str = "adwin-0.7") -> None:
    """Left: the mean audit cosine per candidate window (the threshold line at 0.7). Right: the drift
    diagnostics read at the candidate boundaries: teacher branching factor, top-1 survival, cumulative
    top-1 rejections (means over the audited batches)."""
    plt = _plt()
    series = _audit_series(runs, method)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))

    def by_window(prefix: str) -> tuple[list[int], list[float]]:
        pts = sorted((int(k[len(prefix):]), sum(v) / len(v)) for k, v in series.items()
                     if k.startswith(prefix) and k[len(prefix):].isdigit())
        return [p[0] for p in pts], [p[1] for p in pts]

    xs, ys = by_window("audit/micro_cos_")
    left.plot(xs, ys, "o-", label="mean cosine")
    left.axhline(0.7, color="gray", ls="--", label="threshold 0.7")
    left.set_xlabel("candidate window (tokens)")
    left.set_ylabel("cos(prefix gradient, full gradient)")
    for prefix, label in (("drift/ppl_", "branching factor (teacher PPL)"),
                          ("drift/survival_1_at_", "top-1 survival"), ("drift/rejections_1_at_", "top-1 rejections")):
        xs, ys = by_window(prefix)
        right.plot(xs, ys, "o-", label=label)
    right.set_xlabel("response position (candidate boundary)")
    right.set_yscale("symlog")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    title = f"{method}: audits ({len(series.get('audit/micro_cos_' + str(xs[0]), [])) if xs else 0} per point)"
    fig.suptitle(f"SMOKE RUN — {title}" if meta.get("smoke") else title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
