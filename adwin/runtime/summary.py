"""The end-of-run summary: initial vs final accuracy and teacher KL, rollout tokens (sync, probe, and what
a full-rollout run of the same steps would have generated), window decisions and the wall-time split."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

PHASES = ("rollout", "teacher", "train", "probe", "audit", "eval")


def last_logged(history: Sequence[Mapping[str, Any]], key: str) -> float:
    """A cumulative metric's last logged value; NaN when never logged (a run without decisions)."""
    vals = [float(h[key]) for h in history if h.get(key) is not None]
    return vals[-1] if vals else math.nan


def learner_decisions(history: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """The learner's own seconds on decisions (``time/probe`` + ``time/audit``: offers, inline rounds, forced
    completions it waited for, the teacher's scoring of probe batches, drift, audits it ran or waited for) and
    their share of the run's wall without evaluation (the same for every window policy): what
    ``audit.budget``'s aim of <= 10 % is about. A probe worker's own seconds are not in it."""
    spent = sum(float(h.get(k) or 0.0) for h in history for k in ("time/probe", "time/audit"))
    wall = float(history[-1].get("time/wall", math.nan)) if history else math.nan
    work = wall - sum(float(h.get("time/eval") or 0.0) for h in history)
    return spent, spent / work if work > 0 else math.nan


def summarize(history: Sequence[Mapping[str, Any]], initial: Mapping[str, float], final: Mapping[str, float],
              totals: Mapping[str, float]) -> dict[str, Any]:
    """Plain-dict summary (what ``summary.json`` holds and the table shows)."""
    windows = [int(h["window/current"]) for h in history if "window/current" in h]
    audits = int(sum(h.get("audit/submitted", 0.0) for h in history))  # a step may collect several
    changes = sum(1 for a, b in zip(windows, windows[1:], strict=False) if a != b)
    changed_by_audit = sum(
        1 for h, nxt in zip(history, history[1:], strict=False)
        if "audit/next_window" in h and int(h["audit/next_window"]) != int(h.get("window/current", -1))
        and "window/current" in nxt
    )
    staleness = [h["probe/staleness_max"] for h in history if "probe/staleness_max" in h]
    consumed = [h["audit/staleness_max"] for h in history if "audit/staleness_max" in h]
    time_split = {p: float(sum(h.get(f"time/{p}", 0.0) for h in history)) for p in PHASES}
    return {
        "steps": len(history),
        "accuracy_initial": initial.get("eval/accuracy", math.nan),
        "accuracy_final": final.get("eval/accuracy", math.nan),
        "teacher_kl_initial": initial.get("eval/teacher_kl", math.nan),
        "teacher_kl_final": final.get("eval/teacher_kl", math.nan),
        "sync_tokens": float(totals.get("sync_tokens", 0.0)),
        "probe_tokens": float(totals.get("probe_tokens", 0.0)),
        "full_equiv_tokens": float(totals.get("full_equiv_tokens", 0.0)),
        "windows": windows,
        "window_changes": changes,
        "audits": audits,
        "audits_changing_window": changed_by_audit,
        "staleness_max": float(max(staleness, default=0.0)),  # probes being extended: bounded by S
        "audit_staleness_max": float(max(consumed, default=0.0)),  # probes when audited (may wait complete)
        "time": time_split,
        "wall_s": float(history[-1].get("time/wall", 0.0)) if history else 0.0,
        "decision_share": learner_decisions(history)[1],
        "decision_flops_share": last_logged(history, "decision/flops_share"),
    }


def _fmt(v: float, digits: int = 3) -> str:
    return "—" if isinstance(v, float) and math.isnan(v) else f"{v:.{digits}f}"


def render(summary: Mapping[str, Any], console: Any = None) -> None:
    """Print the summary as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    s = summary
    quality = Table(title="adwin run summary", caption=f"models: {s['models']}" if s.get("models") else None)
    quality.add_column("metric")
    quality.add_column("initial", justify="right")
    quality.add_column("final", justify="right")
    quality.add_row("accuracy", _fmt(s["accuracy_initial"]), _fmt(s["accuracy_final"]))
    quality.add_row("teacher KL", _fmt(s["teacher_kl_initial"]), _fmt(s["teacher_kl_final"]))
    console.print(quality)

    tokens = Table(title="rollout tokens")
    tokens.add_column("kind")
    tokens.add_column("tokens", justify="right")
    tokens.add_row("sync (training rollouts)", f"{s['sync_tokens']:,.0f}")
    tokens.add_row("probe (off critical path)", f"{s['probe_tokens']:,.0f}")
    tokens.add_row("sync + probe", f"{s['sync_tokens'] + s['probe_tokens']:,.0f}")
    tokens.add_row("full-rollout run, same steps (est.)", f"{s['full_equiv_tokens']:,.0f}")
    console.print(tokens)

    timing = Table(title=f"wall time {s['wall_s']:.1f}s over {s['steps']} steps")
    for p in PHASES:
        timing.add_column(p, justify="right")
    timing.add_row(*[f"{s['time'][p]:.1f}s" for p in PHASES])
    console.print(timing)
    windows = s["windows"]
    console.print(
        f"windows: {windows[0] if windows else '—'} → {windows[-1] if windows else '—'} "
        f"({s['window_changes']} changes, {s['audits']} audits, {s['audits_changing_window']} changed the window); "
        f"max probe staleness {s['staleness_max']:.0f} in flight, {s['audit_staleness_max']:.0f} when audited"
    )
    if s["audits"] or s["time"]["probe"] or s["time"]["audit"]:
        console.print(f"decisions: {_fmt(s['decision_share'])} of the wall without evaluation on the learner "
                      f"(probe + audit), {_fmt(s['decision_flops_share'])} of the FLOPs")
