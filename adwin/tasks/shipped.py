"""The built-in tasks' prepared models as they ship with adwin, and the choice between them and this machine's own
build.

Preparing a task is an SFT run of minutes, and its float rounding follows the CPU: two machines that prepare from the
same recipe and seed end with different students, so every figure measured on them moves. adwin therefore ships the
default profile's models of every built-in task at seed 0 (``builtin_models/<folder>``, the layout of a prepared
folder, :mod:`adwin.tasks.assets`), and a run reads those unless told otherwise (``model.builtin_source``).

Each shipped folder carries the fingerprint of the recipe that built it. A folder whose fingerprint is not the
current recipe's is never served: the run prepares this machine's own models instead and says why, so a recipe change
cannot silently run on stale weights. ``adwin prepare`` always runs the recipe and reports how its build differs from
the shipped one (:func:`compare`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any, Literal

from adwin.tasks.assets import (
    META_FILE,
    BuiltinAssets,
    ensure_prepared,
    folder_name,
    is_prepared,
    load_assets,
    profile_fingerprint,
)
from adwin.tasks.suite import DEFAULT_TASK

logger = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).with_name("builtin_models")
Source = Literal["shipped", "prepared"]
MODEL_DIRS = ("student", "teacher")
# the files a loaded folder reads; the rest of a prepared folder (nothing today) stays home
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


def shipped_root(profile: str, seed: int = 0, task: str = DEFAULT_TASK) -> Path:
    return SHIPPED_DIR / folder_name(profile, seed, task)


def shipped_assets(profile: str, seed: int = 0, task: str = DEFAULT_TASK) -> BuiltinAssets | None:
    """The shipped models of ``task``/``profile``/``seed`` when they are of the current recipe; None when none
    ship, or when the ones that ship were built by another recipe (logged: the caller prepares instead)."""
    root = shipped_root(profile, seed, task)
    if not (root / META_FILE).is_file():
        return None
    if not is_prepared(root, profile, task):
        shipped_fp = json.loads((root / META_FILE).read_text()).get("fingerprint")
        logger.warning("the shipped %s models were built by another recipe (fingerprint %s, this version's %s): "
                       "not serving them", root.name, shipped_fp, profile_fingerprint(profile, task))
        return None
    return load_assets(root)


def builtin_assets(profile: str = "default", seed: int = 0, task: str = DEFAULT_TASK, source: Source = "shipped",
                   home: str | Path | None = None) -> BuiltinAssets:
    """The built-in models a run uses. ``shipped``: the ones that ship with adwin, the same on every machine; where
    none ship for this task, profile and seed (or only a stale recipe's), this machine's own build, prepared on
    first use. ``prepared``: this machine's own build (``adwin prepare``), prepared on first use."""
    if source == "shipped":
        found = shipped_assets(profile, seed, task)
        if found is not None:
            logger.info("built-in models: %s", describe(found))
            return found
        logger.info("no shipped models for task %s, profile %s, seed %d: using this machine's own build",
                    task, profile, seed)
    elif source != "prepared":
        raise ValueError(f"unknown built-in model source {source!r}; expected 'shipped' or 'prepared'")
    return ensure_prepared(home=home, profile=profile, seed=seed, task=task)


def weights_id(meta: dict[str, Any]) -> str:
    """A short name of the weights: the first 12 hex digits of the student's and teacher's file hashes, or
    ``local`` for a build that was never shipped."""
    digests = meta.get("weights_sha256")
    if not digests:
        return "local"
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:12]


def describe(assets: BuiltinAssets) -> str:
    """Which built-in models a run or benchmark read, for its report: ``shipped <folder> (weights <id>)``, or
    ``prepared <folder> on this machine`` for a local build."""
    if assets.meta.get("weights_sha256") and assets.root.parent == SHIPPED_DIR:
        return f"shipped {assets.root.name} (weights {weights_id(assets.meta)})"
    return f"prepared {assets.root.name} on this machine"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ship(src: BuiltinAssets, dest: Path) -> Path:
    """Write ``src`` (a prepared folder) as a shipped folder at ``dest``: the files a load reads, the weights'
    hashes, and a meta without this machine's paths. Replaces ``dest``."""
    staging = dest.with_name(f".{dest.name}-staging")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src.tokenizer_path, staging / "tokenizer")
    digests = {}
    for sub in MODEL_DIRS:
        (staging / sub).mkdir(parents=True)
        for name in MODEL_FILES:
            if (src.root / sub / name).is_file():
                shutil.copy2(src.root / sub / name, staging / sub / name)
        digests[sub] = file_sha256(staging / sub / "model.safetensors")
    meta = dict(src.meta)
    meta.pop("root", None)
    sft = dict(meta["sft"])
    for key in ("warm_from", "teacher_warm_from"):  # machine paths: the source task's folder name says as much
        if sft.get(key):
            sft[key] = str(Path(sft[key]).relative_to(Path(sft[key]).parents[1]))
    meta["sft"] = sft
    meta["weights_sha256"] = digests
    (staging / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest


def compare(rebuilt: BuiltinAssets, shipped: BuiltinAssets) -> dict[str, Any]:
    """How a rebuild differs from the shipped models: every measure of ``meta.measured`` side by side (for an
    accuracy, whether the difference exceeds two standard errors of two independent proportions over the
    evaluation's problems), and each model's relative L2 distance of weights."""
    import torch
    from safetensors.torch import load_file

    n = int(shipped.meta["eval"]["problems"])
    measures: dict[str, dict[str, Any]] = {}
    for key, was in shipped.meta["measured"].items():
        now = rebuilt.meta["measured"].get(key)
        if key == "wall_seconds" or not isinstance(was, (int, float)) or not isinstance(now, (int, float)):
            continue
        row: dict[str, Any] = {"shipped": was, "rebuilt": now, "diff": now - was}
        if "accuracy" in key:  # a share of the evaluation's problems; the other measures have no such error model
            p = (was + now) / 2
            se = math.sqrt(max(p * (1 - p), 1.0 / n) * 2 / n)
            row["beyond_2se"] = abs(now - was) > 2 * se
        measures[key] = row
    weights = {}
    for sub in MODEL_DIRS:
        a = load_file(str(shipped.root / sub / "model.safetensors"))
        b = load_file(str(rebuilt.root / sub / "model.safetensors"))
        num = sum(float(torch.sum((a[k].double() - b[k].double()) ** 2)) for k in a)
        den = sum(float(torch.sum(a[k].double() ** 2)) for k in a)
        weights[sub] = math.sqrt(num / den) if den > 0 else float("nan")
    return {"shipped": shipped.root.name, "shipped_weights": weights_id(shipped.meta), "measures": measures,
            "weights_relative_l2": weights, "identical": all(v == 0.0 for v in weights.values())}


def render_comparison(cmp: dict[str, Any]) -> str:
    lines = [f"  against the shipped models ({cmp['shipped']}, weights {cmp['shipped_weights']}):"]
    if cmp["identical"]:
        lines.append("    identical weights")
    else:
        lines.append("    weights differ: relative L2 " + ", ".join(
            f"{sub} {v:.3g}" for sub, v in cmp["weights_relative_l2"].items()))
    for key, row in cmp["measures"].items():
        flag = "  (beyond 2 SE)" if row.get("beyond_2se") else ""
        lines.append(f"    {key:<28} shipped {row['shipped']:8.3f}  rebuilt {row['rebuilt']:8.3f}  "
                     f"diff {row['diff']:+8.3f}{flag}")
    return "\n".join(lines)
