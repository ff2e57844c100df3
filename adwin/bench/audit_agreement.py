"""Does a cheaper or debiased audit change ADWIN's decisions? (issue 14, parts 2 and 4)

Three measurements, each on the same probe batches and the same weights:

- ``--what agreement``: the audit with ``params=all`` against ``top:N`` for every N below the model's block
  count: per N, the fraction of probe batches on which the window decision (the shortest candidate whose
  cosine clears the threshold, else the full horizon: ``AdaptiveWindow.decide``) is the same, the mean
  absolute cosine difference and the audit time relative to ``all``.
- ``--what vs-p``: batch and debiased cosines against the probe batch size P (random subsets of one pool of
  rollouts), mean and standard deviation per candidate, how often the debiased estimate fell back, and the
  time of each estimator.
- ``--what stability``: window decisions on ``--audits`` random probe batches of ``--probe-batch`` from one pool
  (the same weights, so the right window does not move and every change is sampling noise): changes per
  audit and the windows chosen by the point rule and by ``window.confidence`` at several ``audit.ci_level``.
- ``--what replay --replay metrics.jsonl``: a run's audits (``audit/micro_cos_<c>``) replayed through
  ``AuditSchedule`` for several ``audit.every`` / ``audit.skip_margin`` settings: audits saved and decisions
  that differ from auditing every batch (a skipped audit keeps the last decision).

Models: ``--model builtin`` is the built-in task's prepared student and teachers (``--profile``), rollouts
from ``configs/default.yaml``; ``--model qwen2`` / ``llama`` is a real architecture built in code (random
student; the teacher is the student with Gaussian noise on every weight, so their logprobs correlate as a
distilled pair's do), prompts of random tokens, responses sampled from the student.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--what", choices=("agreement", "vs-p", "stability", "replay"), default="agreement")
    p.add_argument("--model", choices=("builtin", "qwen2", "llama"), default="builtin")
    p.add_argument("--profile", choices=("default", "tiny"), default="default", help="built-in task assets")
    p.add_argument("--config", default="configs/default.yaml", help="rollout length, candidates, threshold")
    p.add_argument("--rollouts", type=int, default=96, help="full rollouts in the pool")
    p.add_argument("--probe-batch", type=int, default=8, help="P for agreement (the pool is split into batches)")
    p.add_argument("--sizes", default="8,16,32,64", help="probe batch sizes for vs-p")
    p.add_argument("--repeats", type=int, default=4, help="random subsets per size (vs-p)")
    p.add_argument("--audits", type=int, default=20, help="random probe batches for stability")
    p.add_argument("--levels", default="0.5,0.8,0.9", help="ci levels for stability")
    p.add_argument("--estimator", choices=("batch", "debiased"), default="batch", help="stability: the cosine")
    p.add_argument("--layers", type=int, default=6, help="code-built model: transformer blocks")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--response-len", type=int, default=192, help="code-built model: response tokens")
    p.add_argument("--teacher-noise", type=float, default=0.5, help="code-built teacher: noise std / weight std")
    p.add_argument("--replay", default=None, help="metrics.jsonl of a run (--what replay)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here as JSON")


def main(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.what == "replay":
        if not args.replay:
            raise ValueError("--what replay needs --replay PATH (a run's metrics.jsonl)")
        report = _replay(args)
    else:
        model, pool, cands, threshold, max_len = _pool(args)
        if args.what == "agreement":
            report = _agreement(model, pool, cands, threshold, max_len, args)
        elif args.what == "stability":
            report = _stability(model, pool, cands, threshold, max_len, args)
        else:
            report = _vs_p(model, pool, cands, args)
    sys.stdout.write(report.pop("table") + "\n")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return 0


# ---------------------------------------------------------------------------------------------
# Probe pools
# ---------------------------------------------------------------------------------------------


def _pool(args: argparse.Namespace) -> tuple[Any, Any, list[int], float, int]:
    """(student, full probe batch of ``--rollouts`` rows, candidates, threshold, max response length)."""
    from adwin.config import load_config

    cfg = load_config(args.config)
    cands, threshold = list(cfg.window.candidates), float(cfg.window.threshold)
    t0 = time.perf_counter()
    if args.model == "builtin":
        model, pool = _builtin_pool(cfg, args)
        max_len = cfg.rollout.max_response_len
    else:
        model, pool = _code_pool(args)
        max_len = args.response_len
        cands = [c for c in cands if c < max_len] or [max_len // 4, max_len // 2]
    lens = pool.response_mask.sum(1).float()
    log.info("pool: %d rollouts, mean %.0f response tokens, %.1f s", len(lens), float(lens.mean()),
             time.perf_counter() - t0)
    return model, pool, cands, threshold, max_len


def _builtin_pool(cfg: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    from adwin.audit.alignment import ProbeBatch
    from adwin.loop.parts import load_parts
    from adwin.loop.sampler import Sampler

    parts = load_parts(cfg, profile=args.profile)
    b = Sampler(parts, cfg).roll_out(parts.train_prompts.next_batch(args.rollouts), 1, cfg.rollout.max_response_len)
    rows = b.rows
    teacher = parts.teachers.score(rows.input_ids, rows.attention_mask, [p.route for p in b.prompts])  # (B, L)
    return parts.student, ProbeBatch(rows.input_ids, rows.attention_mask, rows.response_mask, teacher)


def _code_pool(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from adwin.audit.alignment import ProbeBatch
    from adwin.teacher.scoring import score_rows

    shape = {"vocab_size": args.vocab, "hidden_size": args.hidden, "intermediate_size": 3 * args.hidden,
             "num_hidden_layers": args.layers, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 16 + args.response_len + 8, "tie_word_embeddings": False,
             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": None}
    make = (Qwen2Config, Qwen2ForCausalLM) if args.model == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    student = make[1](make[0](**shape)).eval()
    with torch.no_grad():
        student.lm_head.weight.mul_(20.0)  # far from uniform, so sampled responses have structure
    teacher = make[1](make[0](**shape)).eval()
    teacher.load_state_dict(student.state_dict())
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(torch.randn_like(p) * args.teacher_noise * float(p.std().clamp_min(1e-3)))
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(3, args.vocab, (args.rollouts, 16), generator=g)
    with torch.no_grad():
        ids = student.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                               max_new_tokens=args.response_len, min_new_tokens=args.response_len,
                               pad_token_id=0)  # (B, 16 + R)
    t = score_rows(teacher, ids, torch.ones_like(ids)).realized  # (B, L), 0 at position 0
    resp = torch.zeros_like(ids)
    resp[:, 16:] = 1
    return student, ProbeBatch(ids, torch.ones_like(ids), resp, t * resp)


def _rows(pool: Any, idx: Any) -> Any:
    from adwin.audit.alignment import ProbeBatch

    return ProbeBatch(pool.input_ids[idx], pool.attention_mask[idx], pool.response_mask[idx],
                      pool.teacher_logprobs[idx])


# ---------------------------------------------------------------------------------------------
# top:N agreement
# ---------------------------------------------------------------------------------------------


def _agreement(model: Any, pool: Any, cands: list[int], threshold: float, max_len: int,
               args: argparse.Namespace) -> dict[str, Any]:
    from adwin.audit.alignment import audit
    from adwin.policies.adaptive import AdaptiveWindow
    from adwin.student.structure import transformer_blocks

    decide = AdaptiveWindow(cands, threshold, max_len=max(max_len, cands[-1])).decide
    n_blocks = len(transformer_blocks(model))
    specs = ["all"] + [f"top:{n}" for n in range(1, n_blocks)]
    n, p = pool.input_ids.shape[0], args.probe_batch
    batches = [list(range(i, i + p)) for i in range(0, n - p + 1, p)]
    results: dict[str, list[Any]] = {s: [] for s in specs}
    times: dict[str, list[float]] = {s: [] for s in specs}
    for idx in batches:
        batch = _rows(pool, idx)
        for s in specs:
            res = audit(model, batch, cands, method="fast", macro=False, params=s)
            results[s].append(res.cosines)
            times[s].append(res.elapsed_s)
    ref = [decide(c) for c in results["all"]]
    rows = []
    for s in specs:
        dec = [decide(c) for c in results[s]]
        agree = float(np.mean([a == b for a, b in zip(dec, ref, strict=True)]))
        dcos = float(np.mean([abs(c[k] - r[k]) for c, r in zip(results[s], results["all"], strict=True) for k in cands]))
        rows.append({"params": s, "agreement": agree, "mean_abs_dcos": dcos,
                     "time_ratio": statistics.median(times[s]) / statistics.median(times["all"]),
                     "windows": {str(w): dec.count(w) for w in sorted(set(dec))}})
    head = (f"model {args.model} ({n_blocks} blocks), {len(batches)} probe batches of {p}, candidates {cands}, "
            f"threshold {threshold}\n\n| params | decision agreement with all | mean abs cosine diff | audit time / all "
            "| windows chosen |\n|---|---|---|---|---|")
    lines = [f"| {r['params']} | {r['agreement']:.0%} | {r['mean_abs_dcos']:.3f} | {r['time_ratio']:.2f} | "
             + ", ".join(f"{w}: {k}" for w, k in r["windows"].items()) + " |" for r in rows]
    return {"table": "\n".join([head, *lines]), "rows": rows, "batches": len(batches), "blocks": n_blocks}


# ---------------------------------------------------------------------------------------------
# cosine against probe batch size
# ---------------------------------------------------------------------------------------------


def _vs_p(model: Any, pool: Any, cands: list[int], args: argparse.Namespace) -> dict[str, Any]:
    from adwin.audit.alignment import audit

    rng = np.random.default_rng(args.seed)
    n = pool.input_ids.shape[0]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if max(sizes) > n:
        raise ValueError(f"--sizes up to {max(sizes)} need --rollouts >= {max(sizes)}, got {n}")
    out = []
    for p in sizes:
        batch_cos, deb_cos, fallbacks, t_batch, t_deb = [], [], 0, [], []
        for _ in range(args.repeats):
            batch = _rows(pool, rng.choice(n, p, replace=False).tolist())
            plain = audit(model, batch, cands, method="fast", macro=False)
            deb = audit(model, batch, cands, method="fast", macro=False, estimator="debiased")
            batch_cos.append([plain.cosines[c] for c in cands])
            deb_cos.append([deb.cosines[c] for c in cands])
            fallbacks += int(deb.extra["debiased_fallbacks"])
            t_batch.append(plain.elapsed_s)
            t_deb.append(deb.elapsed_s)
        for name, vals in (("batch", batch_cos), ("debiased", deb_cos)):
            arr = np.asarray(vals)
            out.append({"P": p, "estimator": name, "mean": arr.mean(0).tolist(), "std": arr.std(0).tolist(),
                        "fallbacks": fallbacks if name == "debiased" else 0,
                        "time_s": statistics.median(t_deb if name == "debiased" else t_batch)})
    head = (f"model {args.model}, pool {n} rollouts, {args.repeats} random subsets per P\n\n| P | estimator | "
            + " | ".join(str(c) for c in cands) + " | fallbacks | audit s |\n|---|---|"
            + "---|" * len(cands) + "---|---|")
    lines = [f"| {r['P']} | {r['estimator']} | "
             + " | ".join(f"{m:.2f} ± {s:.2f}" for m, s in zip(r["mean"], r["std"], strict=True))
             + f" | {r['fallbacks']}/{args.repeats * len(cands)} | {r['time_s']:.2f} |" for r in out]
    return {"table": "\n".join([head, *lines]), "rows": out, "candidates": cands}


# ---------------------------------------------------------------------------------------------
# window.confidence against the point rule
# ---------------------------------------------------------------------------------------------


def _stability(model: Any, pool: Any, cands: list[int], threshold: float, max_len: int,
               args: argparse.Namespace) -> dict[str, Any]:
    from adwin.audit.alignment import audit
    from adwin.policies.adaptive import AdaptiveWindow

    rng = np.random.default_rng(args.seed)
    n = pool.input_ids.shape[0]
    levels = [float(x) for x in args.levels.split(",") if x.strip()]
    horizon = max(max_len, cands[-1])
    evidence: dict[float, list[Any]] = {lv: [] for lv in levels}
    times: list[float] = []
    for i in range(args.audits):
        batch = _rows(pool, rng.choice(n, args.probe_batch, replace=False).tolist())
        for lv in levels:
            res = audit(model, batch, cands, method="fast", macro=False, estimator=args.estimator, ci_level=lv,
                        seed=args.seed + i)
            evidence[lv].append(res)
            times.append(res.elapsed_s)
    plain = [r.cosines for r in evidence[levels[0]]]
    rows = []
    for name, confidence, seq in [("point", False, plain)] + [(f"confidence {lv}", True, evidence[lv]) for lv in levels]:
        p = AdaptiveWindow(cands, threshold, horizon, confidence=confidence)
        windows = []
        for r in seq:
            p.observe(r)
            windows.append(p.window(0))
        rows.append({"rule": name, "changes_per_audit": p.changes / len(seq),
                     "mean_window": float(np.mean(windows)),
                     "windows": {str(w): windows.count(w) for w in sorted(set(windows))}})
    widths = {lv: float(np.mean([hi - lo for r in evidence[lv] for lo, hi in r.cosine_ci.values()])) for lv in levels}
    head = (f"model {args.model}, {args.audits} random probe batches of {args.probe_batch} from {n} rollouts, same "
            f"weights, estimator {args.estimator}, threshold {threshold}, start at {cands[-1]}; audit with interval "
            f"{statistics.median(times):.2f} s median\n\n| rule | changes per audit | mean window | windows chosen "
            "|\n|---|---|---|---|")
    lines = [f"| {r['rule']} | {r['changes_per_audit']:.2f} | {r['mean_window']:.0f} | "
             + ", ".join(f"{w}: {k}" for w, k in r["windows"].items()) + " |" for r in rows]
    lines.append("\nmean interval width: " + ", ".join(f"{lv}: {w:.3f}" for lv, w in widths.items()))
    return {"table": "\n".join([head, *lines]), "rows": rows, "widths": widths}


# ---------------------------------------------------------------------------------------------
# audit.every / skip_margin replay
# ---------------------------------------------------------------------------------------------

REPLAY_SETTINGS: list[dict[str, float]] = [
    {"every": 1, "skip_margin": 0.0}, {"every": 2, "skip_margin": 0.0}, {"every": 3, "skip_margin": 0.0},
    {"every": 1, "skip_margin": 0.1}, {"every": 1, "skip_margin": 0.2}, {"every": 1, "skip_margin": 0.3},
]


def _replay(args: argparse.Namespace) -> dict[str, Any]:
    from adwin.audit.schedule import AuditSchedule
    from adwin.config import load_config
    from adwin.policies.adaptive import AdaptiveWindow

    cfg = load_config(args.config)
    audits = []
    with open(args.replay) as f:
        for line in f:
            m = json.loads(line)
            cos = {int(k.rsplit("_", 1)[1]): float(v) for k, v in m.items() if k.startswith("audit/micro_cos_")}
            if cos:
                audits.append(cos)
    if not audits:
        raise ValueError(f"{args.replay} has no audit/micro_cos_<c> metrics: replay a run that audited")
    cands, thr = sorted(audits[0]), float(cfg.window.threshold)
    decide = AdaptiveWindow(cands, thr, max_len=max(cfg.rollout.max_response_len, cands[-1])).decide
    ref = [decide(c) for c in audits]
    rows = []
    for st in REPLAY_SETTINGS:
        sched = AuditSchedule(threshold=thr, every=int(st["every"]), skip_margin=st["skip_margin"])
        current, differ = None, 0
        for cos, want in zip(audits, ref, strict=True):
            if sched.should_audit():
                sched.record(cos)
                current = decide(cos)
            differ += current != want
        rows.append({**st, "audits": sched.audited, "saved": sched.skipped, "differ": differ})
    head = (f"{args.replay}: {len(audits)} audits, threshold {thr}\n\n| every | skip_margin | audits run | saved "
            "| decisions that differ |\n|---|---|---|---|---|")
    lines = [f"| {r['every']} | {r['skip_margin']} | {r['audits']} | {r['saved']} | {r['differ']} |" for r in rows]
    return {"table": "\n".join([head, *lines]), "rows": rows}
