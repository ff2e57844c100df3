"""``adwin bench audit-truth``: what the gradients say about each candidate window at a checkpoint, and whether
ADWIN's online rule finds it.

At each checkpoint (``--at``: the prepared student is step 0; later steps are reached by full-rollout OPD with the
suite's settings for the task, as ``adwin bench curve`` trains) the bench samples a pool of ``--rollouts`` full
rollouts, computes every sample's CountSketched segment gradients once (the audit's own per-sample pass,
``adwin.audit.grams.chunked_grams``) and reads everything from their cross Gram (``adwin.audit.truth``):

- per candidate: the population cosine with its interval, the pure-noise reading ``sqrt(N_w / N_F)``, what the
  batch and debiased estimators read at ``P`` = ``--sizes`` (mean, 10-90 %, share >= the threshold, debiased
  fallbacks), and the cosine of an ``R``-rollout update with the population full gradient;
- the full gradient's noise scale and effective dimension;
- the truth's window (the shortest candidate whose population cosine reaches the threshold, else the horizon);
- the replay: ADWIN's online rule, in each variant (``RULES``), run on ``--replay-audits`` audits of the run's
  ``P`` drawn from the pool, ``--replay-runs`` times: the share of its decisions within one rung of the truth.

Launch: ``adwin bench audit-truth --task chain-long --at 0,10,20``. Writes ``OUT/<task>-<date>/truth.md`` (the
tables), ``truth.json`` and each checkpoint's cross Gram (``gram-<step>.npz``; ``--from-npz`` replays from it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """One variant of the online rule, as a run's config would set it."""

    name: str
    estimator: str  # audit.estimator
    confidence: bool  # window.confidence
    noise_hold: bool = False  # window.noise_hold
    grow_to: str = "sure"  # window.grow_to
    signal_z: float = 3.0  # window.signal_z
    pool: int = 1  # audit.evidence_audits
    decay: float = 0.7  # audit.evidence_decay


RULES: tuple[Rule, ...] = (
    Rule("paper (batch, point)", "batch", confidence=False),
    Rule("batch, point, 4 audits pooled", "batch", confidence=False, pool=4),
    Rule("batch, point, 8 audits pooled (decay 0.9)", "batch", confidence=False, pool=8, decay=0.9),
    Rule("debiased, point", "debiased", confidence=False),
    Rule("batch, confidence", "batch", confidence=True),
    Rule("debiased, confidence", "debiased", confidence=True),
    Rule("batch, confidence, noise hold", "batch", confidence=True, noise_hold=True),
    Rule("debiased, confidence, noise hold", "debiased", confidence=True, noise_hold=True),
    Rule("debiased, confidence, noise hold, grow to point", "debiased", confidence=True, noise_hold=True,
         grow_to="point"),
    Rule("debiased, confidence, noise hold, 4 audits pooled", "debiased", confidence=True, noise_hold=True, pool=4),
    Rule("batch, confidence, noise hold, 4 audits pooled", "batch", confidence=True, noise_hold=True, pool=4),
    Rule("debiased, confidence, noise hold, 8 audits pooled", "debiased", confidence=True, noise_hold=True, pool=8,
         decay=0.9),
    Rule("debiased, confidence, noise hold (z >= 2), 8 audits pooled", "debiased", confidence=True,
         noise_hold=True, signal_z=2.0, pool=8, decay=0.9),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default="chain-long", help="built-in task (default chain-long)")
    p.add_argument("--at", default="0", help="checkpoints: steps of full-rollout OPD, comma-separated (default 0)")
    p.add_argument("--rollouts", type=int, default=256, help="full rollouts in each checkpoint's pool (default 256)")
    p.add_argument("--sizes", default="2,8,32,64", help="probe batch sizes P the estimators are read at")
    p.add_argument("--draws", type=int, default=200, help="random probe batches per P (default 200)")
    p.add_argument("--update-rollouts", type=int, default=32, help="R of the update view (default 32)")
    p.add_argument("--probe-batch", default=None, help="the replay's P, comma-separated (default: the run's and 8)")
    p.add_argument("--replay-audits", type=int, default=12, help="audits per replayed run (default 12)")
    p.add_argument("--replay-runs", type=int, default=40, help="replayed runs per rule (default 40)")
    p.add_argument("--cadence", type=int, default=1, help="the replay's steps between audits (default 1): a pooled "
                   "audit's age, for its decay and the staleness limit")
    p.add_argument("--initial", type=int, default=None,
                   help="the replay's window before its first audit (default: the run's window.initial, saved with "
                        "each pool; else the largest candidate)")
    p.add_argument("--sketch-dim", type=int, default=16384, help="CountSketch dimension (default 16384)")
    p.add_argument("--profile", choices=("default", "tiny"), default="default", help="built-in task models")
    p.add_argument("--config", metavar="YAML", default=None, help="base config (default: the suite's preset)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="training and sampling seed")
    p.add_argument("--assets-seed", type=int, default=0, help="which prepared built-in models to use")
    p.add_argument("--out", default="bench/audit-truth", help="results go to OUT/<task>-<date>/")
    p.add_argument("--from-npz", nargs="+", default=None, metavar="NPZ",
                   help="replay saved checkpoints (gram-<step>.npz) instead of sampling new pools")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    at = _steps(args.at)
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    if args.rollouts < max(sizes + [args.update_rollouts + 2]):
        raise ValueError(f"--rollouts {args.rollouts} must cover the largest P ({max(sizes)}) and "
                         f"--update-rollouts + 2 ({args.update_rollouts + 2})")
    if args.cadence < 1:
        raise ValueError(f"--cadence must be >= 1, got {args.cadence}")
    if args.probe_batch:
        most = max(int(x) for x in str(args.probe_batch).split(","))
        if args.replay_audits * most > args.rollouts:
            raise ValueError(f"--replay-audits {args.replay_audits} of up to {most} probes need "
                             f"{args.replay_audits * most} distinct rollouts; --rollouts is {args.rollouts}")
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
    report = {"meta": meta | {"sizes": sizes, "replay_probe_batches": p_run, "replay_cadence": args.cadence},
              "checkpoints": []}
    for ck in checkpoints:
        report["checkpoints"].append(measure_checkpoint(ck["h"], ck["candidates"], ck["horizon"], ck["threshold"],
                                                        sizes=sizes, draws=args.draws, r=args.update_rollouts,
                                                        p_run=p_run, audits=args.replay_audits,
                                                        runs=args.replay_runs, rng=rng,
                                                        initial=args.initial or ck.get("meta", meta).get("initial"),
                                                        cadence=args.cadence,
                                                        # pools saved before S was recorded: the suite's S = 5
                                                        max_age=ck.get("meta", meta).get("staleness_limit", 5))
                                     | {"step": ck["step"], "pool": ck["pool"]})
    (out_dir / "truth.json").write_text(json.dumps(report, indent=2))
    text = truth_markdown(report)
    (out_dir / "truth.md").write_text(text)
    Console(width=300).print(text, markup=False)
    log.info("audit truth written to %s", out_dir)
    return 0


def measure_checkpoint(h: np.ndarray, candidates: Sequence[int], horizon: int, threshold: float, *,
                       sizes: Sequence[int], draws: int, r: int, p_run: Sequence[int], audits: int, runs: int,
                       rng: np.random.Generator, initial: int | None = None, cadence: int = 1,
                       max_age: int | None = None) -> dict[str, Any]:
    """Every table row of one checkpoint from its (N, K+1, N, K+1) cross Gram."""
    from adwin.audit import truth

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
    return {
        "candidates": cands, "horizon": int(horizon), "threshold": float(threshold),
        "population": {str(c): list(v) for c, v in pop.items()},
        "noise_floor": {str(c): float(v) for c, v in zip(cands, floor, strict=True)},
        "noise_scale": scale, "effective_dim": d_eff, "signal_z": z,
        "readings": {str(p): {est: [asdict(x) for x in xs] for est, xs in by.items()} for p, by in readings.items()},
        "update_view": {"R": r, **{str(c): v for c, v in zip([*cands, "full"], update, strict=True)}},
        "truth_window": window, "surely_admissible_window": sure, "replay_initial": initial,
        "replay": {str(p): {rule.name: replay(h, cands, horizon, threshold, rule, p=p, audits=audits, runs=runs,
                                              truth_window=window, rng=rng, initial=initial, cadence=cadence,
                                              max_age=max_age) for rule in RULES}
                   for p in p_run},
    }


def replay(h: np.ndarray, candidates: Sequence[int], horizon: int, threshold: float, rule: Rule, *, p: int,
           audits: int, runs: int, truth_window: int | None, rng: np.random.Generator, cadence: int = 1,
           level: float = 0.9, initial: int | None = None, max_age: int | None = None) -> dict[str, Any]:
    """``runs`` runs of ``audits`` audits of ``p`` probes drawn from the pool (the weights held fixed, so the right
    window never moves; within a run no sample is drawn twice): ADWIN's policy with ``rule``'s settings decides
    after each, on the estimators the product computes (``adwin.audit.evidence``; a pooled rule weights the last
    ``rule.pool`` audits' samples by ``rule.decay ** age``, ``cadence`` steps between audits, none older than
    ``max_age`` steps: the staleness limit the product's pool keeps to). Returns the share of
    decisions within one rung of ``truth_window``, exactly on it, and the windows chosen (None shares where the
    pool has no truth, ``truth_window`` None)."""
    from adwin.audit import truth
    from adwin.audit.evidence import evidence_of_gram
    from adwin.policies.adaptive import AdaptiveWindow

    cands, n = list(candidates), h.shape[0]
    if audits * p > n:
        raise ValueError(f"{audits} audits of {p} probes need {audits * p} distinct samples; the pool has {n}")
    target = truth.rung(truth_window, cands, horizon) if truth_window is not None else None
    near = exact = late = 0
    chosen: dict[int, int] = {}
    for _ in range(runs):
        policy = AdaptiveWindow(cands, threshold=threshold, max_len=horizon, initial=initial, confidence=rule.confidence,
                                noise_hold=rule.noise_hold, grow_to=rule.grow_to, signal_z=rule.signal_z)
        order = rng.permutation(n)
        for a in range(audits):
            first = max(0, a - rule.pool + 1)
            if max_age is not None:  # the product drops an audit older than the staleness limit from the pool
                first = max(first, a - max_age // cadence)
            idx = order[first * p:(a + 1) * p]
            ages = cadence * (a - np.arange(first, a + 1))  # (audits pooled,)
            weights = np.repeat(rule.decay ** ages.astype(float), p)  # (m,): decay ** age per sample
            sub = h[np.ix_(idx, np.arange(len(cands) + 1), idx, np.arange(len(cands) + 1))]  # (m, K+1, m, K+1)
            sub = sub * weights[:, None, None, None] * weights[None, None, :, None]
            ev = evidence_of_gram(sub, cands, estimator=rule.estimator, level=level if rule.confidence else None,
                                  n_boot=100, seed=int(rng.integers(1 << 30)))
            policy.observe(_Audit(ev.cosines, ev.cosine_ci, ev.noise_floor, ev.signal_z))
            w = policy.window(0)
            r = truth.rung(w, cands, horizon)
            if target is not None:
                near += abs(r - target) <= 1
                exact += r == target
                late += a >= audits // 2 and abs(r - target) <= 1
            chosen[w] = chosen.get(w, 0) + 1
    total, known = runs * audits, target is not None
    return {"within_one_rung": near / total if known else None, "exact": exact / total if known else None,
            "decisions": total, "probe_batch": p,
            "within_one_rung_late": late / (runs * (audits - audits // 2)) if known else None,
            "pooled_audits": rule.pool, "windows": {str(w): c / total for w, c in sorted(chosen.items())}}


@dataclass
class _Audit:
    cosines: Mapping[int, float]
    cosine_ci: Mapping[int, tuple[float, float]]
    noise_floor: Mapping[int, float]
    signal_z: float


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _update(ck: Mapping[str, Any], key: str) -> str:
    """The update view's cosine, n/a where the pool has no population full gradient to compare with."""
    return "n/a" if ck["truth_window"] is None else f"{ck['update_view'][key]:.2f}"


def truth_markdown(report: Mapping[str, Any]) -> str:
    """The tables, one section per checkpoint."""
    from adwin.audit import truth

    meta = report["meta"]
    lines = [f"# Audit truth: {meta.get('task')} (commit {meta.get('commit')}, {meta.get('date')})", "",
             f"`{meta.get('command')}`", "", f"Models: {meta.get('models', 'not recorded')}; CPU capability "
             f"{meta.get('cpu_capability', 'not recorded')}", ""]
    for ck in report["checkpoints"]:
        cands, tau = ck["candidates"], ck["threshold"]
        pool = ck["pool"]
        if ck["truth_window"] is None:
            verdict = (f"**Truth's window: not identifiable**: the pool does not measure the full gradient's mean (its "
                       f"signal z {ck['signal_z']:.1f} over {pool['rollouts']} rollouts is below {truth.IDENTIFIABLE_Z:g}: the noise scale is "
                       "beyond the pool), so no population cosine tells an admissible window; a larger pool "
                       "(--rollouts) may resolve it. The replay lists the windows chosen only.")
        else:
            verdict = (f"**Truth's window: {ck['truth_window']}** (surely admissible: "
                       f"{ck['surely_admissible_window']}).")
        lines += [f"## Step {ck['step']}: {pool['rollouts']} full rollouts, mean {pool['mean_len']:.0f} tokens, "
                  f"{100 * pool['at_horizon']:.0f} % at the horizon", "",
                  f"Noise scale tr(Sigma)/|mu|^2 {ck['noise_scale']:.1f}, effective dimension "
                  f"{ck['effective_dim']:.0f}. {verdict}", ""]
        sizes = list(ck["readings"])
        head = ["window", "population cosine [90 %]", "pure-noise reading"]
        head += [f"{est} P={p}: mean [10-90 %] (>= {tau})" for p in sizes for est in ("batch", "debiased")]
        head += [f"R={ck['update_view']['R']} update vs population full"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for i, c in enumerate(cands):
            pc, lo, hi = ck["population"][str(c)]
            row = [f"{c:,}", f"{pc:.2f} [{lo:.2f}, {hi:.2f}]", f"{ck['noise_floor'][str(c)]:.2f}"]
            for p in sizes:
                for est in ("batch", "debiased"):
                    x = ck["readings"][p][est][i]
                    fb = f", fb {100 * x['fallbacks']:.0f} %" if est == "debiased" and x["fallbacks"] else ""
                    row.append(f"{x['mean']:.2f} [{x['q10']:.2f}, {x['q90']:.2f}] ({100 * x['share_admissible']:.0f} %{fb})")
            row.append(_update(ck, str(c)))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("| full | | | " + " | " * (2 * len(sizes)) + f"{_update(ck, 'full')} |")
        for p, rules in ck["replay"].items():
            target = "no truth" if ck["truth_window"] is None else f"truth's window {ck['truth_window']}"
            lines += ["", f"Replay at P = {p}, {target}:", "",
                      "| rule | within one rung | exactly | within one rung, later half | windows chosen (share) |",
                      "|---|---|---|---|---|"]
            for name, r in rules.items():
                ws = ", ".join(f"{w}: {100 * s:.0f} %" for w, s in r["windows"].items())
                lines.append(f"| {name} | {_share(r['within_one_rung'])} | {_share(r['exact'])} | "
                             f"{_share(r['within_one_rung_late'])} | {ws} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Pools: sample, score, per-sample sketches, cross Gram
# ---------------------------------------------------------------------------------------------


def _steps(text: str) -> list[int]:
    steps = sorted({int(s) for s in str(text).split(",") if s.strip()})
    if not steps or steps[0] < 0:
        raise ValueError(f"--at must list steps >= 0, got {text!r}")
    return steps


def _sample_checkpoints(args: argparse.Namespace, at: list[int], out_dir: Path) -> tuple[list[dict], dict]:
    import torch

    from adwin.bench.compare.command import command_line, git_commit, load_run_parts
    from adwin.bench.compare.curve import CurveStop, curve_config
    from adwin.controller import Controller
    from adwin.loop.trainer import train

    curve_args = argparse.Namespace(task=args.task, profile=args.profile, config=args.config, set=args.set,
                                    max_steps=max(at[-1], 1), eval_every=10**6, confirm=1, budget_min=1e9,
                                    seed=args.seed, assets_seed=args.assets_seed)
    cfg = curve_config(curve_args)
    cfg = cfg.model_copy(update={"name": "full", "out_dir": str(out_dir / "runs")})
    meta = {"command": command_line(), "task": args.task, "profile": args.profile, "commit": git_commit(),
            "date": dt.datetime.now().isoformat(timespec="seconds"), "horizon": cfg.rollout.max_response_len,
            "candidates": list(cfg.window.candidates), "threshold": float(cfg.window.threshold),
            "probe_batch": int(cfg.probes.batch_size), "initial": cfg.window.initial,
            "staleness_limit": int(cfg.probes.staleness_limit), "rollouts_per_step": cfg.rollout.prompts_per_step
            * cfg.rollout.samples_per_prompt, "lr": cfg.optim.lr, "seed": args.seed, "cpus": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    parts = load_run_parts(cfg, args.profile, args.assets_seed)
    meta["models"] = parts.models
    checkpoints: list[dict] = []

    def take(step: int) -> None:
        ck = _checkpoint(parts, cfg, args, step)
        np.savez_compressed(out_dir / f"gram-{step}.npz", h=ck["h"], meta=json.dumps(
            meta | {k: v for k, v in ck.items() if k != "h"}))
        checkpoints.append(ck)

    if at[0] == 0:
        take(0)
    later = [s for s in at if s > 0]
    if later:
        def on_step(t: int, _m: Mapping[str, Any]) -> None:
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
    return {"step": step, "h": h, "candidates": cands, "horizon": horizon,
            "threshold": float(cfg.window.threshold), "pool": pool}


def _load_npz(path: Path) -> dict[str, Any]:
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        return {"h": z["h"], "step": int(meta["step"]), "candidates": meta["candidates"],
                "horizon": int(meta["horizon"]), "threshold": float(meta["threshold"]), "pool": meta["pool"],
                "meta": meta}
