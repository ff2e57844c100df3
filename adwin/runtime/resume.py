"""What a checkpoint carries beyond the model and optimizer, and how ``adwin train --resume`` gets it back.

Saved (in ``trainer_state.pt`` under ``extra``): the prompt stream position, the probe pool with every
active probe's prompt, prefix, per-token versions and behavior logprobs (probes are *saved*, not dropped),
the token ledger and the fault counters; the AsyncOPD scheduler adds its request stream
(``adwin.trainer_adapters.asyncopd.requests``). ``state.json`` names the controller run id and the initial
evaluation.

Window policy state: the embedded controller's whole SQLite database is snapshotted into the checkpoint
(``controller.db``, SQLite online backup taken under the controller's lock), so decisions, the probe queue
and pending audits are exactly those of the checkpointed step; resume reopens a working copy of it in the
run folder and the controller answers the same windows. A remote controller (``--controller-url``) cannot be
rewound: resume re-uses the run id there and continues from the service's current state (the window policy
state is still recorded in ``state.json``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONTROLLER_DB = "controller.db"


def run_state(pool: Any, ledger: Any, prompts: Any, faults: Any, schedule: Any = None, budget: Any = None
              ) -> dict[str, Any]:
    """The loop's state besides model/optimizer/RNG, for ``save_checkpoint(extra=...)``; ``schedule`` is the
    audit schedule (``audit.every`` / ``audit.skip_margin``) and ``budget`` the decision budget
    (``audit.budget``) when the run has them."""
    return ({"audit_schedule": schedule.state_dict()} if schedule is not None else {}) | (
        {"decision_budget": budget.state_dict()} if budget is not None else {}) | {
        "prompts": prompts.state_dict(),
        "probes": [dataclasses.asdict(p) for p in pool.snapshot()],
        "probe_tokens_generated": pool.tokens_generated,
        "ledger": {"completed_lengths": list(ledger.completed_lengths), "sync": ledger.sync, "full": ledger.full},
        "faults": faults.state_dict(),
    }


def restore_run_state(extra: dict[str, Any], pool: Any, ledger: Any, prompts: Any, faults: Any,
                      schedule: Any = None, budget: Any = None) -> None:
    from adwin.probes.pool import Probe

    if not extra:
        log.warning("checkpoint holds no run state (older format): prompt stream and probe pool start fresh")
        return
    prompts.load_state_dict(extra["prompts"])
    for d in extra["probes"]:
        pool.add(Probe(**d))
    pool.tokens_generated = int(extra["probe_tokens_generated"])
    ledger.completed_lengths = list(extra["ledger"]["completed_lengths"])
    ledger.sync, ledger.full = float(extra["ledger"]["sync"]), float(extra["ledger"]["full"])
    faults.load_state_dict(extra["faults"])
    if schedule is not None and "audit_schedule" in extra:
        schedule.load_state_dict(extra["audit_schedule"])
    if budget is not None and "decision_budget" in extra:
        budget.load_state_dict(extra["decision_budget"])


def snapshot_controller(controller: Any, dest: Path) -> bool:
    """Copy an embedded ``Controller``'s database to ``dest`` (consistent: taken under its lock).

    Returns False for controllers without a local database (``RemoteController``, wrappers of it).
    """
    backup = getattr(controller, "backup", None)
    if backup is None:
        return False
    backup(dest)
    return True


def open_resumed_controller(checkpoint: Path) -> Any:
    """An embedded controller on a working copy of the checkpoint's database (``<run>/controller.db``)."""
    from adwin.controller import Controller

    src = checkpoint / CONTROLLER_DB
    if not src.is_file():
        raise ValueError(f"{checkpoint}: no {CONTROLLER_DB} (run used a remote controller? pass --controller-url)")
    work = checkpoint.parent / CONTROLLER_DB
    for suffix in ("", "-wal", "-shm"):  # a stale WAL next to the fresh copy would be replayed into it
        Path(f"{work}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(src, work)
    return Controller(str(work))


def truncate_metrics(run_dir: Path, start: int) -> int:
    """Drop ``metrics.jsonl`` rows of steps ``>= start`` (logged after the checkpoint by the crashed run).

    Returns the number of rows dropped; the resumed run logs those steps again.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            dropped += 1  # a torn last line from the crash
            continue
        if step < start:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(f"{x}\n" for x in kept))
    tmp.replace(path)
    return dropped


def read_state(checkpoint: Path) -> dict[str, Any]:
    """``state.json`` of a checkpoint; a resumable one names its controller run id."""
    state = json.loads((checkpoint / "state.json").read_text())
    if "run_id" not in state:
        raise ValueError(f"{checkpoint}: no run id in state.json (written by an older adwin); cannot resume")
    return state


def check_extension(checkpoint: Path, steps: int, schedule: str) -> None:
    """Before any compute: ``steps`` must run past the checkpoint (else the resumed run would do nothing).

    A run may be extended (``--resume RUN --steps N``): the prompts, the window policy and the RNG streams
    do not depend on the run's length, so the extended run equals a straight N-step run at every step with
    a constant learning-rate schedule. A decaying schedule (cosine, linear) is stretched to the new length
    from the resumed step on, so it warns: the steps before followed the old length's decay.
    """
    done = int(read_state(checkpoint)["step"])
    if steps <= done:
        raise ValueError(f"--resume: {checkpoint.name} is at step {done} and the run is set to {steps} steps, so "
                         f"there is nothing to run; pass --steps above {done} to extend it")
    config = checkpoint.parent / "config.json"
    before = json.loads(config.read_text()).get("steps") if config.is_file() else None
    if schedule != "constant" and before is not None and before != steps:
        log.warning("optim.schedule=%s decays to zero at the run's last step: extending from %s to %d steps "
                    "stretches the decay from step %d on, so the run is not the straight %d-step run's "
                    "(schedule=constant extends exactly)", schedule, before, steps, done, steps)


def resume_from(checkpoint: Path, model: Any, optimizer: Any, scheduler: Any, pool: Any, ledger: Any,
                prompts: Any, faults: Any, schedule: Any = None, budget: Any = None, *,
                lora: bool, on_extra: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, float], int]:
    """Load everything back in place; RNG states last. Returns the run's initial evaluation and the next step.
    ``lora``: the student is a LoRA one (``adwin.student.structure.is_lora``), which resumes from its adapter only.
    ``on_extra``: receives the saved run state (``extra``), for what a scheduler adds to ``run_state``'s."""
    from adwin.runtime.checkpoint import load_checkpoint, load_weights
    from adwin.runtime.sharded_checkpoint import is_sharded_checkpoint, load_sharded

    if is_sharded_checkpoint(checkpoint):  # every rank reads its shards (any world size)
        load_sharded(checkpoint, model, optimizer, lora=lora)
    else:
        load_weights(checkpoint, model, lora=lora)
    state = load_checkpoint(checkpoint, optimizer, scheduler)
    restore_run_state(state["extra"], pool, ledger, prompts, faults, schedule, budget)
    if on_extra is not None:
        on_extra(state["extra"])
    log.info("resumed from %s at step %d (%d probes restored)", checkpoint, state["step"], len(pool))
    return dict(state.get("initial_eval") or {}), int(state["step"])
