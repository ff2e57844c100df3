"""``adwin bench audit-truth``: what the gradients say about each candidate window at a checkpoint, and whether
ADWIN's online rule finds it on samples the truth did not read.

At each checkpoint (``--at``: the prepared student is step 0; later steps are reached by full-rollout OPD with the
suite's settings for the task, as ``adwin bench curve`` trains) the bench samples a pool of ``--rollouts`` full
rollouts, computes every sample's CountSketched segment gradients once (the audit's own per-sample pass,
``adwin.audit.grams.chunked_grams``) and reads everything from their cross Gram (``adwin.audit.truth``):

- per candidate, over the whole pool: the population cosine with its interval, the pure-noise reading
  ``sqrt(N_w / N_F)`` (same-sample energies, and token counts), what the batch and debiased estimators read at
  ``P`` = ``--sizes`` (mean, 10-90 %, share >= the threshold, debiased fallbacks), and the cosine of an
  ``R``-rollout update with the population full gradient;
- the full gradient's noise scale and effective dimension; the truth's window (the shortest candidate whose
  population cosine reaches the threshold, else the horizon), which ``adwin bench compare --truth`` reads;
- the validation (``adwin.bench.audit_replay``): the pool is split (``--split``), the truth read from one half and
  every rule (``RULES``) replayed on ``--replay-audits`` audits of the run's ``P`` drawn from the other,
  ``--replay-runs`` times, beside the noise-reading rule, each constant window and the truth's own schedule. Each is
  scored by its exact, admissible and unsafe shares and its cost, with intervals over the runs
  (``adwin.bench.audit_scores``); the verdict says whether the truth's window lies above or below the noise-reading
  window (a checkpoint where they agree judges no rule), and the goals are printed met, not met, or with no
  checkpoint to judge.

Launch: ``adwin bench audit-truth --task chain-long --at 0,10,20``. Writes ``OUT/<task>-<date>/truth.md`` (the
tables), ``truth.json`` and each checkpoint's cross Gram and response lengths (``gram-<step>.npz``; ``--from-npz``
replays from it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from adwin.bench.audit_replay import RULES, SPLITS, Rule, held_out, shipped_rule

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default="chain-long", help="built-in task (default chain-long)")
    p.add_argument("--at", default="0", help="checkpoints: steps of training, comma-separated (default 0)")
    p.add_argument("--trajectory", default="full", metavar="METHOD",
                   help="the method whose training reaches the checkpoints: 'full' (full-rollout OPD, default) or "
                        "a method of `adwin bench compare` (e.g. adwin-0.7: the truth on ADWIN's own student, "
                        "beside the windows that run chose)")
    p.add_argument("--rollouts", type=int, default=256, help="full rollouts in each checkpoint's pool (default 256)")
    p.add_argument("--sizes", default="2,8,32,64", help="probe batch sizes P the estimators are read at")
    p.add_argument("--draws", type=int, default=200, help="random probe batches per P (default 200)")
    p.add_argument("--update-rollouts", type=int, default=32, help="R of the update view (default 32)")
    p.add_argument("--probe-batch", default=None, help="the replay's P, comma-separated (default: the run's and 8)")
    p.add_argument("--replay-audits", type=int, default=12, help="audits per replayed run (default 12)")
    p.add_argument("--replay-runs", type=int, default=40, help="replayed runs per rule (default 40)")
    p.add_argument("--split", choices=SPLITS, default="half",
                   help="how the truth and the replay share the pool: 'half' (default) reads the truth from a random "
                        "half (--seed) and replays on the other; 'cross' also swaps the halves and reports both")
    p.add_argument("--cadence", type=int, default=1, help="the replay's steps between audits (default 1): a pooled "
                   "audit's age, for its decay and the staleness limit")
    p.add_argument("--initial", type=int, default=None,
                   help="the replay's window before its first audit (default: the run's window.initial, saved with "
                        "each pool; else the largest candidate)")
    p.add_argument("--sketch-dim", type=int, default=16384, help="CountSketch dimension (default 16384)")
    p.add_argument("--profile", choices=("default", "tiny"), default="default", help="built-in task models")
    p.add_argument("--config", metavar="YAML", default=None, help="base config (default: the suite's preset)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="training, sampling and split seed")
    p.add_argument("--assets-seed", type=int, default=0, help="which prepared built-in models to use")
    p.add_argument("--out", default="bench/audit-truth", help="results go to OUT/<task>-<date>/")
    p.add_argument("--from-npz", nargs="+", default=None, metavar="NPZ",
                   help="replay saved checkpoints (gram-<step>.npz) instead of sampling new pools")
    p.add_argument("--combine", nargs="+", default=None, metavar="TRUTH_JSON",
                   help="judge the goals over the checkpoints of several reports (truth.json, e.g. one per training "
                        "seed) as they were replayed, and sum the windows their runs trained under; samples nothing")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from adwin.bench.audit_scores import goals

    if args.combine:
        return combine(args)
    at = _steps(args.at)
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    if args.rollouts < max(sizes + [args.update_rollouts + 2]):
        raise ValueError(f"--rollouts {args.rollouts} must cover the largest P ({max(sizes)}) and "
                         f"--update-rollouts + 2 ({args.update_rollouts + 2})")
    if args.cadence < 1:
        raise ValueError(f"--cadence must be >= 1, got {args.cadence}")
    if args.probe_batch and not args.from_npz:
        check_replay_fits(args, max(int(x) for x in str(args.probe_batch).split(",")))
    out_dir = Path(args.out) / f"{args.task}-{dt.datetime.now().strftime('%Y-%m-%d-%H%M')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.from_npz:
        checkpoints = [_load_npz(Path(p)) for p in args.from_npz]
        meta = dict(checkpoints[0]["meta"]) | {"replayed_from": [str(p) for p in args.from_npz]}
    else:
        checkpoints, meta = _sample_checkpoints(args, at, out_dir)
    p_run = sorted({int(x) for x in str(args.probe_batch).split(",")}) if args.probe_batch else \
        sorted({int(meta["probe_batch"]), 8})
    rng = np.random.default_rng(args.seed)
    report: dict[str, Any] = {"meta": meta | {"sizes": sizes, "replay_probe_batches": p_run,
                                              "replay_cadence": args.cadence, "split": args.split,
                                              "split_seed": args.seed},
                              "checkpoints": []}
    for ck in checkpoints:
        report["checkpoints"].append(measure_checkpoint(ck["h"], ck["candidates"], ck["horizon"], ck["threshold"],
                                                        sizes=sizes, draws=args.draws, r=args.update_rollouts,
                                                        p_run=p_run, audits=args.replay_audits,
                                                        runs=args.replay_runs, rng=rng, lengths=ck.get("lengths"),
                                                        split=args.split, split_seed=args.seed,
                                                        initial=args.initial or ck.get("meta", meta).get("initial"),
                                                        cadence=args.cadence,
                                                        # pools saved before S was recorded: the suite's S = 5
                                                        max_age=ck.get("meta", meta).get("staleness_limit", 5))
                                     | {"step": ck["step"], "pool": ck["pool"], "label": _label(ck, checkpoints),
                                        "trained_windows": ck.get("trained_windows", [])})
    cases = [f | {"where": ck["label"] + (f", fold {i + 1}" if len(ck["folds"]) > 1 else "")}
             for ck in report["checkpoints"] for i, f in enumerate(ck["folds"])]
    report["goals"] = [g for r in RULES for g in goals(cases, r.name)]
    (out_dir / "truth.json").write_text(json.dumps(report, indent=2))
    text = truth_markdown(report)
    (out_dir / "truth.md").write_text(text)
    Console(width=300).print(text, markup=False)
    log.info("audit truth written to %s", out_dir)
    return 0


def measure_checkpoint(h: np.ndarray, candidates: Sequence[int], horizon: int, threshold: float, *,
                       sizes: Sequence[int], draws: int, r: int, p_run: Sequence[int], audits: int, runs: int,
                       rng: np.random.Generator, lengths: np.ndarray | None = None, split: str = "half",
                       split_seed: int = 0, rules: Sequence[Rule] = RULES, initial: int | None = None,
                       cadence: int = 1, max_age: int | None = None) -> dict[str, Any]:
    """Every table row of one checkpoint from its (N, K+1, N, K+1) cross Gram (and the samples' response lengths,
    (N,), where known): the whole pool's readings, then one held-out fold per half that defines the truth."""
    from adwin.audit import truth

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    cands = [int(c) for c in candidates]
    pop = truth.population_interval(h, cands)
    floor = truth.noise_floor(truth.per_sample_grams(h), len(cands))
    scale, d_eff = truth.noise_scale(h)
    readings = {int(p): truth.readings_at(h, cands, int(p), threshold=threshold, draws=draws, rng=rng)
                for p in sizes if int(p) <= h.shape[0]}
    update = truth.update_view(h, cands, r, draws=max(20, draws // 4), rng=rng)
    z = truth.signal_z(h)
    seen = z >= truth.IDENTIFIABLE_Z  # else no window is the truth's: the replay lists its decisions only
    window = truth.truth_window({c: v[0] for c, v in pop.items()}, cands, horizon, threshold) if seen else None
    sure = truth.truth_window({c: v[1] for c, v in pop.items()}, cands, horizon, threshold) if seen else None
    halves = truth.split_pool(h.shape[0], seed=split_seed)
    folds = [held_out(h, cands, horizon, threshold, truth_idx=t, replay_idx=rp, p_run=p_run, audits=audits,
                      runs=runs, rng=rng, lengths=lengths, rules=rules, initial=initial, cadence=cadence,
                      max_age=max_age)
             for t, rp in ([halves] if split == "half" else [halves, halves[::-1]])]
    return {
        "candidates": cands, "horizon": int(horizon), "threshold": float(threshold),
        "population": {str(c): list(v) for c, v in pop.items()},
        "noise_floor": {str(c): float(v) for c, v in zip(cands, floor, strict=True)},
        "token_floor": None if lengths is None else
        {str(c): float(v) for c, v in zip(cands, truth.token_floor(lengths, cands), strict=True)},
        "noise_scale": scale, "effective_dim": d_eff, "signal_z": z,
        "readings": {str(p): {est: [asdict(x) for x in xs] for est, xs in by.items()} for p, by in readings.items()},
        "update_view": {"R": r, **{str(c): v for c, v in zip([*cands, "full"], update, strict=True)}},
        "truth_window": window, "surely_admissible_window": sure, "replay_initial": initial, "folds": folds,
    }


def _update(ck: Mapping[str, Any], key: str) -> str:
    """The update view's cosine, n/a where the pool has no population full gradient to compare with."""
    return "n/a" if ck["truth_window"] is None else f"{ck['update_view'][key]:.2f}"


def truth_markdown(report: Mapping[str, Any]) -> str:
    """The tables, one section per checkpoint, then the goals."""
    from adwin.audit import truth
    from adwin.bench.audit_report import fold_markdown, goals_markdown

    meta = report["meta"]
    split = meta.get("split", "half")
    lines = [f"# Audit truth: {meta.get('task')} (commit {meta.get('commit')}, {meta.get('date')})", "",
             f"`{meta.get('command')}`", "", f"Models: {meta.get('models', 'not recorded')}; CPU capability "
             f"{meta.get('cpu_capability', 'not recorded')}", "",
             f"Validation: the truth is read from one half of each pool and the rules are replayed on audits drawn from "
             f"the other (`--split {split}`, seed {meta.get('split_seed')}"
             + ("; and again with the halves swapped" if split == "cross" else "") + "). Shares are of decisions, "
             "[90 % interval] over the replayed runs, taking the held-out truth as given.", "",
             f"Trajectory: checkpoints reached by `{meta.get('trajectory', 'full')}` training (seed "
             f"{meta.get('seed')}).", ""]
    for ck in report["checkpoints"]:
        cands, tau = ck["candidates"], ck["threshold"]
        pool = ck["pool"]
        if ck["truth_window"] is None:
            verdict = (f"**Truth's window: not identifiable**: the pool does not measure the full gradient's mean (its "
                       f"signal z {ck['signal_z']:.1f} over {pool['rollouts']} rollouts is below "
                       f"{truth.IDENTIFIABLE_Z:g}: the noise scale is beyond the pool), so no population cosine tells an "
                       "admissible window; a larger pool (--rollouts) may resolve it.")
        else:
            verdict = (f"**Truth's window (whole pool): {ck['truth_window']}** (surely admissible: "
                       f"{ck['surely_admissible_window']}).")
        label = ck.get("label") or f"step {ck['step']}"
        lines += [f"## {label[0].upper() + label[1:]}: {pool['rollouts']} full rollouts, mean {pool['mean_len']:.0f} tokens, "
                  f"{100 * pool['at_horizon']:.0f} % at the horizon", "",
                  f"Noise scale tr(Sigma)/|mu|^2 {ck['noise_scale']:.1f}, effective dimension "
                  f"{ck['effective_dim']:.0f}. {verdict}", ""]
        lines += trained_windows_line(ck)
        sizes = list(ck["readings"])
        tokens = ck.get("token_floor")
        head = ["window", "population cosine [90 %]", "pure-noise reading"] + (["token reading"] if tokens else [])
        head += [f"{est} P={p}: mean [10-90 %] (>= {tau})" for p in sizes for est in ("batch", "debiased")]
        head += [f"R={ck['update_view']['R']} update vs population full"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for i, c in enumerate(cands):
            pc, lo, hi = ck["population"][str(c)]
            row = [f"{c:,}", f"{pc:.2f} [{lo:.2f}, {hi:.2f}]", f"{ck['noise_floor'][str(c)]:.2f}"]
            row += [f"{tokens[str(c)]:.2f}"] if tokens else []
            for p in sizes:
                for est in ("batch", "debiased"):
                    x = ck["readings"][p][est][i]
                    fb = f", fb {100 * x['fallbacks']:.0f} %" if est == "debiased" and x["fallbacks"] else ""
                    row.append(f"{x['mean']:.2f} [{x['q10']:.2f}, {x['q90']:.2f}] ({100 * x['share_admissible']:.0f} %{fb})")
            row.append(_update(ck, str(c)))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("| full | " + " | " * (len(head) - 2) + f"{_update(ck, 'full')} |")
        for i, fold in enumerate(ck["folds"]):
            lines += fold_markdown(fold, cands, i, len(ck["folds"]))
        lines.append("")
    lines += goals_markdown(report.get("goals", []), shipped_rule(str(meta.get("task"))))
    return "\n".join(lines)


def combine(args: argparse.Namespace) -> int:
    """``--combine``: the goals over every checkpoint of several reports, each named by its seed, and the share of
    the trajectories' training steps that ran below their checkpoint's truth (the whole pool's)."""
    from rich.console import Console

    from adwin.bench.audit_report import goals_markdown
    from adwin.bench.audit_scores import goals

    reports = [json.loads(Path(p).read_text()) for p in args.combine]
    cases, below, judged, lines = [], 0, 0, []
    for r in reports:
        for ck in r["checkpoints"]:
            # a report replayed from several seeds' pools already names each checkpoint's seed in its label
            label = ck.get("label", "")
            where = label if label.startswith("seed ") else f"seed {r['meta'].get('seed')}, step {ck['step']}"
            cases += [f | {"where": where + (f", fold {i + 1}" if len(ck["folds"]) > 1 else "")}
                      for i, f in enumerate(ck["folds"])]
            won, under = trained_below(ck)
            if under is not None:
                judged += len(won)
                below += under
    rules = list(dict.fromkeys(name for c in cases for p in c["replay"].values() for name in p
                               if name in {r.name for r in RULES}))
    combined = [g for rule in rules for g in goals(cases, rule)]
    meta = reports[0]["meta"]
    lines += [f"# Audit truth, combined: {meta.get('task')} ({len(reports)} reports, {len(cases)} checkpoint folds)", "",
              "Reports: " + ", ".join(f"`{p}` (seed {r['meta'].get('seed')}, commit {r['meta'].get('commit')}, "
                                      f"trajectory {r['meta'].get('trajectory', 'full')})"
                                      for p, r in zip(args.combine, reports, strict=True)), ""]
    if judged:
        lines += [f"The runs' own windows, the 5 steps before each checkpoint with a truth: below the truth's window "
                  f"on {below} of {judged} steps ({100 * below / judged:.0f} %).", ""]
    lines += goals_markdown(combined, shipped_rule(str(meta.get("task"))))
    text = "\n".join(lines)
    out_dir = Path(args.out) / f"{meta.get('task')}-combined-{dt.datetime.now().strftime('%Y-%m-%d-%H%M')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "combined.json").write_text(json.dumps({"reports": list(args.combine), "goals": combined,
                                                       "trained_below": below, "trained_judged": judged}, indent=2))
    (out_dir / "combined.md").write_text(text)
    Console(width=300).print(text, markup=False)
    return 0


def trained_below(ck: Mapping[str, Any], last: int = 5) -> tuple[list[int], int | None]:
    """The windows of the ``last`` training steps before the checkpoint, and how many lie below its truth's window
    (None where the pool has no truth or the run recorded no windows)."""
    won = [int(w) for w in ck.get("trained_windows", [])][-last:]
    if not won or ck.get("truth_window") is None:
        return won, None
    return won, sum(w < int(ck["truth_window"]) for w in won)


def trained_windows_line(ck: Mapping[str, Any], last: int = 5) -> list[str]:
    """What the trajectory's own run chose in the ``last`` steps that led to the checkpoint, against its truth: the
    on-trajectory reading of an adaptive method's decisions (full OPD always trains at the horizon)."""
    won, below = trained_below(ck, last)
    if not won:
        return []
    text = f"Windows the run trained under in its last {len(won)} steps: {', '.join(f'{w:,}' for w in won)}"
    if below is not None:
        text += f"; below the truth's window on {below} of {len(won)}"
    return [text + ".", ""]


# ---------------------------------------------------------------------------------------------
# Pools: sample, score, per-sample sketches, cross Gram
# ---------------------------------------------------------------------------------------------


def _label(ck: Mapping[str, Any], checkpoints: Sequence[Mapping[str, Any]]) -> str:
    """``step N``; ``seed S, step N`` where the replayed pools come from runs of several training seeds."""
    seeds = {c.get("meta", {}).get("seed") for c in checkpoints}
    return (f"seed {ck.get('meta', {}).get('seed')}, " if len(seeds) > 1 else "") + f"step {ck['step']}"


def _steps(text: str) -> list[int]:
    steps = sorted({int(s) for s in str(text).split(",") if s.strip()})
    if not steps or steps[0] < 0:
        raise ValueError(f"--at must list steps >= 0, got {text!r}")
    return steps


def check_replay_fits(args: argparse.Namespace, most: int) -> None:
    """Refuse, before any rollout, a replay whose audits of up to ``most`` probes need more distinct rollouts than
    the replay's half of the pool holds."""
    if args.replay_audits * most > args.rollouts // 2:
        raise ValueError(f"--replay-audits {args.replay_audits} of up to {most} probes need "
                         f"{args.replay_audits * most} distinct rollouts in the replay's half of the pool; "
                         f"--rollouts {args.rollouts} gives it {args.rollouts // 2}: raise --rollouts or lower "
                         "--replay-audits or --probe-batch")


def _sample_checkpoints(args: argparse.Namespace, at: list[int], out_dir: Path) -> tuple[list[dict], dict]:
    import torch

    from adwin.bench.compare.command import command_line, git_commit, load_run_parts
    from adwin.bench.compare.curve import CurveStop, curve_config
    from adwin.controller import Controller
    from adwin.loop.trainer import train

    curve_args = argparse.Namespace(task=args.task, profile=args.profile, config=args.config, set=args.set,
                                    max_steps=max(at[-1], 1), eval_every=10**6, confirm=1, budget_min=1e9,
                                    seed=args.seed, assets_seed=args.assets_seed, method=args.trajectory)
    cfg = curve_config(curve_args)
    cfg = cfg.model_copy(update={"name": args.trajectory, "out_dir": str(out_dir / "runs")})
    if not args.probe_batch:  # the replay's default P, the run's and 8, is known once the config is: check it now
        check_replay_fits(args, max(int(cfg.probes.batch_size), 8))
    meta = {"command": command_line(), "task": args.task, "profile": args.profile, "commit": git_commit(),
            "date": dt.datetime.now().isoformat(timespec="seconds"), "horizon": cfg.rollout.max_response_len,
            "candidates": list(cfg.window.candidates), "threshold": float(cfg.window.threshold),
            "probe_batch": int(cfg.probes.batch_size), "initial": cfg.window.initial,
            "staleness_limit": int(cfg.probes.staleness_limit), "rollouts_per_step": cfg.rollout.prompts_per_step
            * cfg.rollout.samples_per_prompt, "lr": cfg.optim.lr, "seed": args.seed, "cpus": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "trajectory": args.trajectory}
    parts = load_run_parts(cfg, args.profile, args.assets_seed)
    meta["models"] = parts.models
    checkpoints: list[dict] = []
    windows: list[int] = []  # the window each training step ran under: the trajectory's own decisions

    def take(step: int) -> None:
        ck = _checkpoint(parts, cfg, args, step) | {"trained_windows": list(windows)}
        np.savez_compressed(out_dir / f"gram-{step}.npz", h=ck["h"], lengths=ck["lengths"], meta=json.dumps(
            meta | {k: v for k, v in ck.items() if k not in ("h", "lengths")}))
        checkpoints.append(ck)

    if at[0] == 0:
        take(0)
    later = [s for s in at if s > 0]
    if later:
        def on_step(t: int, m: Mapping[str, Any]) -> None:
            windows.append(int(m.get("window/current", cfg.rollout.max_response_len)))
            if t + 1 in later:  # after the optimizer step of step t: t + 1 steps of training
                take(t + 1)
            if t + 1 >= later[-1]:
                raise CurveStop("last checkpoint")

        controller = Controller()
        try:
            train(cfg.model_copy(update={"steps": later[-1]}), controller, parts, on_step=on_step)
        except CurveStop:
            pass
        finally:
            controller.close()
    return checkpoints, meta


def _checkpoint(parts: Any, cfg: Any, args: argparse.Namespace, step: int) -> dict[str, Any]:
    import time

    import torch

    from adwin.audit.alignment import ProbeBatch, audit
    from adwin.audit.estimators import cross_gram
    from adwin.loop.sampler import Sampler

    t0 = time.perf_counter()
    horizon, cands = int(cfg.rollout.max_response_len), [int(c) for c in cfg.window.candidates]
    torch.manual_seed(args.seed * 7919 + step)
    sampler = Sampler(parts, cfg)
    vectors, lens = [], []
    chunk = 32  # rollouts sampled, scored and differentiated at a time: memory stays that of one step
    for start in range(0, args.rollouts, chunk):
        n = min(chunk, args.rollouts - start)
        b = sampler.roll_out(parts.train_prompts.next_batch(n), 1, horizon)
        rows = b.rows
        teacher = parts.teachers.score(rows.input_ids, rows.attention_mask, [q.route for q in b.prompts])  # (B, L)
        pb = ProbeBatch(rows.input_ids, rows.attention_mask, rows.response_mask, teacher)
        # the audit's own per-sample pass; its interval (ci_level) is what makes it keep each sample's sketch
        vecs = audit(parts.student, pb, cands, sketch_dim=args.sketch_dim, seed=args.seed, macro=False,
                     ci_level=0.9, ci_samples=10).vectors  # (n, K+1, sketch_dim)
        vectors.append(vecs)
        lens += rows.response_mask.sum(1).tolist()
        log.info("step %d: %d of %d rollouts pooled (%.0f s)", step, start + n, args.rollouts,
                 time.perf_counter() - t0)
    h = cross_gram(np.concatenate(vectors))  # (N, K+1, N, K+1)
    lens_a = np.asarray(lens, dtype=float)
    pool = {"rollouts": len(lens), "mean_len": float(lens_a.mean()),
            "at_horizon": float((lens_a >= horizon).mean()), "seconds": time.perf_counter() - t0}
    return {"step": step, "h": h, "lengths": lens_a, "candidates": cands, "horizon": horizon,
            "threshold": float(cfg.window.threshold), "pool": pool}


def _load_npz(path: Path) -> dict[str, Any]:
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        # pools saved before the response lengths were: the noise-reading rule reads same-sample energies
        lengths = z["lengths"] if "lengths" in z.files else None
        return {"h": z["h"], "lengths": lengths, "step": int(meta["step"]), "candidates": meta["candidates"],
                "horizon": int(meta["horizon"]), "threshold": float(meta["threshold"]), "pool": meta["pool"],
                "trained_windows": meta.get("trained_windows", []), "meta": meta}
