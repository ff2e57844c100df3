"""Prompt sources for the trainer: a JSONL file here; the built-in task's in ``adwin.tasks.prompts``.

A JSONL line is an object with ``prompt`` (str), optional ``answer`` (str) and an optional routing key
(``data.route_key``, default ``teacher``) naming the teacher that scores the sample.

Bad input, each with one defined behaviour (docs/reliability.md), all before any compute:

* blank lines: skipped;
* a malformed line (not JSON, not an object, a missing/empty/whitespace-only ``prompt``, a non-string
  route, a list as ``answer``): ``DataError`` naming the file and line;
* a route naming no configured teacher: ``DataError`` naming the sample, its file:line and the teachers;
* a prompt longer than ``data.max_prompt_len`` tokens: truncated from the left (the question's end is
  kept); ``data.max_prompt_len + rollout.max_response_len`` beyond the student's context: ``DataError``
  naming both fields (``check_context``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

DEFAULT_ROUTE = "default"


class DataError(ValueError):
    """A prompt file or record is malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    answer: str | None = None
    route: str = DEFAULT_ROUTE
    source: str = field(default="", compare=False)  # "file:line" for error messages


def load_jsonl(path: str | Path, route_key: str = "teacher") -> list[Prompt]:
    """Read prompts from JSONL; blank lines are skipped, anything else malformed raises ``DataError``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    prompts: list[Prompt] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            prompts.append(_parse_record(line, path, lineno, route_key))
    if not prompts:
        raise DataError(f"{path}: no prompts found")
    return prompts


def _parse_record(line: str, path: Path, lineno: int, route_key: str) -> Prompt:
    where = f"{path}:{lineno}"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from e
    if not isinstance(rec, dict):
        raise DataError(f"{where}: each line must be a JSON object, got {type(rec).__name__}")
    prompt = rec.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: field 'prompt' must be a non-empty string")
    answer = rec.get("answer")
    if answer is not None and not isinstance(answer, (str, int, float)):
        raise DataError(f"{where}: field 'answer' must be a string or number")
    route = rec.get(route_key, DEFAULT_ROUTE)
    if not isinstance(route, str) or not route:
        raise DataError(f"{where}: field {route_key!r} must be a non-empty string")
    sample_id = str(rec.get("id", f"{path.stem}-{lineno}"))
    return Prompt(id=sample_id, prompt=prompt, answer=None if answer is None else str(answer), route=route,
                  source=where)


class TrainPrompts(Protocol):
    """Where a run's training prompts come from. Its contents must not depend on the run's length, so
    ``adwin train --resume RUN --steps N`` extends a run with the prompts a straight N-step run gets."""

    def next_batch(self, n: int) -> list[Prompt]: ...

    def route_examples(self) -> list[Prompt]:
        """Prompts that cover every route the stream can serve (``check_routes`` checks them)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def check_stream_kind(state: dict[str, Any], kind: str) -> None:
    """Refuse a stream's state saved by a stream of another kind (``kind``: what this stream is)."""
    got = state.get("kind", "shuffled")  # checkpoints written before the built-in stream existed
    if got != kind:
        raise DataError(f"prompt stream state is of a {got!r} stream, this run's prompts are a {kind!r} stream "
                        "(data.task differs from the checkpointed run's, or the checkpoint predates the built-in "
                        "task's endless stream: start a new run)")


class PromptStream:
    """Endless, seeded stream over a fixed prompt list (a JSONL file): shuffles, serves in order,
    reshuffles each epoch."""

    def __init__(self, prompts: Sequence[Prompt], seed: int = 0) -> None:
        if not prompts:
            raise DataError("the prompt source is empty")
        self._prompts = list(prompts)
        self._rng = random.Random(seed)
        self._order: list[int] = []
        self.epoch = 0

    def next_batch(self, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        while len(out) < n:
            if not self._order:
                self._order = list(range(len(self._prompts)))
                self._rng.shuffle(self._order)
                self.epoch += 1
            out.append(self._prompts[self._order.pop()])
        return out

    def route_examples(self) -> list[Prompt]:
        return list(self._prompts)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "shuffled", "order": list(self._order), "epoch": self.epoch, "rng": self._rng.getstate(),
                "size": len(self._prompts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state_dict`` left off (same prompts: the size must match)."""
        check_stream_kind(state, "shuffled")
        if state.get("size", len(self._prompts)) != len(self._prompts):
            raise DataError(f"prompt stream state is for {state['size']} prompts, this source has {len(self._prompts)}")
        self._order = list(state["order"])
        self.epoch = int(state["epoch"])
        self._rng.setstate(state["rng"])


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def match_answer(response: str, answer: str) -> bool:
    """Generic JSONL checker. A numeric answer must equal the response's last number (so a response
    cannot win by listing many numbers); any other answer must occur in the response, case-insensitively."""
    want = answer.strip()
    if not want:
        return False
    if _NUMBER.fullmatch(want):
        numbers = _NUMBER.findall(response)
        return bool(numbers) and float(numbers[-1]) == float(want)
    return want.lower() in response.lower()


def check_routes(prompts: Sequence[Prompt], teacher_keys: Sequence[str]) -> None:
    """Every sample's route must name a configured teacher (a single teacher takes every route)."""
    if len(teacher_keys) == 1:
        return
    known = set(teacher_keys)
    for p in prompts:
        if p.route not in known:
            at = f" ({p.source})" if p.source else ""
            raise DataError(
                f"sample {p.id!r}{at} routes to teacher {p.route!r}, which is not configured "
                f"(model.teachers has {sorted(known)})"
            )


def check_context(max_prompt_len: int, max_response_len: int, context: int | None) -> None:
    """Prompt + response must fit the student's positions (``context``; None = unknown, not checked)."""
    if context is not None and max_prompt_len + max_response_len > context:
        raise DataError(
            f"data.max_prompt_len ({max_prompt_len}) + rollout.max_response_len ({max_response_len}) = "
            f"{max_prompt_len + max_response_len} exceeds the student's context of {context} positions"
        )
