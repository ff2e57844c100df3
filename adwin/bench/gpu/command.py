"""Check a GPU setup and measure adwin on it (``adwin bench gpu``), within a time budget (default 8 minutes).

Parts, in order, each timed and bounded (a part that runs past its share of the budget is cut, and what it
finished is kept):

a. setup: Python, torch, CUDA, transformers, the device's name, bf16 support and free memory; ``--device cuda``
   on a machine without CUDA stops here (exit status 2);
b. tests: ``pytest -m gpu`` over the checkout's GPU-marked test modules (skipped, with a note, for a wheel install);
c. decode: ms per decode step of adwin's rollout engine, uncompiled and compiled (``rollout.compile``), against
   transformers' ``generate(cache_implementation="static")`` on the same model and rows (goal: within 1.25x);
d. runs: the fixed window (``window.initial``) and full-rollout OPD first, then ADWIN with ``inline``,
   ``rollout`` and ``thread`` probes, on a ~135M-parameter Llama pair built in code (``adwin.bench.gpu.models``)
   or the checkpoints named by ``--student``/``--teacher``; ADWIN's wall per step over the fixed window's (goal
   <= 1.1x) and the learner's decision share (goal <= 0.10).

Every part's result is appended to ``OUT/parts.jsonl`` as it finishes (a run's the moment it ends), the whole to
``OUT/gpu-bench.json`` and ``OUT/gpu-bench.md``, with the commit, the device and the versions. ``--quick`` runs
the same parts with a tiny model, on the CPU unless ``--device`` says otherwise, in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from adwin.bench.gpu.runs import BASELINES, VARIANTS

log = logging.getLogger(__name__)

PARTS = ("setup", "tests", "decode", "runs")
# shares of the budget a part may take; what a part leaves goes to the parts after it, the runs take the rest
TESTS_SHARE, DECODE_SHARE = 0.15, 0.3
MIN_RUN_S = 10.0  # a run given less than this is not started
GOALS = {"decode_x_static": 1.25, "adwin_x_fixed": 1.1, "learner_share": 0.10}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a tiny model on the CPU (unless --device): a smoke run")
    p.add_argument("--device", default=None, help="torch device (default: cuda; cpu with --quick)")
    p.add_argument("--student", metavar="DIR", help="student checkpoint (default: a pair built in code)")
    p.add_argument("--teacher", metavar="DIR", help="teacher checkpoint, same tokenizer (with --student)")
    p.add_argument("--budget", type=float, default=480.0, metavar="S", help="seconds for the whole bench")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 6; 3 with --quick)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"runs, a subset of {','.join(VARIANTS)} (the baselines always run first)")
    p.add_argument("--rows", type=int, default=None, help="decode rows (default 64; 4 with --quick)")
    p.add_argument("--new-tokens", type=int, default=None, help="decode steps per call (default 256; 16 --quick)")
    p.add_argument("--calls", type=int, default=2, help="timed decode calls per path, after one warm-up call")
    p.add_argument("--tests", metavar="DIR", default=None, help="test folder (default: the checkout's tests/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config overrides for every run (repeatable), e.g. rollout.compile=false")
    p.add_argument("--out", default=None, help="folder for the pair, the runs and the results (default: temporary)")


def main(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from adwin.bench.gpu.setup import setup_check

    hf_logging.disable_progress_bar()

    parts = _choose(args.parts, PARTS, "--parts")
    variants = [v for v in VARIANTS if v in _choose(args.variants, VARIANTS, "--variants")]
    if (args.student is None) != (args.teacher is None):
        raise ValueError("--student and --teacher go together (or neither: the bench builds a pair)")
    device = args.device or ("cpu" if args.quick else "cuda")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="adwin-bench-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    journal = out / "parts.jsonl"
    journal.write_text("")
    t0 = time.perf_counter()
    deadline = t0 + args.budget
    result: dict[str, Any] = {"command": "adwin " + shlex.join(getattr(args, "argv", ["bench", "gpu"])),
                              "quick": args.quick, "budget_s": args.budget}

    def record(part: str, value: Any) -> None:
        result[part] = value
        with journal.open("a") as f:
            f.write(json.dumps({"part": part, "result": value}, default=str) + "\n")

    record("setup", setup_check(device) | {"seconds": time.perf_counter() - t0})  # first: no CUDA stops here
    dtype = "float32" if args.quick or device == "cpu" else "bfloat16"
    t1 = time.perf_counter()
    student, teacher = _pair(args, out, dtype)
    record("pair", {"student": str(student), "teacher": str(teacher), "dtype": dtype, "built": args.student is None,
                    "seconds": time.perf_counter() - t1})
    if "tests" in parts:
        from adwin.bench.gpu.setup import gpu_tests

        tests = Path(args.tests) if args.tests else None
        record("tests", gpu_tests(tests, min(TESTS_SHARE * args.budget, _left(deadline)), out))
    if "decode" in parts:
        record("decode", _decode(args, student, dtype, device, out, min(DECODE_SHARE * args.budget, _left(deadline))))
    if "runs" in parts:
        result["runs"] = _runs(args, variants, student, teacher, device, dtype, out, deadline, record)
    result["total_s"] = time.perf_counter() - t0
    result["goals"] = goals(result)
    (out / "gpu-bench.json").write_text(json.dumps(result, indent=2, default=str))
    text = report(result)
    (out / "gpu-bench.md").write_text(text)
    sys.stdout.write(text)
    log.info("bench gpu: %.0f s; results in %s", result["total_s"], out)
    return 0


def _choose(spec: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    chosen = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in chosen if x not in allowed]
    if bad or not chosen:
        raise ValueError(f"{flag} names only {','.join(allowed)}; got {spec!r}")
    return chosen


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.perf_counter())


def _pair(args: argparse.Namespace, out: Path, dtype: str) -> tuple[Path, Path]:
    if args.student is not None:
        return Path(args.student), Path(args.teacher)
    from adwin.bench.gpu.models import SMOLLM2_135M, TINY, build_pair

    return build_pair(out / "pair", TINY if args.quick else SMOLLM2_135M, dtype)


def _decode(args: argparse.Namespace, student: Path, dtype: str, device: str, out: Path,
            timeout_s: float) -> dict[str, Any]:
    from adwin.bench.gpu.decode import read_decode, run_decode
    from adwin.bench.gpu.setup import bounded

    rows, new = args.rows or (4 if args.quick else 64), args.new_tokens or (16 if args.quick else 256)
    path = out / "decode.jsonl"
    path.unlink(missing_ok=True)
    ended = bounded(run_decode, {"student": str(student), "dtype": dtype, "device": device, "rows": rows,
                                 "prompt_len": 16, "new_tokens": new, "calls": args.calls, "out": str(path)},
                    timeout_s)
    return {"rows": rows, "prompt_len": 16, "new_tokens": new, **ended, **read_decode(path)}


def _runs(args: argparse.Namespace, variants: list[str], student: Path, teacher: Path, device: str, dtype: str,
          out: Path, deadline: float, record: Any) -> list[dict[str, Any]]:
    from adwin.bench.gpu.runs import (
        GPU_SETTINGS,
        QUICK_SETTINGS,
        metrics_rows,
        run_error,
        run_folder,
        run_one,
        run_overrides,
        summarize,
        with_ratios,
    )
    from adwin.bench.gpu.setup import bounded

    settings = (QUICK_SETTINGS if args.quick else GPU_SETTINGS) | {"model.dtype": dtype}
    sets = run_overrides(settings, student, teacher, device, args.set)
    steps = args.steps or (3 if args.quick else 6)
    horizon = _horizon(sets)
    rows: list[dict[str, Any]] = []
    for i, variant in enumerate(variants):
        share = _left(deadline) / (len(variants) - i)  # an equal share of what is left: a slow run cuts only itself
        row: dict[str, Any] = {"variant": variant, "planned_steps": steps, "timeout_s": share}
        if share < MIN_RUN_S:
            row |= {"status": "skipped", "note": f"{share:.0f} s of the budget left for it"}
        else:
            folder = run_folder(out, variant)
            window = horizon if variant == "full" else None  # fixed: window.initial (run_variant's default)
            ended = bounded(run_one, {"variant": variant, "sets": sets, "steps": steps, "window": window,
                                      "out": str(folder)}, share)
            summary = summarize(metrics_rows(folder))
            status = "cut" if ended["cut"] else "failed" if ended["exit_code"] != 0 else "done"
            row |= {"status": status, "process_s": ended["seconds"], **summary}
            if status == "failed":
                row["note"] = run_error(folder) or f"exit status {ended['exit_code']}"
        rows.append(row)
        with_ratios(rows)
        record(f"run:{variant}", row)
    return rows


def _horizon(sets: list[str]) -> int:
    """``rollout.max_response_len`` as the runs will see it (the last ``--set`` of it wins)."""
    from adwin.config import load_config, parse_set, resolve_config

    return int(load_config(resolve_config("byo-model").path, parse_set(sets)).rollout.max_response_len)


def goals(result: dict[str, Any]) -> dict[str, Any]:
    """Each goal of the bench with the measured value, None where its part did not measure it."""
    decode = {r["path"]: r for r in result.get("decode", {}).get("paths", [])}
    runs = [r for r in result.get("runs", []) if r.get("steps") and r["variant"] not in BASELINES]
    return {
        "decode_x_static": {"goal": GOALS["decode_x_static"],
                            "engine": decode.get("engine", {}).get("x_static"),
                            "engine compiled": decode.get("engine compiled", {}).get("x_static")},
        "adwin_x_fixed": {"goal": GOALS["adwin_x_fixed"], **{r["variant"]: r.get("x_fixed") for r in runs}},
        "learner_share": {"goal": GOALS["learner_share"], **{r["variant"]: r.get("learner_share") for r in runs}},
    }


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def report(result: dict[str, Any]) -> str:
    """The bench as markdown: a header line per fact, then one table per part."""
    from adwin.bench.compare.report import markdown_table

    s = result["setup"]
    lines = [f"# adwin bench gpu{' --quick' if result['quick'] else ''}", "",
             f"commit {s['commit']}; {s['device']} ({s['device_name']}); Python {s['python']}, torch {s['torch']} "
             f"(CUDA {s['cuda_runtime']}), transformers {s['transformers']}; bf16 {s['bf16']}"
             + (f"; {s['free_gib']:.1f} of {s['total_gib']:.1f} GiB free" if "free_gib" in s else "")
             + f"; {result['total_s']:.0f} s of a {result['budget_s']:.0f} s budget", ""]
    if "tests" in result:
        t = result["tests"]
        lines += [f"GPU-marked tests: {t['status']}"
                  + (f", {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped" if "tests" in t else "")
                  + (f" in {t['seconds']:.0f} s" if "seconds" in t else "") + (f" ({t['note']})" if "note" in t else ""),
                  *[f"- failed: {n}" for n in t.get("failed_names", [])], ""]
    if "decode" in result:
        d = result["decode"]
        lines += [f"Decode, {d['rows']} rows x {d['prompt_len']} prompt tokens, {d['new_tokens']} new tokens"
                  + (" (cut: " + ", ".join(d["missing"]) + " not measured)" if d["missing"] else ""), "",
                  markdown_table(["path", "first call s", "of it compiling", "ms/step", "x static"],
                                 [[r["path"], _f(r["first_s"], "{:.1f}"), _f(r["compile_s"], "{:.1f}"),
                                   _f(r["ms_per_step"]), _f(r["x_static"])] for r in d["paths"]])]
    if "runs" in result:
        cols = ["run", "status", "steps", "s/step", "x fixed", "learner share", "rollout s/step", "probe s/step",
                "audit s/step", "compile s", "audits", "mean W"]
        body = [[r["variant"], r["status"], f"{r.get('steps', 0)}/{r['planned_steps']}", _f(r.get("s_per_step")),
                 _f(r.get("x_fixed")), _f(r.get("learner_share"), "{:.3f}"), _f(r.get("rollout_s_per_step")),
                 _f(r.get("probe_s_per_step")), _f(r.get("audit_s_per_step")), _f(r.get("compile_s"), "{:.1f}"),
                 _f(r.get("audits"), "{:.0f}"), _f(r.get("mean_window"), "{:.0f}")] for r in result["runs"]]
        lines += ["Runs (wall per step without evaluation and compile seconds)", "", markdown_table(cols, body),
                  *[f"- {r['variant']}: {r['note']}" for r in result["runs"] if r.get("note")], ""]
    def measured(v: dict[str, Any]) -> str:
        return ", ".join(f"{k} {_f(x)}" for k, x in v.items() if k != "goal") or "not measured"

    lines += ["Goals: " + "; ".join(f"{name} <= {v['goal']}: {measured(v)}" for name, v in result["goals"].items())]
    return "\n".join(lines) + "\n"
