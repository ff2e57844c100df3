"""The training runs of ``adwin bench gpu`` (part d): the baselines first, then ADWIN with each probe backend.

Order: ``fixed`` (window ``window.initial``, no probes), ``full`` (fixed at the horizon: full-rollout OPD), then
ADWIN with ``inline``, ``rollout`` and ``thread`` probes. Each is ``adwin bench probes``' ``run_variant`` (same
config rules, same trainer) in a process of its own with a deadline, so a run cut by it still leaves its
``metrics.jsonl`` rows, and its row is computed from those rows whether it finished or not:

- ``s_per_step``: wall seconds per step without evaluation and without the seconds torch spent compiling
  (``rollout/compile_s``, reported apart as ``compile_s``);
- ``learner_share``: the learner's own probe and audit seconds (``time/probe`` + ``time/audit``) over that wall;
- ``x_fixed``: ``s_per_step`` over the fixed window's (the goal for ADWIN: <= 1.1).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

VARIANTS = ("fixed", "full", "inline", "rollout", "thread")
BASELINES = ("fixed", "full")
ERROR_FILE = "error.txt"

# the run shape of the GPU measurements in docs (16 prompts x 4 samples, horizon 512, P = 16)
GPU_SETTINGS: dict[str, Any] = {
    "model.dtype": "bfloat16", "rollout.prompts_per_step": 16, "rollout.samples_per_prompt": 4,
    "rollout.max_response_len": 512, "window.candidates": [64, 128, 256, 384], "window.initial": 256,
    "probes.batch_size": 16, "probes.offers_per_step": 8, "optim.warmup_steps": 0, "data.max_prompt_len": 512}
QUICK_SETTINGS: dict[str, Any] = {
    "model.dtype": "float32", "rollout.prompts_per_step": 2, "rollout.samples_per_prompt": 2,
    "rollout.max_response_len": 32, "window.candidates": [8, 16], "window.initial": 16, "probes.batch_size": 2,
    "probes.offers_per_step": 2, "probes.staleness_limit": 2, "optim.warmup_steps": 0, "data.max_prompt_len": 96}


def run_overrides(settings: dict[str, Any], student: Path, teacher: Path, device: str,
                  extra: Sequence[str]) -> list[str]:
    """``--set`` items of every run: the byo-model preset on the pair, the built-in task's prompts, ``settings``,
    then the user's own ``--set`` (last, so they win)."""
    base = {"model.student": str(student), "model.teachers": {"default": str(teacher)}, "model.device": device,
            "data.task": "builtin", "data.path": None} | settings
    return [f"{k}={json.dumps(v)}" for k, v in base.items()] + list(extra)


def run_one(variant: str, sets: list[str], steps: int, window: int | None, out: str) -> None:
    """One run, in its own process (``gpu_setup.bounded``): ``run_variant`` of ``adwin bench probes``."""
    from transformers.utils import logging as hf_logging

    from adwin.bench.probes import run_variant

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hf_logging.disable_progress_bar()
    args = argparse.Namespace(config="byo-model", profile="default", steps=steps, set=sets)
    try:
        run_variant(args, "fixed" if variant in BASELINES else variant, Path(out), window)
    except Exception as e:  # the row says why; the traceback goes to stderr as the process ends
        (Path(out) / ERROR_FILE).write_text(f"{type(e).__name__}: {e}")
        raise


def run_error(folder: Path) -> str | None:
    """Why a run's process failed, as it wrote it (None: it did not fail in Python)."""
    path = folder / ERROR_FILE
    return path.read_text() if path.is_file() else None


def run_folder(out: Path, variant: str) -> Path:
    """A fresh folder for ``variant``'s run (a rerun into the same ``--out`` starts clean)."""
    folder = out / "runs" / variant
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def metrics_rows(folder: Path) -> list[dict[str, Any]]:
    """The step rows a run wrote (none when it was cut before its first step)."""
    found = sorted(folder.glob("*/metrics.jsonl"))
    if not found:
        return []
    return [json.loads(x) for x in found[0].read_text().splitlines() if x.strip()]


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-step figures of a run from its metrics rows (a cut run's rows too)."""
    if not rows:
        return {"steps": 0}

    def total(key: str) -> float:
        return float(sum(float(r.get(key) or 0.0) for r in rows))

    n = len(rows)
    compile_s = total("rollout/compile_s")
    wall = float(rows[-1]["time/wall"]) - total("time/eval") - compile_s
    windows = [float(r["window/current"]) for r in rows if "window/current" in r]
    out = {"steps": n, "wall_s": wall, "s_per_step": wall / n, "compile_s": compile_s,
           "learner_share": (total("time/probe") + total("time/audit")) / wall if wall > 0 else float("nan"),
           "audits": total("audit/submitted"), "mean_window": sum(windows) / len(windows) if windows else None,
           "probe_tokens": total("probe/tokens")}
    for key in ("rollout", "teacher", "train", "probe", "audit"):
        out[f"{key}_s_per_step"] = total(f"time/{key}") / n
    for key in ("rollout/decode_steps", "probe/decode_steps"):
        if any(key in r for r in rows):
            out[key.replace("/", "_") + "_per_step"] = total(key) / n
    return out


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``x_fixed`` on every run with steps, once the fixed window's run has some."""
    base = next((r.get("s_per_step") for r in rows if r["variant"] == "fixed"), None)
    for r in rows:
        r["x_fixed"] = r["s_per_step"] / base if base and r.get("s_per_step") else None
    return rows
