"""What ``adwin bench compare`` measures per run, how it estimates training FLOPs, and how it aggregates
runs over seeds into per-method mean, spread and ratios to full-rollout OPD."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from adwin.audit.budget import FLOPS_FORMULA, FLOPS_NOTE, FlopsModel  # noqa: F401  (FLOPS_*: re-exported)
from adwin.runtime.summary import last_logged, learner_decisions
from adwin.tasks.suite import LINE_MEASURES

# Per-method metrics aggregated over seeds (name -> label); ratios to full are taken of the means.
METRICS: dict[str, str] = {
    "accuracy_final": "accuracy (final, mean@k)",
    # the built-in task's line measures (adwin.tasks.suite.LineScore; absent for a JSONL task)
    "lines_right_final": "share of the chain lines right before the first wrong one (final)",
    "closing_right_final": "closing line right (final; chain-late tasks)",
    "forced_lines_final": "share of the chain lines right under teacher forcing (final; adwin.tasks.forced)",
    "teacher_kl_final": "teacher KL (final)",
    "sync_tokens": "sync rollout tokens",
    "probe_tokens": "probe tokens",
    "rollout_tokens": "rollout tokens (sync + probe)",
    "flops": "training FLOPs (est.)",
    "wall_s": "wall time s",
    # end-to-end: the run's whole wall but its start and end evaluation (the same for every method)
    "train_wall_s": "end-to-end wall without evaluation s",
    "learner_train_s": "train wall s (the learner's rollout + teacher + train phases)",
    "audit_overhead_s": "learner-side decision time s (probe + audit phases)",
    # the learner's own seconds on offers, inline probe rounds, the teacher's scoring of probe batches, drift
    # and audits (time/probe + time/audit), not a probe worker thread's: what the decisions cost the run's clock
    "audit_overhead_frac": "learner-side decision share of the end-to-end wall",
    "decision_flops_share": "decisions' share of FLOPs (decision/flops_share)",
    "decision_seconds_share": "decisions' seconds wherever run / (those + training's) (decision/seconds_share)",
    "probe_flops_frac": "probe + audit share of FLOPs",
    "mean_window": "mean window",
    "accuracy_per_mtoken": "accuracy per 1M rollout tokens",
    "gain_per_mtoken": "accuracy gain per 1M rollout tokens",
    # the AsyncOPD methods' lag statistics (absent for the synchronous trainer's runs)
    "discarded_tokens": "discarded rollout tokens (OAPL's cleared buffer)",
    "staleness_mean": "staleness of trained samples, mean (updates)",
    "staleness_max": "staleness of trained samples, max (updates)",
    "is_ratio_p50": "ratio pi/pi_behavior per token, p50 (step mean)",
    "is_ratio_p99": "ratio pi/pi_behavior per token, p99 (step mean)",
    "is_ratio_max": "ratio pi/pi_behavior per token, max over the run",
    "logprob_gap_mean": "|log pi - log pi_behavior| per token, mean",
}
# (row key, metrics.jsonl key, how the run's steps are reduced)
LAG_KEYS: tuple[tuple[str, str, str], ...] = (
    ("staleness_mean", "async/staleness_mean", "mean"), ("staleness_max", "async/staleness_max", "max"),
    ("is_ratio_p50", "loss/is_ratio_p50", "mean"), ("is_ratio_p99", "loss/is_ratio_p99", "mean"),
    ("is_ratio_max", "loss/is_ratio_max", "max"), ("logprob_gap_mean", "rollout/logprob_gap_mean", "mean"),
)
RATIO_METRICS = ("accuracy_final", "teacher_kl_final", "sync_tokens", "rollout_tokens", "flops", "wall_s",
                 "train_wall_s", "learner_train_s")


def _sum(history: Sequence[Mapping[str, Any]], key: str) -> float:
    return float(sum(float(h[key]) for h in history if key in h and h[key] is not None))


def estimate_flops(history: Sequence[Mapping[str, Any]], n_student: int, n_teacher: int,
                   probe_batch: int, samples_per_step: int) -> dict[str, float]:
    """``FLOPS_FORMULA`` from a run's step metrics. Probe prompts are not logged: each audited probe is
    charged the run's mean prompt length per rollout sample."""
    prompt, response = _sum(history, "rollout/prompt_tokens"), _sum(history, "rollout/sync_tokens")
    samples = samples_per_step * sum(1 for h in history if "rollout/prompt_tokens" in h)
    mean_prompt = prompt / samples if samples else 0.0
    audited = [h for h in history if "audit/probe_tokens" in h]
    audit_tokens = _sum(audited, "audit/probe_tokens") + mean_prompt * probe_batch * len(audited)
    model = FlopsModel(n_student, n_teacher)
    sync = model.train(prompt + response)
    probe = (model.decision("extension", _sum(history, "probe/tokens")) + model.decision("scoring", audit_tokens)
             + model.decision("audit", audit_tokens))
    return {"flops": sync + probe, "flops_sync": sync, "flops_probe": probe}


def lag_statistics(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``LAG_KEYS`` over a run's steps (NaN when never logged) and the discarded tokens (0 when none)."""
    out: dict[str, float] = {}
    for key, source, how in LAG_KEYS:
        vals = [float(h[source]) for h in history if h.get(source) is not None and math.isfinite(float(h[source]))]
        out[key] = (max(vals) if how == "max" else statistics.fmean(vals)) if vals else math.nan
    discarded = [float(h["async/discarded_tokens"]) for h in history if "async/discarded_tokens" in h]
    out["discarded_tokens"] = discarded[-1] if discarded else 0.0  # cumulative
    return out


FORCED_BIN = "@"  # eval/forced_lines@<c>: c, a bin's upper edge in response tokens (adwin.tasks.forced.bin_edges)


def forced_bins(evaluation: Mapping[str, float]) -> dict[str, float]:
    """An evaluation's teacher-forced line skill per position bin, keyed by the bin's upper edge (empty without)."""
    keys = [k for k in evaluation if k.startswith("eval/forced_lines" + FORCED_BIN)]
    return {k.rpartition(FORCED_BIN)[2]: float(evaluation[k]) for k in keys}


def measure_run(history: Sequence[Mapping[str, Any]], initial: Mapping[str, float], final: Mapping[str, float],
                totals: Mapping[str, float], *, n_student: int, n_teacher: int, probe_batch: int,
                samples_per_step: int) -> dict[str, Any]:
    """One run's row: quality, tokens (rollout = sync + probe + discarded), FLOPs, clocks, its window
    trajectory and the lag statistics (``lag_statistics``)."""
    windows = [int(h["window/current"]) for h in history if "window/current" in h]
    wall = float(history[-1].get("time/wall", math.nan)) if history else math.nan  # the start-of-run evaluation's too
    eval_s = _sum(history, "time/eval")
    overhead, overhead_frac = learner_decisions(history)
    lag = lag_statistics(history)
    sync, probe = float(totals.get("sync_tokens", 0.0)), float(totals.get("probe_tokens", 0.0))
    rollout = sync + probe + lag["discarded_tokens"]  # discarded tokens were generated too, then never trained on
    acc0, acc = float(initial.get("eval/accuracy", math.nan)), float(final.get("eval/accuracy", math.nan))
    mtokens = rollout / 1e6
    row: dict[str, Any] = {
        "accuracy_initial": acc0,
        "accuracy_final": acc,
        "teacher_kl_initial": float(initial.get("eval/teacher_kl", math.nan)),
        "teacher_kl_final": float(final.get("eval/teacher_kl", math.nan)),
        "sync_tokens": sync,
        "probe_tokens": probe,
        "rollout_tokens": rollout,
        "wall_s": wall,
        "eval_s": eval_s,
        "train_wall_s": wall - eval_s,
        "learner_train_s": sum(_sum(history, f"time/{p}") for p in ("rollout", "teacher", "train")),
        "decision_flops_share": last_logged(history, "decision/flops_share"),
        "decision_seconds_share": last_logged(history, "decision/seconds_share"),
        "audit_overhead_s": overhead,
        "audit_overhead_frac": overhead_frac,
        "audits": int(sum(h.get("audit/submitted", 0.0) for h in history)),
        "mean_window": statistics.fmean(windows) if windows else math.nan,
        "windows": windows,
        "accuracy_per_mtoken": acc / mtokens if mtokens else math.nan,
        "gain_per_mtoken": (acc - acc0) / mtokens if mtokens else math.nan,
    }
    for measure in (*LINE_MEASURES, "forced_lines"):
        row[f"{measure}_initial"] = float(initial.get(f"eval/{measure}", math.nan))
        row[f"{measure}_final"] = float(final.get(f"eval/{measure}", math.nan))
    row["forced_bins"] = forced_bins(final)
    row |= lag
    row |= estimate_flops(history, n_student, n_teacher, probe_batch, samples_per_step)
    row["probe_flops_frac"] = row["flops_probe"] / row["flops"] if row["flops"] else math.nan
    return row


def mean_std(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for one value) over the finite values."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}


def aggregate(runs: Sequence[Mapping[str, Any]], order: Sequence[str], reference: str = "full") -> dict[str, Any]:
    """Per method: mean/std of ``METRICS`` over seeds, ratios of the means to ``reference``."""
    out: dict[str, Any] = {}
    for key in order:
        rows = [r for r in runs if r["method"] == key]
        if not rows:
            continue
        out[key] = {"seeds": [r["seed"] for r in rows],
                    "metrics": {m: mean_std([r.get(m, math.nan) for r in rows]) for m in METRICS}}
    ref = out.get(reference)
    for entry in out.values():
        ratios = {}
        for m in RATIO_METRICS:
            num, den = entry["metrics"][m]["mean"], ref["metrics"][m]["mean"] if ref else math.nan
            ratios[m] = num / den if ref and math.isfinite(num) and math.isfinite(den) and den != 0 else math.nan
        entry["ratio_to_full"] = ratios
    return out


def goal_check(methods: Mapping[str, Any], adwin: str = "adwin-0.7", reference: str = "full") -> dict[str, Any]:
    """The issue's goal, evaluated as measured: ADWIN at 0.7 within full's spread of accuracy
    (mean >= full mean - full std) with >= 3x fewer rollout tokens (sync + probe), and the best accuracy
    per rollout token of all methods."""
    if adwin not in methods or reference not in methods:
        return {"evaluated": False, "why": f"needs both {adwin!r} and {reference!r}"}
    a, f = methods[adwin]["metrics"], methods[reference]["metrics"]
    within = a["accuracy_final"]["mean"] >= f["accuracy_final"]["mean"] - f["accuracy_final"]["std"]
    reduction = f["rollout_tokens"]["mean"] / a["rollout_tokens"]["mean"] if a["rollout_tokens"]["mean"] else math.nan
    reduction_sync = f["sync_tokens"]["mean"] / a["sync_tokens"]["mean"] if a["sync_tokens"]["mean"] else math.nan
    per_token = {k: v["metrics"]["accuracy_per_mtoken"]["mean"] for k, v in methods.items()}
    finite = {k: v for k, v in per_token.items() if math.isfinite(v)}
    top = max(finite.values(), default=math.nan)
    leaders = [k for k, v in finite.items() if v == top]
    best = leaders[0] if len(leaders) == 1 else None  # a tie has no single best
    return {
        "evaluated": True,
        "accuracy_within_full_spread": bool(within),
        "rollout_token_reduction": reduction,
        "sync_token_reduction": reduction_sync,
        "reduction_at_least_3x": bool(math.isfinite(reduction) and reduction >= 3.0),
        "best_accuracy_per_token": best,
        "adwin_best_accuracy_per_token": best == adwin,
        "met": bool(within and math.isfinite(reduction) and reduction >= 3.0 and best == adwin),
    }
