"""Which TRL trainers ``AdwinCallback`` drives, and the teacher that scores its probe batches.

Two teachers, found on the trainer (trl 1.16):

- ``DistillationTrainer``'s local ``teacher_model``: probes are scored in process (``teacher_scorer``, logits
  divided by the trainer's ``temperature``, on the student's columns), the decision budget counts its parameters;
- ``trl.experimental.server_distillation.ServerDistillationTrainer``: no local teacher; ``args.teacher_model_server_url``
  is the root of a vLLM-compatible server (``vllm serve``, ``adwin teacher serve``) that TRL's ``VLLMClient``
  reaches at ``{root}/v1``. The callback scores its probes at the same ``{root}/v1``, naming the model TRL names
  (``trainer.teacher_client.model``), through adwin's served-teacher client (``served_scorer``: realized-token
  logprobs, batched and concurrent, timeouts and bounded retries, the start-up tokenizer check). The logprobs are
  the server's raw distribution, as TRL's server loss reads them. A server cannot report its parameter count:
  the decision budget charges ``teacher_params`` when given, else the student's count (logged), the built-in
  trainer's rule for a teacher it cannot count.

``trl.experimental.async_distillation.AsyncDistillationTrainer`` is driven when it was built with adwin's rollout
worker (``trainer_adapters.trl_async.AdwinRolloutWorker``: TRL's own generation and teacher requests, on TRL's
servers, with the controller's window as each request's ``max_tokens``); its probes arrive scored by TRL's teacher
servers (``args.teacher_server_urls``), so no probe teacher is built here. With TRL's own worker it is refused: that
worker runs TRL's rollout loop in a spawned child with ``max_tokens`` fixed when the child starts, so no attribute
of the trainer sets the next step's cap.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adwin.probes.settings import param_count
from adwin.teacher.client import ClientSettings
from adwin.trainer_adapters.generic import Score, served_scorer, teacher_scorer
from adwin.trainer_adapters.trl_async import AdwinRolloutWorker

logger = logging.getLogger(__name__)

ASYNC_TRAINER = "trl.experimental.async_distillation"


class NoTeacher(ValueError):
    """The trainer has neither a local ``teacher_model`` nor a ``teacher_model_server_url`` to score probes with."""


class UnsupportedTrainer(TypeError):
    """A trainer whose generation the callback cannot cap per step (not a TRL ``DistillationTrainer``)."""


@dataclass
class ProbeTeacher:
    """What scores the callback's probe batches. ``params``: the teacher's parameter count, None where it cannot
    be counted (a server); ``url``: the server's OpenAI base URL (``#model`` included), None for a local teacher."""

    score: Score
    params: int | None
    url: str | None
    close: Callable[[], None]


def check_trainer(trainer: Any) -> bool:
    """Raise ``UnsupportedTrainer`` unless ``trainer`` generates through ``DistillationTrainer``'s path, whose caps
    ``AdwinCallback.apply_window`` sets before each step, or is an ``AsyncDistillationTrainer`` built with
    ``AdwinRolloutWorker`` (module docstring); True for the latter."""
    from trl import DistillationTrainer

    if isinstance(trainer, DistillationTrainer):
        return False
    name = type(trainer).__name__
    async_module = sys.modules.get(ASYNC_TRAINER)  # loaded wherever such a trainer was built
    if async_module is not None and isinstance(trainer, async_module.AsyncDistillationTrainer):
        if isinstance(getattr(trainer, "rollout_worker", None), AdwinRolloutWorker):
            return True
        raise UnsupportedTrainer(
            f"AdwinCallback cannot drive {name} with TRL's rollout worker: it runs TRL's rollout loop in a spawned "
            "child process with max_tokens fixed at start, so no window can be set per request; build the trainer "
            "with rollout_worker=AdwinRolloutWorker(), which runs the same loop in process with the window as each "
            "request's max_tokens, or use DistillationTrainer / ServerDistillationTrainer (docs/trl-async.md)")
    raise UnsupportedTrainer(f"AdwinCallback drives TRL's DistillationTrainer and its subclasses "
                             f"(ServerDistillationTrainer), and AsyncDistillationTrainer with AdwinRolloutWorker, "
                             f"not {name}")


def served_url(trainer: Any) -> str | None:
    """The OpenAI base URL TRL's server trainer scores at: ``teacher_model_server_url`` (the root) + ``/v1``, with
    the model TRL's client names as the fragment; None without a server URL."""
    root = getattr(trainer.args, "teacher_model_server_url", None)
    if not isinstance(root, str) or not root.strip():
        return None
    url = root.strip().rstrip("/") + "/v1"
    model = getattr(getattr(trainer, "teacher_client", None), "model", None)
    return f"{url}#{model}" if isinstance(model, str) and model and "#" not in model else url


def probe_teacher(trainer: Any, settings: ClientSettings | None) -> ProbeTeacher:
    """The trainer's local teacher, else its teacher server, connected and checked now (``ServedTeachers.load``:
    ``TeacherUnavailable`` names an unreachable URL after ``settings``' retries); ``NoTeacher`` without either."""
    acc = trainer.accelerator
    vocab = int(acc.unwrap_model(trainer.model).config.get_text_config().vocab_size)  # the student's columns
    if getattr(trainer, "teacher_model", None) is not None:
        teacher = acc.unwrap_model(trainer.teacher_model)
        return ProbeTeacher(teacher_scorer(teacher, vocab=vocab, temperature=trainer.temperature),
                            param_count(teacher), None, lambda: None)
    url = served_url(trainer)
    if url is None:
        raise NoTeacher(f"AdwinCallback scores probes with the trainer's teacher: {type(trainer).__name__} has no "
                        "teacher_model and no args.teacher_model_server_url (ServerDistillationTrainer)")
    score = served_scorer(url, trainer._tokenizer, vocab, settings=settings)
    logger.info("AdwinCallback: probe batches are scored by the teacher server %s", url)
    return ProbeTeacher(score, None, url, score.close)
