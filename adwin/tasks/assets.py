"""Prepared assets of the built-in task: tokenizer, teacher and student initialisation, cached under
``$ADWIN_HOME`` (default ``~/.cache/adwin``) in ``builtin/<profile>-seed<seed>/``.

Layout of a prepared folder::

    tokenizer/   AutoTokenizer.from_pretrained(...)
    teacher/     AutoModelForCausalLM.from_pretrained(...), SFT to convergence on both sub-tasks
    student/     the same architecture, an early snapshot of the same SFT run (weak, drifts)
    meta.json    profile, specs, timings, measured accuracies and length statistics

One teacher is shared by both routes: ``teacher_paths`` maps every routing key to ``teacher/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adwin.tasks.chain import ROUTES
from adwin.tasks.profiles import ModelSpec
from adwin.tasks.suite import DEFAULT_TASK, get_task

logger = logging.getLogger(__name__)

META_FILE = "meta.json"
FORMAT_VERSION = 1  # bump when the layout or the training recipe changes
PROFILES = ("default", "tiny")


@dataclass
class BuiltinAssets:
    root: Path
    tokenizer_path: Path
    student_path: Path
    teacher_paths: dict[str, Path]  # routing key -> teacher checkpoint (all keys share one teacher)
    meta: dict[str, Any]


def adwin_home(home: str | Path | None = None) -> Path:
    if home is not None:
        return Path(home).expanduser()
    return Path(os.environ.get("ADWIN_HOME", "~/.cache/adwin")).expanduser()


def folder_name(profile: str, seed: int, task: str = DEFAULT_TASK) -> str:
    """``<profile>-seed<seed>`` for ``chain`` (the folder it always had), ``<task>-<profile>-seed<seed>`` for the
    other tasks: each task is prepared, cached and shipped on its own."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {PROFILES}")
    get_task(task)
    prefix = "" if task == DEFAULT_TASK else f"{task}-"
    return f"{prefix}{profile}-seed{seed}"


def assets_root(home: str | Path | None, profile: str, seed: int, task: str = DEFAULT_TASK) -> Path:
    """This machine's prepared assets: ``builtin/<folder_name>`` under :func:`adwin_home`."""
    return adwin_home(home) / "builtin" / folder_name(profile, seed, task)


def load_assets(root: Path) -> BuiltinAssets:
    meta = json.loads((root / META_FILE).read_text())
    meta["root"] = str(root)  # where they were read, whoever wrote them
    teacher_dirs = meta.get("teacher_dirs", {route: "teacher" for route in ROUTES})
    return BuiltinAssets(
        root=root,
        tokenizer_path=root / "tokenizer",
        student_path=root / "student",
        teacher_paths={route: root / rel for route, rel in teacher_dirs.items()},
        meta=meta,
    )


def profile_fingerprint(profile: str, task: str = DEFAULT_TASK) -> str:
    """A short hash of everything that shapes a profile's assets (task format, model, schedule), so
    a cache built by an older version of the profile is rebuilt instead of silently reused."""
    import hashlib
    from dataclasses import asdict

    from adwin.tasks import chain

    builtin = get_task(task)
    spec = asdict(builtin.profile(profile))
    if spec["warm"] is None:  # a profile without a warm start keeps the fingerprint it had before the field
        del spec["warm"]
    elif spec["warm"]["teacher_source"] is None:  # nor one without a teacher of its own
        del spec["warm"]["teacher_source"], spec["warm"]["teacher_schedule"]
    if not spec["teacher_calibration"]:  # nor one whose teacher is not calibrated
        del spec["teacher_calibration"]
    del spec["student_greedy_eval"], spec["target_overrides"]  # what judges the models, not what shapes them
    # nor a schedule with an unweighted loss
    warm = spec.get("warm") or {}
    for schedule in (spec["schedule"], warm.get("schedule"), warm.get("teacher_schedule")):
        if schedule is not None and schedule["closing_weight"] == 1.0:
            del schedule["closing_weight"]
    fields = [
        chain.ROUTES,
        chain.UNITS,
        chain.MIN_STEPS,
        chain.MAX_STEPS,
        chain.LINE_CHARS,
        chain.ANSWER_PREFIX,
        chain.EVAL_BUCKETS,
        chain.step_count_weights(),
    ]
    # chain's fingerprint is unchanged by the other tasks, so its existing caches stay valid
    extra = [] if task == DEFAULT_TASK else [task, builtin.noise_line_rate]
    if builtin.rule_version != 1:
        extra.append(builtin.rule_version)
    if builtin.student_step_scale != 1.0:
        extra.append(builtin.student_step_scale)
    if builtin.fingerprint_fields:
        extra.append(repr(builtin.fingerprint_fields))
    blob = json.dumps([spec, repr(fields), FORMAT_VERSION, *extra], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_prepared(root: Path, profile: str | None = None, task: str = DEFAULT_TASK) -> bool:
    """True when ``root`` holds complete assets (and, given ``profile``, of its current version)."""
    meta_path = root / META_FILE
    if not meta_path.is_file() or not all(
        (root / sub / "config.json").is_file() for sub in ("student", "teacher")
    ):
        return False
    if profile is None:
        return True
    try:
        return json.loads(meta_path.read_text()).get("fingerprint") == profile_fingerprint(profile, task)
    except (OSError, ValueError):
        return False


def warm_source(home: str | Path | None, profile: str, seed: int, task: str) -> Path | None:
    """The prepared teacher a task's prepare starts from (its profile's warm start), when that is cached at its
    current version with the same model (the position limit aside); None: the prepare runs from scratch."""
    spec = get_task(task).profile(profile)
    return None if spec.warm is None else _cached_teacher(home, profile, seed, spec.warm.source, spec.model)


def teacher_warm_source(home: str | Path | None, profile: str, seed: int, task: str) -> Path | None:
    """The prepared teacher a task's *teacher* starts from in a run of its own (``WarmStart.teacher_source``), when
    cached as :func:`warm_source` requires; None: the teacher continues the student's run."""
    spec = get_task(task).profile(profile)
    if spec.warm is None or spec.warm.teacher_source is None:
        return None
    return _cached_teacher(home, profile, seed, spec.warm.teacher_source, spec.model)


def _cached_teacher(home: str | Path | None, profile: str, seed: int, source: str, model: ModelSpec) -> Path | None:
    from dataclasses import replace

    root = assets_root(home, profile, seed, source)
    if not is_prepared(root, profile, source):
        return None
    if replace(get_task(source).profile(profile).model, max_positions=model.max_positions) != model:
        return None
    return root / "teacher"


def ensure_prepared(
    home: str | Path | None = None, profile: str = "default", seed: int = 0, force: bool = False,
    threads: int | None = None,
    task: str = DEFAULT_TASK,
) -> BuiltinAssets:
    """The prepared assets of ``profile``; prepares them first when missing (or when ``force``), on
    ``threads`` intra-op threads (default ``profiles.PREPARE_THREADS``, whatever the caller set: the weights
    depend on it), from :func:`warm_source` when the profile has a warm start. The tasks a warm start reads
    (``WarmStart.source`` and ``teacher_source``) are prepared first when they are not cached, so a task is
    prepared from what its recipe names whatever was prepared before it (the from-scratch recipe remains for a
    source whose model differs).

    Preparation writes into a temporary sibling folder and renames it into place, so an interrupted
    run never leaves a half-written cache and two concurrent callers both end with a complete one.
    """
    root = assets_root(home, profile, seed, task)
    if is_prepared(root, profile, task) and not force:
        return load_assets(root)
    warm = get_task(task).profile(profile).warm
    for source in () if warm is None else (warm.source, warm.teacher_source):
        if source is not None and not is_prepared(assets_root(home, profile, seed, source), profile, source):
            logger.info("%s starts from %s's prepared teacher: preparing %s first", task, source, source)
            ensure_prepared(home, profile, seed, threads=threads, task=source)
    from adwin.tasks.build import build_assets  # heavy: torch, transformers
    from adwin.tasks.profiles import PREPARE_THREADS

    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        warm_from = warm_source(home, profile, seed, task)
        # a teacher of its own only beside the warm student: the scratch fallback is one run
        teacher_from = teacher_warm_source(home, profile, seed, task) if warm_from is not None else None
        meta = build_assets(staging, profile=profile, seed=seed, threads=threads or PREPARE_THREADS, task=task,
                            warm_from=warm_from, teacher_from=teacher_from)
        meta |= {"root": str(root), "fingerprint": profile_fingerprint(profile, task)}
        # meta.json last: a folder without it is incomplete (is_prepared), and it is complete before the rename
        (staging / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if root.exists():
            if is_prepared(root, profile, task) and not force:
                logger.info("another process prepared %s meanwhile; keeping it", root)
                return load_assets(root)
            shutil.rmtree(root)
        staging.rename(root)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return load_assets(root)
