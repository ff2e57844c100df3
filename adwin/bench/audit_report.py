"""The validation's tables in ``adwin bench audit-truth``'s report: each held-out fold's verdict and scores
(``adwin.bench.audit_replay.held_out``) and the goals (``adwin.bench.audit_scores.goals``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from adwin.bench import audit_scores as sc

_VERDICT = {
    sc.LONGER: "**truth longer** than the noise-reading window (the noise reading truncates too early): this "
               "checkpoint judges the admissible and unsafe shares",
    sc.SHORTER: "**truth shorter** than the noise-reading window: this checkpoint judges the exact share and the cost",
    sc.SAME: "**same** as the noise-reading window: a rule that decides on the response lengths alone scores as well "
             "here, so this checkpoint judges no rule",
    sc.NO_TRUTH: "**no truth**: this half does not measure the full gradient's mean, so no share is scored",
}


def _cell(x: Mapping[str, Any] | None, cost: bool = False) -> str:
    if x is None:
        return "n/a"
    if cost:
        return f"{x['share']:.3f} [{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]"
    return f"{100 * x['share']:.0f} % [{100 * x['ci'][0]:.0f}, {100 * x['ci'][1]:.0f}]"


def fold_markdown(fold: Mapping[str, Any], candidates: Sequence[int], i: int, n_folds: int) -> list[str]:
    """One fold: where the truth came from, its verdict, and per replayed P every rule's and baseline's shares."""
    pops = " / ".join(f"{fold['population'][str(c)][0]:.2f}" for c in candidates)
    noise = " / ".join(f"{fold['noise_reading'][str(c)]:.2f}" for c in candidates)
    truth = "not identifiable" if fold["truth_window"] is None else str(fold["truth_window"])
    lines = ["", f"### Held out{f' (fold {i + 1} of {n_folds})' if n_folds > 1 else ''}: the truth from "
                 f"{len(fold['truth_samples'])} rollouts, the replay from the other {fold['replay_samples']}", "",
             f"Truth's window {truth} (population cosine {pops} for {' / '.join(str(c) for c in candidates)}; signal z "
             f"{fold['signal_z']:.1f}). Noise-reading window {fold['noise_window']} (the same half's "
             f"{fold['noise_source']}: {noise}). Verdict: {_VERDICT[fold['direction']]}.", ""]
    for p, scores in fold["replay"].items():
        decisions = next(iter(scores.values()))["decisions"]
        lines += [f"Replay at P = {p} ({decisions} decisions per rule):", "",
                  "| rule | exact | admissible | unsafe (below the truth's) | cost (window / horizon) | within one rung "
                  "(secondary) | unresolved audits (fallback) | windows chosen (share) |",
                  "|---|---|---|---|---|---|---|---|"]
        unresolved = fold.get("unresolved", {}).get(p, {})  # a rule's audits whose window followed its fallback
        for name, s in scores.items():
            ws = ", ".join(f"{w}: {100 * v:.0f} %" for w, v in s["windows"].items())
            marked = f"{100 * unresolved[name]:.0f} %" if name in unresolved else "n/a"
            lines.append(f"| {name} | {_cell(s['exact'])} | {_cell(s['admissible'])} | {_cell(s['unsafe'])} | "
                         f"{_cell(s['cost'], cost=True)} | {_cell(s['within_one_rung'])} | {marked} | {ws} |")
        lines.append("")
    return lines


def goals_markdown(goals: Sequence[Mapping[str, Any]], shipped: str) -> list[str]:
    """Every rule's goal status per P and direction, then the figures of the rule the presets ship."""
    if not goals:
        return []
    cols = sorted({(g["P"], g["case"]) for g in goals})
    by_rule: dict[str, dict[tuple[int, str], str]] = {}
    for g in goals:
        by_rule.setdefault(g["rule"], {})[(g["P"], g["case"])] = g["status"]
    lines = ["## Goals", "",
             f"Judged on checkpoints where the truth's window and the noise-reading window differ. Truth longer: "
             f"admissible >= {100 * sc.MIN_ADMISSIBLE:.0f} %, unsafe <= {100 * sc.MAX_UNSAFE:.0f} %, admissible "
             "share above the noise-reading rule's by more than the interval. Truth shorter: exact share above the "
             f"noise-reading rule's by more than the interval, at a lower cost, admissible >= "
             f"{100 * sc.MIN_ADMISSIBLE:.0f} %. The rule the presets ship is **{shipped}**.", "",
             "| rule | " + " | ".join(f"{case}, P = {p}" for p, case in cols) + " |", "|---|" + "---|" * len(cols)]
    for rule, row in by_rule.items():
        name = f"**{rule}**" if rule == shipped else rule
        lines.append(f"| {name} | " + " | ".join(row.get(c, "n/a") for c in cols) + " |")
    lines.append("")
    for g in goals:
        if g["rule"] == shipped:
            lines.append(f"- {shipped}, {g['case']}, P = {g['P']}: **{g['status']}**")
            lines += [f"  - {c['where']}: {'met' if c['met'] else 'not met'} ({c['figures']})" for c in g["checkpoints"]]
    lines.append("")
    return lines
