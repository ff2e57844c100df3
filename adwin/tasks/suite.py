"""The built-in tasks, one per horizon regime, sharing tokenizer, model family and problem set.

* ``chain``: today's task. One skill repeats on every line; the teacher learned what follows a
  planted mistake, so it recovers after student errors and the first lines carry most of the signal.
* ``chain-drift``: the same problems and answers; the teacher is trained on clean solutions only,
  so its feedback after a student mistake is unreliable (the paper's supervision drift).
* ``chain-late``: the chain plus a closing line combining the last line's input and result
  (:mod:`adwin.tasks.late`); the student initialisation never trained on it, the teacher did.
* ``chain-long`` and ``chain-late-long``: ``chain`` and ``chain-late`` at the paper's horizon, responses of
  510-2,046 tokens (:mod:`adwin.tasks.long`), with their own profiles (models that cover the horizon,
  an SFT curriculum of mostly short chains).

Kept free of torch imports: config validation and cache fingerprints read it.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from adwin.tasks.chain import (
    DEFAULT_CANDIDATES,
    MAX_RESPONSE_TOKENS,
    MAX_STEPS,
    MIN_STEPS,
    Problem,
    TaskSample,
    iter_problems,
    lines_right,
    parse_prompt,
    verify_solution,
)
from adwin.tasks.late import (
    CLOSING_PREFIX,
    CLOSING_STEPS_LEFT_OUT,
    closing_right,
    late_answer,
    verify_late_solution,
    write_late,
)
from adwin.tasks.long import (
    FORMAT_FIELDS,
    LONG_CANDIDATES,
    LONG_MAX_RESPONSE_TOKENS,
    LONG_MAX_STEPS,
    LONG_MIN_STEPS,
    SFT_GROUP_ALL,
    LongExcerpt,
    LongProblem,
    iter_long_problems,
    iter_sft_problems,
)
from adwin.tasks.noise import corrupt_solution
from adwin.tasks.profiles import LATE_LONG_PROFILE_SPECS, LONG_PROFILE_SPECS, PROFILE_SPECS, Profile

# (problem, rng, line_rate, student_phase) -> (written response without EOS, trained flag per char)
Writer = Callable[[Problem, random.Random, float, bool], tuple[str, list[bool]]]


def _write_chain(problem: Problem, rng: random.Random, line_rate: float, student_phase: bool) -> tuple[str, list[bool]]:
    del student_phase  # chain trains the same characters before and after the student snapshot
    return corrupt_solution(problem, rng, line_rate)


def _write_late(problem: Problem, rng: random.Random, line_rate: float, student_phase: bool) -> tuple[str, list[bool]]:
    return write_late(problem, rng, line_rate, train_closing=not student_phase)


def _chain_answer(problem: Problem) -> str:
    return problem.answer


# the per-response measures of :meth:`BuiltinTask.score_lines`, beside final-answer accuracy
LINE_MEASURES: tuple[str, ...] = ("lines_right", "closing_right")


@dataclass(frozen=True)
class LineScore:
    """How far a response gets, for the long tasks where final-answer accuracy needs every one of ~90 lines.

    ``lines_right``: the fraction of the ``n`` reference chain lines written right before the first wrong one
    (1 for a right chain, ``k / n`` when line ``k + 1`` is the first wrong, 0 for garbage).
    ``closing_right``: 1 when the closing line follows from the chain line above it as written, else 0; None for a
    task without a closing line."""

    lines_right: float
    closing_right: float | None

    def measures(self) -> dict[str, float]:
        return {k: v for k in LINE_MEASURES if (v := getattr(self, k)) is not None}


@dataclass(frozen=True)
class BuiltinTask:
    name: str
    summary: str
    write: Writer
    answer: Callable[[Problem], str]
    verify: Callable[[str, str], bool]  # (prompt, response) -> every line follows the rule
    # None: the profile's planted-mistake rate; 0.0: clean solutions only (supervision drift)
    noise_line_rate: float | None = None
    max_steps: int = MAX_STEPS  # longer chains are skipped: their response would not fit the horizon
    min_steps: int = MIN_STEPS  # shorter chains are skipped from the task's problems (not from an SFT curriculum)
    rule_version: int = 1  # bump when the written response or what the student sees changes: caches are rebuilt
    # the student snapshot step, as a multiple of the profile's (adwin.tasks.profiles.Profile.student_step)
    student_step_scale: float = 1.0
    # (seed, split) -> the endless problem stream; sft_stream: the SFT's, when it differs (a curriculum)
    stream: Callable[[int, str], Iterator[Problem]] = iter_problems
    sft_stream: Callable[[int, str], Iterator[Problem]] | None = None
    kind: type[Problem] = Problem  # the line format (counter width, allowed step counts)
    horizon: int = MAX_RESPONSE_TOKENS  # the longest response plus room: a config's rollout.max_response_len
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES  # the prefix windows a config's window.candidates offers
    profiles: Mapping[str, Profile] = field(default_factory=lambda: PROFILE_SPECS)
    fingerprint_fields: tuple[object, ...] = ()  # what else shapes the prepared models (cache fingerprint)
    # SFT batches grouped by length over a whole segment, not within 8 batches: a mostly-short curriculum
    # with some task-length chains otherwise pads short chains to 2,000 tokens (adwin.tasks.long)
    sft_group_all: bool = False
    # where the response's closing phase begins (its first occurrence), for SFTSchedule.closing_weight; None:
    # the task has none
    closing_prefix: str | None = None

    def __post_init__(self) -> None:
        if self.closing_prefix is not None:
            return
        for name, spec in self.profiles.items():  # a recipe whose weight would weigh nothing fails at import
            if any(s.closing_weight != 1.0 for s in spec.schedules):
                raise ValueError(f"task {self.name!r} profile {name!r}: SFTSchedule.closing_weight needs the "
                                 "task's closing_prefix (where its closing phase begins)")

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise ValueError(f"unknown profile {name!r}; expected one of {', '.join(self.profiles)}")
        return self.profiles[name]

    def student_step(self, profile_step: int, sft_steps: int) -> int:
        """The SFT step whose snapshot is this task's student, strictly inside the run."""
        return min(sft_steps - 1, max(1, round(profile_step * self.student_step_scale)))

    def iter_problems(self, seed: int, split: str = "train") -> Iterator[Problem]:
        """The seed's endless problem stream (:func:`adwin.tasks.chain.iter_problems`) without the chains
        longer than ``max_steps``; every prefix is the same whatever length is read."""
        return (p for p in self.stream(seed, split) if self.min_steps <= p.n <= self.max_steps)

    def sft_problems(self, n: int, seed: int) -> list[Problem]:
        """The first ``n`` training problems the SFT writes solutions for: :meth:`problems` unless the task
        has a curriculum of its own."""
        if self.sft_stream is None:
            return self.problems(n, seed, "train")
        return list(itertools.islice((p for p in self.sft_stream(seed, "train") if p.n <= self.max_steps), n))

    def iter_samples(self, seed: int, split: str = "train") -> Iterator[TaskSample]:
        """:meth:`iter_problems` as samples with this task's answers; sample ``i`` has id ``{split}-{seed}-{i}``."""
        return (TaskSample(id=f"{split}-{seed}-{i}", prompt=p.prompt, answer=self.answer(p), route=p.route)
                for i, p in enumerate(self.iter_problems(seed, split)))

    def problems(self, n: int, seed: int, split: str = "train") -> list[Problem]:
        """The first ``n`` problems of :meth:`iter_problems`; for ``chain`` and ``chain-drift`` exactly
        ``generate_problems(n, seed, split)``."""
        return list(itertools.islice(self.iter_problems(seed, split), n))

    def samples(self, n: int, seed: int, split: str = "train") -> list[TaskSample]:
        """``n`` samples of ``split``, deterministic in (n, seed, split)."""
        return list(itertools.islice(self.iter_samples(seed, split), n))

    def solution(self, problem: Problem) -> str:
        return self.write(problem, random.Random(0), 0.0, False)[0]

    @property
    def line_measures(self) -> tuple[str, ...]:
        """The :class:`LineScore` measures this task defines."""
        return LINE_MEASURES if self.closing_prefix is not None else LINE_MEASURES[:1]

    def score_lines(self, prompt: str, response_text: str) -> LineScore:
        """:class:`LineScore` of a response (special tokens removed) to one of this task's prompts."""
        problem = parse_prompt(prompt, self.kind)
        right = lines_right(self.solution(problem), response_text, problem.n)
        closing = float(closing_right(response_text)) if self.closing_prefix is not None else None
        return LineScore(right / problem.n, closing)


def excerpted(write: Writer) -> Writer:
    """``write`` that cuts a :class:`adwin.tasks.long.LongExcerpt` after its kept lines and leaves the EOS
    that follows untrained (the chain goes on); any other problem is written whole."""

    def run(problem: Problem, rng: random.Random, line_rate: float, student_phase: bool) -> tuple[str, list[bool]]:
        text, trained = write(problem, rng, line_rate, student_phase)
        # a planted counter mistake is followed, so the chain may end within the kept lines: then it stays whole
        if not isinstance(problem, LongExcerpt) or text.count("\n") <= problem.kept:
            return text, trained
        end = 0
        for _ in range(problem.kept):
            end = text.index("\n", end) + 1
        return text[:end], trained[:end] + [False]

    return run


def _long_task(name: str, summary: str, write: Writer, answer: Callable[[Problem], str],
               verify: Callable[..., bool], student_step_scale: float = 1.0,
               profiles: Mapping[str, Profile] = LONG_PROFILE_SPECS, closing_prefix: str | None = None) -> BuiltinTask:
    """A task of :mod:`adwin.tasks.long`: the line format, problem streams, horizon, ladder and profiles of
    the long regime around one of the short tasks' writers and verifiers."""
    return BuiltinTask(
        name, summary, excerpted(write), answer, functools.partial(verify, kind=LongProblem),
        max_steps=LONG_MAX_STEPS, min_steps=LONG_MIN_STEPS, student_step_scale=student_step_scale,
        stream=iter_long_problems, sft_stream=iter_sft_problems, kind=LongProblem, horizon=LONG_MAX_RESPONSE_TOKENS,
        candidates=LONG_CANDIDATES, profiles=profiles, fingerprint_fields=FORMAT_FIELDS,
        sft_group_all=SFT_GROUP_ALL, closing_prefix=closing_prefix,
    )


TASKS: dict[str, BuiltinTask] = {
    "chain": BuiltinTask(
        "chain", "repeated skill, teacher recovers after mistakes", _write_chain, _chain_answer, verify_solution
    ),
    "chain-drift": BuiltinTask(
        "chain-drift",
        "chain with a teacher trained on clean solutions only (supervision drift)",
        _write_chain,
        _chain_answer,
        verify_solution,
        noise_line_rate=0.0,
    ),
    "chain-late": BuiltinTask(
        "chain-late",
        "chain plus a closing line the student init never trained on",
        _write_late,
        late_answer,
        verify_late_solution,
        max_steps=MAX_STEPS - CLOSING_STEPS_LEFT_OUT,
        # 2: the closing line adds the last line's input and result (1: first and last results); 3: the
        # student phase trains the closing format and the EOS, masking only the closing digits (2: all of it)
        rule_version=3,
        # at the profile's step 600 this student was weak on the chain lines too (first line 0.14 under
        # teacher forcing vs chain's 0.69); at 800 it is strong on them (docs/task.md)
        student_step_scale=4 / 3,
        closing_prefix=CLOSING_PREFIX,
    ),
    "chain-long": _long_task(
        "chain-long",
        "chain at length: 36-145 lines, 510-2,036 tokens; the student drifts over the length",
        _write_chain,
        _chain_answer,
        verify_solution,
    ),
    "chain-late-long": _long_task(
        "chain-late-long",
        "chain-late at length: the closing line after 36-145 lines, which the student init never trained on",
        _write_late,
        late_answer,
        verify_late_solution,
        # the student from chain-long's teacher, the teacher from chain-late's (LATE_LONG_PROFILE_SPECS): the
        # student's chain lines hold at length, the closing line is what it lacks
        profiles=LATE_LONG_PROFILE_SPECS,
        closing_prefix=CLOSING_PREFIX,
    ),
}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
DEFAULT_TASK = "chain"


def get_task(name: str) -> BuiltinTask:
    if name not in TASKS:
        raise ValueError(f"unknown built-in task {name!r}; expected one of {', '.join(TASK_NAMES)}")
    return TASKS[name]
