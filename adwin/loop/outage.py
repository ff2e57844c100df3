"""A teacher server that stops answering mid-run (docs/decisions.md, "A teacher behind a server").

The client already retries every request (``model.teacher_server.retries``, with backoff); a step whose teacher
scoring still fails is not trained on. With a served teacher, ``step_start`` records what the step is about to
draw from (the prompt stream and the RNG streams); ``stop_after_outage`` rewinds the prompt stream to it, saves
``checkpoint-t`` with the step's starting RNG streams (``t`` optimizer steps applied, the step's prompts not yet
consumed; the process's own RNG streams are left as they are, since the run stops) and stops the run with ``TeacherOutage``
naming the server and the checkpoint. Resuming from it once the server is back runs step ``t`` on the prompts and
seeds a straight run would (probes a rollout call carried along keep the tokens it added, which are of version
``t``). Data-parallel ranks agree on the outage (one ``all_max``) so no rank trains while another stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adwin.config import TrainConfig
from adwin.loop.distributed import LocalDist
from adwin.loop.parts import Parts
from adwin.loop.step import TeacherSignal, score_teacher
from adwin.runtime.checkpoint import rng_state
from adwin.runtime.guards import TeacherOutage
from adwin.sampling.batch import Batch
from adwin.teacher.client import TeacherUnavailable
from adwin.teacher.served import ServedTeachers


@dataclass
class StepStart:
    """The prompt stream's and the RNG streams' state before a step draws."""

    prompts: dict[str, Any]
    rng: dict[str, Any]  # adwin.runtime.checkpoint.rng_state()


def step_start(parts: Parts) -> StepStart | None:
    """What a served teacher's outage rewinds to; None for in-process teachers (they do not fail this way)."""
    if not isinstance(parts.teachers, ServedTeachers):
        return None
    return StepStart(parts.train_prompts.state_dict(), rng_state())


def score_or_outage(teachers: Any, batch: Batch, cfg: TrainConfig,
                    dist: LocalDist) -> tuple[TeacherSignal | None, TeacherUnavailable | None]:
    """``score_teacher``, or the outage that stopped it on this rank or any other (then no signal)."""
    try:
        signal, outage = score_teacher(teachers, batch, cfg), None
    except TeacherUnavailable as e:
        signal, outage = None, e
    if dist.world > 1 and isinstance(teachers, ServedTeachers):
        if dist.all_max(float(outage is not None)) > 0 and outage is None:
            signal, outage = None, TeacherUnavailable("", "a teacher server did not answer another rank")
    return signal, outage


def stop_after_outage(outage: TeacherUnavailable, step: int, start: StepStart | None, parts: Parts, shell: Any) -> None:
    """Save ``checkpoint-step`` as of the step's start, close the run (``shell``: the ``RunShell``), raise
    ``TeacherOutage``."""
    rng = None
    if start is not None:
        parts.train_prompts.load_state_dict(start.prompts)  # the step's prompts go back to the stream
        rng = start.rng
    saved = shell.checkpoint(step, rng)
    shell.close()
    raise TeacherOutage(f"step {step}: {outage}; the run stopped before training on the step, state saved in "
                        f"{saved}: once the server answers, adwin train --resume {saved.parent} runs it again")
